"""``grove train`` on CUDA: three steps of the embedded model in float32 and in bfloat16, and a
checkpoint that moves between the GPU and the CPU (``docs/train.md``, "Devices, precision and
activation checkpointing")."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.config.runs import train
from tests.unit.config.steps import CHECKPOINTS, one_step, trainer_state, training_run


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_grove_train_runs_three_steps_on_cuda(tmp_path: Path, precision: str) -> None:
    run = train(tmp_path, {"policy": {"device": "cuda", "precision": precision}}, steps=3)

    metrics = run.metrics()
    assert len(metrics) == 3
    assert all(math.isfinite(m["train/max_token_mult_prob_error"]) for m in metrics)


@pytest.mark.parametrize(("written", "resumed"), [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(
    tmp_path: Path, written: str, resumed: str
) -> None:
    first = training_run(tmp_path / "run", {"policy": {"device": written}}, CHECKPOINTS)
    one_step(first)
    saved = [t.cpu() for t in trainer_state(first)]

    second = training_run(tmp_path / "run", {"policy": {"device": resumed}}, CHECKPOINTS)
    assert second.resume() is not None
    restored = trainer_state(second)

    assert {t.device.type for t in restored} == {resumed}
    assert all(torch.equal(a.cpu(), b) for a, b in zip(restored, saved, strict=True))
