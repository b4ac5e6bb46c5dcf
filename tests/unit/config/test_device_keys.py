"""What ``policy.device``, ``policy.precision`` and ``policy.dtensor_cfg.activation_checkpointing``
change in a training step of the run's own trainer (``grove/train/training_run.py``
``build_trainer``), on the embedded model, on the CPU. The GPU side is ``tests/gpu``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grove.config import ConfigurationError, load_config
from grove.train.training_run import TrainingRun
from grove.training.placement import DeviceUnavailable
from tests.unit.config.steps import (
    CHECKPOINTS,
    LEARNER,
    one_step,
    rows_batch,
    trainer_state,
    training_run,
)

# -- policy.device -------------------------------------------------------------------------------


def test_device_cpu_puts_model_and_optimizer_state_on_the_cpu(tmp_path: Path) -> None:
    training = training_run(tmp_path, {"policy": {"device": "cpu"}})
    training.trainer.train_step(rows_batch(4))

    devices = {p.device.type for p in training.model.parameters()}
    state = training.trainer.optimizer.state.values()
    moments = {v.device.type for s in state for k, v in s.items() if k != "step"}
    assert (devices, moments, training.trainer.placement.device) == (
        {"cpu"},
        {"cpu"},
        torch.device("cpu"),
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows the refusal without CUDA")
def test_device_cuda_without_cuda_is_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(DeviceUnavailable, match=r"policy\.device: cuda, but torch sees no CUDA"):
        training_run(tmp_path, {"policy": {"device": "cuda"}})


def test_device_cpu_checkpoint_resumes_on_the_cpu_bit_for_bit(tmp_path: Path) -> None:
    settings = {"policy": {"device": "cpu"}}
    first = training_run(tmp_path / "run", settings, CHECKPOINTS)
    one_step(first)
    saved = trainer_state(first)

    resumed = training_run(tmp_path / "run", settings, CHECKPOINTS)
    assert resumed.resume() is not None
    restored = trainer_state(resumed)

    assert resumed.step == 1
    assert len(restored) == len(saved)
    assert all(torch.equal(a, b) for a, b in zip(restored, saved, strict=True))


# -- policy.precision ----------------------------------------------------------------------------


def test_precision_bfloat16_trains_float32_weights_from_bfloat16_logits(tmp_path: Path) -> None:
    full = training_run(tmp_path / "fp32", {"policy": {"precision": "float32"}})
    half = training_run(tmp_path / "bf16", {"policy": {"precision": "bfloat16"}})
    full_report = full.trainer.train_step(rows_batch(4))
    half_report = half.trainer.train_step(rows_batch(4))

    dtypes = {p.dtype for p in half.model.parameters()}
    moments = {v.dtype for s in half.trainer.optimizer.state.values() for v in s.values()}
    assert (dtypes, moments) == ({torch.float32}, {torch.float32})
    # Same weights, same rows: only the forward's precision differs, so the loss moves by
    # bfloat16's rounding (8 bits of mantissa) and no more.
    assert half_report.loss != full_report.loss
    assert half_report.loss == pytest.approx(full_report.loss, rel=0.05)


def test_precision_bfloat16_logprobs_are_float32(tmp_path: Path) -> None:
    training = training_run(tmp_path, {"policy": {"precision": "bfloat16"}})
    batch = rows_batch(2)
    with training.trainer.placement.autocast():
        logprobs = training.trainer.logprobs(training.model, batch, slice(0, 2))

    assert logprobs.dtype == torch.float32


def test_precision_bfloat16_with_a_bfloat16_model_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"policy\.precision: bfloat16 keeps float32"):
        load_config(
            {
                **LEARNER,
                "model": {"dtype": "bfloat16"},
                "policy": {**LEARNER["policy"], "precision": "bfloat16"},
            }
        )


def test_device_cuda_with_the_vision_language_model_is_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"policy\.device: cuda is not supported"):
        load_config(
            {
                **LEARNER,
                "model": {"architecture": "vlm"},
                "policy": {**LEARNER["policy"], "device": "cuda"},
            }
        )


# -- policy.dtensor_cfg.activation_checkpointing -------------------------------------------------


def _layer_forwards(training: TrainingRun) -> list[int]:
    calls: list[int] = []
    first_mlp = training.model.model.layers[0].mlp  # type: ignore[union-attr,index]
    first_mlp.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_activation_checkpointing_recomputes_layers_with_the_same_gradients(
    tmp_path: Path,
) -> None:
    plain = training_run(tmp_path / "plain", {"policy": {"max_grad_norm": None}})
    checkpointed = training_run(
        tmp_path / "ckpt",
        {"policy": {"max_grad_norm": None, "dtensor_cfg": {"activation_checkpointing": True}}},
    )
    plain_calls, checkpointed_calls = _layer_forwards(plain), _layer_forwards(checkpointed)
    plain.trainer.train_step(rows_batch(4))
    checkpointed.trainer.train_step(rows_batch(4))

    # two micro batches of two rows: the first layer's MLP starts one forward each, and with
    # checkpointing one more each in the backward
    assert (len(plain_calls), len(checkpointed_calls)) == (2, 4)
    pairs = zip(plain.model.parameters(), checkpointed.model.parameters(), strict=True)
    assert all(torch.equal(a.grad, b.grad) for a, b in pairs)
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.model.parameters(), checkpointed.model.parameters(), strict=True)
    )
