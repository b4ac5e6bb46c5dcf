"""A prompt group whose rollouts are all masked is dropped: the step trains on the others when
``async_rl.rollout_failure.min_step_batch_fraction`` allows it, and stops training otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from grove.config import load_config
from grove.jobs.train import run_training
from grove.workspace import Workspace
from training.errors import BatchError


def _config(tmp_path: Path, fraction: float) -> dict:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "Say hello."}\n{"prompt": "Name a fox.", "rewrite": true}\n')
    return {
        "harness": {"target": "tests.e2e.rewriting_harness:play"},
        "data": {"path": str(tasks), "shuffle": False},
        "token_capture": {"forest_training": False, "pending_call_timeout_s": 10},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
        "policy": {"train_global_batch_size": 4, "train_micro_batch_size": 2},
        "async_rl": {"rollout_failure": {"min_step_batch_fraction": fraction}},
        "logging": {"tensorboard": False},
    }


def test_a_group_with_every_rollout_masked_is_dropped_and_the_step_trains_the_others(
    tmp_path: Path,
) -> None:
    workspace = Workspace.resolve(tmp_path / "work")
    summary = run_training(load_config(_config(tmp_path, 0.5)), workspace, steps=1)
    assert (summary.steps, summary.logical_rollouts) == (1, 2)  # one group of two trained
    (record,) = [
        json.loads(line)
        for line in (workspace.workdir / "runs" / summary.run_id / "metrics.jsonl").open()
    ]
    assert record["metrics"]["dropped_prompt_groups"] == 1.0


def test_a_dropped_group_below_the_step_floor_stops_training_naming_it(tmp_path: Path) -> None:
    workspace = Workspace.resolve(tmp_path / "work")
    with pytest.raises(BatchError) as stopped:
        run_training(load_config(_config(tmp_path, 1.0)), workspace, steps=1)
    assert stopped.value.rule == "min_step_batch_fraction"
    assert "-s0-g1 (no_valid_layout) leave 2 of 4 logical rollouts" in stopped.value.detail
