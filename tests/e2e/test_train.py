"""``grove train`` end to end on a user's model directory, tasks and harness: train, resume,
export and reload; an external agent in its own process; bad configurations refused first."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from grove.engines.models import load_model, save_embedded_model

GROVE = str(Path(sys.executable).parent / "grove")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = {**os.environ, "PYTHONHASHSEED": "0"}


def grove(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [GROVE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        stdin=subprocess.DEVNULL,
    )
    if check:
        assert result.returncode == 0, result.stderr[-3000:]
    return result


def summary(result: subprocess.CompletedProcess[str]) -> dict:
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one line on stdout"
    return json.loads(lines[0])


def write_config(directory: Path, **overrides: object) -> Path:
    """A small run of the recency agent on a model directory: 2 groups x 2 rollouts a step."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tasks.jsonl").write_text(
        '{"prompt": "Say hello in plain words."}\n{"prompt": "Name a color in plain words."}\n'
    )
    config: dict = {
        "seed": 3,
        "model": {"path": "model"},
        "harness": {
            "target": "examples.recency_agent:play",
            "options": {"turns": 3, "keep_rounds": 1, "max_tokens": 6},
        },
        "data": {"path": "tasks.jsonl", "epochs": 10},
        "token_capture": {"forest_training": True, "pending_call_timeout_s": 30},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 3},
        "policy": {
            "train_global_batch_size": 4,
            "train_micro_batch_size": 2,
            "logprob_micro_batch_size": 2,
            "learning_rate": 1.0e-2,
        },
        **overrides,
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_embedded_model(tmp_path_factory.mktemp("user") / "model", seed=11)


@pytest.fixture(scope="module")
def straight(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Three uninterrupted steps on the user's model directory."""
    root = tmp_path_factory.mktemp("straight")
    config = write_config(root / "cfg")
    (root / "cfg" / "model").symlink_to(model_dir)
    return summary(grove("train", str(config), "--json", "--workdir", str(root / "work")))


def test_a_model_directory_trains_three_steps_with_exact_logprobs(straight: dict) -> None:
    assert straight["steps"] == 3
    assert straight["logical_rollouts"] == 12
    assert straight["rows"] > straight["logical_rollouts"]  # keep_rounds 1 rewrites the context
    assert straight["max_tmpe"] < 1.001
    assert Path(straight["checkpoint"], "manifest.json").is_file()


def test_a_resumed_run_reaches_the_weights_of_an_uninterrupted_one(
    straight: dict, model_dir: Path, tmp_path: Path
) -> None:
    config = write_config(tmp_path / "cfg")
    (tmp_path / "cfg" / "model").symlink_to(model_dir)
    work = str(tmp_path / "work")
    grove("train", str(config), "--json", "--workdir", work, "--steps", "2")
    resumed = summary(grove("train", str(config), "--json", "--workdir", work, "--resume"))
    assert resumed["steps"] == 3
    a = load_file(Path(straight["checkpoint"], "model.safetensors"))
    b = load_file(Path(resumed["checkpoint"], "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(a[name].equal(b[name]) for name in a)  # bitwise


def test_an_exported_checkpoint_reloads_with_the_trainers_logits(
    straight: dict, model_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "export"
    grove("export", straight["checkpoint"], "--hf", str(out))
    exported = AutoModelForCausalLM.from_pretrained(out, local_files_only=True).eval()
    trained = load_model(str(model_dir)).model
    weights = load_file(Path(straight["checkpoint"], "model.safetensors"))
    trained.load_state_dict(weights, strict=False)
    tokens = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        assert torch.equal(exported(tokens).logits, trained.eval()(tokens).logits)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_an_external_agent_trains_two_steps(tmp_path: Path) -> None:
    port = _free_port()
    config = tmp_path / "external.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "engine": {"port": port},
                "token_capture": {"forest_training": True, "pending_call_timeout_s": 10},
                "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
                "policy": {"train_global_batch_size": 4, "train_micro_batch_size": 2},
                # the agent plays on while step 0 trains: its later groups straddle a publish
                "async_rl": {"max_policy_lag": 1},
            }
        )
    )
    work = str(tmp_path / "work")
    trainer = subprocess.Popen(
        [GROVE, "train", str(config), "--json", "--steps", "2", "--workdir", work],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        _wait_for_gateway(port)
        agent = subprocess.run(
            [sys.executable, str(EXAMPLES / "external_agent.py"), "--base-url",
             f"http://127.0.0.1:{port}/v1", "--groups", "4", "--rollouts", "2"],
            capture_output=True, text=True, timeout=300, env=ENV, cwd=tmp_path,
        )  # fmt: skip
        assert agent.returncode == 0, agent.stderr[-3000:]
        out, err = trainer.communicate(timeout=300)
    finally:
        trainer.kill()
    assert trainer.returncode == 0, err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["steps"], result["logical_rollouts"], result["rows"]) == (2, 8, 8)


def _wait_for_gateway(port: int, timeout_s: float = 120.0) -> None:
    """Wait until the gateway accepts connections (the trainer loads its model first)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"the gateway on port {port} did not start in {timeout_s} s")


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"grpo": {"num_prompts_per_step": 2, "num_generation_per_prompt": 2}},
         "grpo.num_generation_per_prompt: unknown key"),
        ({"model": {"path": "no-such-model"}}, "model.path: "),
        ({"harness": {"target": "no_such_module_anywhere:play"}},
         "harness.target 'no_such_module_anywhere:play': cannot import"),
        ({"data": {"path": "broken.jsonl"}}, "broken.jsonl:2: not valid JSON"),
    ],
)  # fmt: skip
def test_a_bad_configuration_fails_before_anything_starts(
    tmp_path: Path, model_dir: Path, change: dict, named: str
) -> None:
    config = write_config(tmp_path / "cfg", **change)
    (tmp_path / "cfg" / "model").symlink_to(model_dir)
    (tmp_path / "cfg" / "broken.jsonl").write_text('{"prompt": "fine"}\n{"prompt": \n')
    work = tmp_path / "work"
    result = grove("train", str(config), "--workdir", str(work), check=False)
    assert result.returncode == 1
    assert named in result.stderr
    assert not work.exists()  # nothing written
