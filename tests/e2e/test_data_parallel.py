"""``grove train`` under ``torchrun --nproc-per-node 2`` (gloo on CPU) reaches the weights of the
same configuration run in one process, and a two-rank run resumes in one process
(``docs/train.md``, "Data-parallel training").

The run: two prompt groups of two rollouts a step, rollout 0 of each group rewritten (two rows),
so a group has three rows, padded to four (2 ranks x micro batch 1); rank 0 trains group 0's
rows, rank 1 group 1's. Both launches run with ``OMP_NUM_THREADS=1`` (torchrun's default for its
workers), so each micro batch's forward and backward are the same floats in either launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
TOLERANCE = 1e-6  # float32

pytestmark = pytest.mark.xdist_group("data_parallel")


def _config(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    tasks = directory / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("red", "green", "blue")))
    config = {
        "harness": {
            "target": "tests.unit.config.harnesses:rewrite_first_rollout",
            "options": {"log": str(directory / "harness.jsonl")},
        },
        "data": {"path": str(tasks), "epochs": 2},
        "engine": {"default_max_tokens": 4},
        "token_capture": {"forest_training": True},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2, "max_num_steps": 3},
        "policy": {
            "train_global_batch_size": 4,
            "train_micro_batch_size": 1,
            "logprob_micro_batch_size": 1,
            "data_parallel_size": 2,
            "learning_rate": 1e-3,
        },
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _train(config: Path, workdir: Path, *args: str, ranks: int = 1) -> dict:
    """``grove train`` in one process, or under torchrun with ``ranks`` ranks; its summary."""
    grove = [str(BIN / "grove"), "train", str(config), "--json", "--workdir", str(workdir), *args]
    launcher = [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}", "--no-python"]
    result = subprocess.run(
        launcher + grove if ranks > 1 else grove,
        capture_output=True,
        text=True,
        timeout=600,
        env=ENV,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, f"one summary line (rank 0's), got {lines}"
    return dict(json.loads(lines[0]))


def _weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model.safetensors")


def _largest_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The configuration trained for three steps in one process."""
    directory = tmp_path_factory.mktemp("single")
    return _train(_config(directory), directory / "work")


def test_two_torchrun_ranks_reach_the_single_process_weights_after_three_steps(
    single: dict, tmp_path: Path
) -> None:
    summary = _train(_config(tmp_path), tmp_path / "work", ranks=2)

    assert summary["steps"] == single["steps"] == 3
    assert (summary["logical_rollouts"], summary["rows"]) == (12, 18)
    assert (summary["logical_rollouts"], summary["rows"]) == (
        single["logical_rollouts"],
        single["rows"],
    )
    ranks = _weights(Path(summary["checkpoint"]))
    one = _weights(Path(single["checkpoint"]))
    assert _largest_difference(ranks, one) <= TOLERANCE
    # ... and the weights moved far more than that: the test compares trained weights.
    start = _weights(Path(single["checkpoint"]).parent / "step_00000001")
    assert _largest_difference(one, start) > 100 * TOLERANCE


def test_a_two_rank_run_resumes_in_one_process(single: dict, tmp_path: Path) -> None:
    config = _config(tmp_path)
    _train(config, tmp_path / "work", "--steps", "2", ranks=2)

    resumed = _train(config, tmp_path / "work", "--resume")

    assert resumed["steps"] == 3
    weights = _weights(Path(resumed["checkpoint"]))
    assert _largest_difference(weights, _weights(Path(single["checkpoint"]))) <= TOLERANCE
