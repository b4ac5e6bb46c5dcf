"""The run's engine (``grove/engines/policy.py``, ``docs/engines.md``) without a vLLM server.

What needs a real vLLM (a reload on a running server, a launched server that serves, a run that
trains on one) is in ``tests/vllm`` (``make test-vllm``). Here: the directory every publish
writes, what a launch runs and how it fails (a stand-in interpreter records its command line and
exits, or never serves), a URL whose server lacks the reload endpoint, the refusals at load,
and ``grove serve``'s choice of engine. ``tests/unit/config/test_key_effects.py`` maps each
``engine.vllm_*`` key and ``engine.kind`` to its test here.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.config import ConfigurationError, load_config
from grove.engines.models import LoadedModel, load_model, save_embedded_model
from grove.engines.policy import (
    EmbeddedPolicy,
    VllmWeightsError,
    _refuse_tied,
    open_policy_engine,
    open_serving_engine,
    write_serving_directory,
)
from grove.engines.vllm_process import SERVER_MODULE, VllmLaunchError
from grove.errors import JobError
from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace
from tests.unit.config.runs import train

FAILING = """#!/bin/sh
# A stand-in for vLLM's python: records its command line and the served config, then fails.
here="$(dirname "$0")"
printf '%s\\n' "$@" > "$here/argv.txt"
while [ $# -gt 0 ]; do
  if [ "$1" = --model ]; then cp "$2/config.json" "$here/served-config.json"; fi
  shift
done
echo "stand-in: No module named vllm" >&2
exit 3
"""
SILENT = """#!/bin/sh
# A stand-in for vLLM's python that starts and never serves.
echo $$ > "$(dirname "$0")/pid.txt"
exec sleep 120
"""


def _script(directory: Path, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "python"
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    """The embedded model (tied output layer, as the trainer has it)."""
    return load_model("embedded")


def _vllm_config(tmp_path: Path, engine: dict[str, Any]) -> Any:
    """A vLLM configuration; a failed launch's log stays in ``tmp_path/weights``."""
    engine = {"kind": "vllm", "vllm_weights_dir": str(tmp_path / "weights"), **engine}
    return load_config({"engine": engine, "harness": {"target": "external"}})


# -- the directory each publish writes -----------------------------------------------------------


def test_serving_directory_unties_the_output_layer_and_keeps_the_logits(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    directory = write_serving_directory(loaded, tmp_path / "step-000000")
    config = json.loads((directory / "config.json").read_text())
    served = AutoModelForCausalLM.from_pretrained(directory).eval()
    ids = torch.arange(3, 40).unsqueeze(0)  # (1, 37)
    with torch.no_grad():
        expected = loaded.model(input_ids=ids).logits
        got = served(input_ids=ids).logits
    assert config["tie_word_embeddings"] is False
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert served.lm_head.weight.data_ptr() != served.model.embed_tokens.weight.data_ptr()
    assert torch.equal(got, expected)


def test_serving_directory_holds_the_tokenizer_and_generation_config(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    directory = write_serving_directory(loaded, tmp_path / "step-000000")
    again = load_model(str(directory))
    generation = json.loads((directory / "generation_config.json").read_text())
    text = "<|im_start|>user\nhello there<|im_end|>\n"
    assert again.tokenizer.encode(text) == loaded.tokenizer.encode(text)
    assert again.tokenizer.chat_template == loaded.tokenizer.chat_template
    assert generation["eos_token_id"] == loaded.tokenizer.eos_token_id


def test_serving_directory_replaces_an_existing_one_whole(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    directory = tmp_path / "step-000001"
    directory.mkdir()
    (directory / "stale.safetensors").write_text("left from an interrupted run")
    write_serving_directory(loaded, directory)
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        [
            "chat_template.jinja",
            "config.json",
            "generation_config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json",
        ]
    )
    assert not list(tmp_path.glob(".step-000001.tmp-*"))


# -- the keys: what a run does with each ----------------------------------------------------------


def test_engine_kind_vllm_puts_a_vllm_server_behind_the_runs_gateway(tmp_path: Path) -> None:
    python = _script(tmp_path / "bin", FAILING)
    engine = {
        "kind": "vllm",
        "vllm_launch": True,
        "vllm_python": str(python),
        "vllm_weights_dir": str(tmp_path / "weights"),
    }
    with pytest.raises(VllmLaunchError, match=r"exited with code 3") as caught:
        train(tmp_path / "run", {"engine": engine})
    assert "stand-in: No module named vllm" in str(caught.value)  # the log tail
    assert (tmp_path / "bin" / "argv.txt").read_text().splitlines()[:2] == ["-m", SERVER_MODULE]
    # engine.kind: embedded (the default) samples in process: the same run trains
    assert train(tmp_path / "embedded").summary.steps == 2


def test_vllm_launch_starts_vllm_on_the_runs_current_weights(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    python = _script(tmp_path / "bin", FAILING)
    config = _vllm_config(tmp_path, {"vllm_launch": True, "vllm_python": str(python)})
    with pytest.raises(VllmLaunchError):
        open_policy_engine(config, loaded, step=4)
    argv = (tmp_path / "bin" / "argv.txt").read_text().splitlines()
    options = dict(zip(argv[2::2], argv[3::2], strict=False))
    served = json.loads((tmp_path / "bin" / "served-config.json").read_text())
    assert Path(options["--model"]).name == "step-000004"
    assert options["--served-model-name"] == EMBEDDED_MODEL_NAME
    assert (options["--dtype"], options["--max-model-len"], options["--seed"]) == (
        "float32",
        "2048",  # min(the model's 2048 positions, policy.max_total_sequence_length)
        "0",
    )
    assert served["tie_word_embeddings"] is False


def test_vllm_python_is_the_interpreter_that_runs_the_server(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    python = _script(tmp_path / "bin", FAILING)
    config = _vllm_config(tmp_path, {"vllm_launch": True, "vllm_python": str(python)})
    with pytest.raises(VllmLaunchError):
        open_policy_engine(config, loaded, step=0)
    assert (tmp_path / "bin" / "argv.txt").is_file()  # the stand-in ran
    missing = _vllm_config(
        tmp_path, {"vllm_launch": True, "vllm_python": str(tmp_path / "none" / "python")}
    )
    with pytest.raises(VllmLaunchError, match=r"is not an executable file"):
        open_policy_engine(missing, loaded, step=0)


def test_vllm_args_follow_groves_own_arguments(loaded: LoadedModel, tmp_path: Path) -> None:
    python = _script(tmp_path / "bin", FAILING)
    config = _vllm_config(
        tmp_path,
        {
            "vllm_launch": True,
            "vllm_python": str(python),
            "vllm_args": ["--enforce-eager", "--max-model-len", "128"],
        },
    )
    with pytest.raises(VllmLaunchError):
        open_policy_engine(config, loaded, step=0)
    argv = (tmp_path / "bin" / "argv.txt").read_text().splitlines()
    assert argv[-3:] == ["--enforce-eager", "--max-model-len", "128"]  # a later flag wins


def test_vllm_start_timeout_stops_a_server_that_does_not_serve_in_time(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    python = _script(tmp_path / "bin", SILENT)
    config = _vllm_config(
        tmp_path,
        {"vllm_launch": True, "vllm_python": str(python), "vllm_start_timeout_s": 1.5},
    )
    with pytest.raises(VllmLaunchError, match=r"did not serve .*/health within 1\.5 s"):
        open_policy_engine(config, loaded, step=0)
    pid = int((tmp_path / "bin" / "pid.txt").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # stopped, not orphaned


def test_vllm_weights_dir_is_where_the_weights_and_the_servers_log_go(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    python = _script(tmp_path / "bin", FAILING)
    weights = tmp_path / "weights"
    config = _vllm_config(
        tmp_path,
        {"vllm_launch": True, "vllm_python": str(python), "vllm_weights_dir": str(weights)},
    )
    with pytest.raises(VllmLaunchError, match=str(weights / "vllm.log")):
        open_policy_engine(config, loaded, step=2)
    argv = (tmp_path / "bin" / "argv.txt").read_text().splitlines()
    assert argv[argv.index("--model") + 1] == str(weights / "step-000002")
    assert "stand-in: No module named vllm" in (weights / "vllm.log").read_text()
    assert not list(weights.glob("step-*"))  # the failed launch's weights are removed


def test_vllm_url_is_the_server_whose_weights_grove_reloads(
    loaded: LoadedModel, tmp_path: Path
) -> None:
    # Grove's own gateway answers /v1/models but has no /collective_rpc (404), as a vLLM server
    # started without VLLM_SERVER_DEV_MODE=1 does.
    app = build_gateway(Workspace.resolve(tmp_path / "work"))
    with ServerThread(app) as server:
        url = server.base_url
        config = _vllm_config(tmp_path, {"vllm_url": url})
        with pytest.raises(VllmWeightsError, match=r"VLLM_SERVER_DEV_MODE=1") as caught:
            open_policy_engine(config, loaded, step=0)
    assert f"The vLLM server at {url} did not reload" in str(caught.value)


# -- refusals -------------------------------------------------------------------------------------


def test_url_server_started_on_a_tied_model_is_refused(tmp_path: Path) -> None:
    tied = save_embedded_model(tmp_path / "tied")
    with pytest.raises(JobError, match=r"tie_word_embeddings: true"):
        _refuse_tied("http://vllm:8000", {"id": "m", "root": str(tied)})
    untied = write_serving_directory(load_model(str(tied)), tmp_path / "untied")
    _refuse_tied("http://vllm:8000", {"id": "m", "root": str(untied)})  # no error
    _refuse_tied("http://vllm:8000", {"id": "m", "root": "Qwen/Qwen2-0.5B"})  # not local: no error


@pytest.mark.parametrize(
    ("engine", "model", "problem"),
    [
        ({"kind": "vllm"}, {}, r"engine.kind: vllm needs a server"),
        (
            {"kind": "vllm", "vllm_launch": True, "vllm_url": "http://h:1"},
            {},
            r"name two servers",
        ),
        ({"vllm_launch": True}, {}, r"engine.vllm_launch is read only by engine.kind: vllm"),
        (
            {"kind": "vllm", "vllm_url": "http://h:1", "vllm_args": ["--enforce-eager"]},
            {},
            r"engine.vllm_args is read only when Grove launches vLLM",
        ),
        (
            {"kind": "vllm", "vllm_launch": True},
            {"dtype": "float64"},
            r"model.dtype float64 is not served by vLLM",
        ),
    ],
)
def test_engine_settings_that_cannot_work_are_refused_at_load(
    engine: dict[str, Any], model: dict[str, Any], problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=problem):
        load_config({"engine": engine, "model": model, "harness": {"target": "external"}})


def test_relative_vllm_python_is_taken_from_the_configuration_directory_without_links(
    tmp_path: Path,
) -> None:
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to("/usr/bin/env")
    path = tmp_path / "config.yaml"
    path.write_text(
        "engine: {kind: vllm, vllm_launch: true, vllm_python: venv/bin/python}\n"
        "harness: {target: external}\n"
    )
    assert load_config(path).engine.vllm_python == str(tmp_path / "venv" / "bin" / "python")
    bare = load_config(
        {
            "engine": {"kind": "vllm", "vllm_launch": True, "vllm_python": "python3"},
            "harness": {"target": "external"},
        }
    )
    assert bare.engine.vllm_python == "python3"  # looked up on PATH at launch


# -- grove serve ----------------------------------------------------------------------------------


def test_serving_the_embedded_engine_on_a_directory_serves_that_model(tmp_path: Path) -> None:
    directory = save_embedded_model(tmp_path / "policy", seed=3)
    policy, served = open_serving_engine("embedded", str(directory))
    assert isinstance(policy, EmbeddedPolicy)
    assert served.name == "policy"
    assert torch.equal(
        policy.engine.model.model.embed_tokens.weight,
        load_model(str(directory)).model.model.embed_tokens.weight,
    )


@pytest.mark.parametrize(
    ("model", "options", "problem"),
    [
        ("embedded", {"vllm_launch": True}, r"--engine vllm needs --model DIR"),
        ("DIR", {}, r"exactly one of --vllm-url URL and --vllm-launch"),
        ("DIR", {"vllm_launch": True, "vllm_url": "http://h:1"}, r"exactly one of"),
    ],
)
def test_serving_vllm_without_a_model_or_a_server_is_refused(
    tmp_path: Path, model: str, options: dict[str, Any], problem: str
) -> None:
    directory = str(save_embedded_model(tmp_path / "policy")) if model == "DIR" else model
    with pytest.raises(JobError, match=problem):
        open_serving_engine("vllm", directory, **options)


def test_serving_vllm_launched_on_a_directory_runs_vllm_on_that_directory(
    tmp_path: Path,
) -> None:
    directory = save_embedded_model(tmp_path / "policy")
    python = _script(tmp_path / "bin", FAILING)
    with pytest.raises(VllmLaunchError):
        open_serving_engine(
            "vllm", str(directory), vllm_launch=True, vllm_python=str(python), log_dir=tmp_path
        )
    argv = (tmp_path / "bin" / "argv.txt").read_text().splitlines()
    assert argv[argv.index("--model") + 1] == str(directory)  # as `vllm serve DIR` would
    assert "stand-in" in (tmp_path / "vllm.log").read_text()
