"""The trainer-side modules' public surface is pinned: changing it is a decision."""

from __future__ import annotations

import importlib

import pytest

from grove.training.checkpoint import (
    CheckpointDigestMismatch,
    CheckpointError,
    CheckpointExists,
    CheckpointFileMissing,
    CheckpointIncompatible,
    CheckpointSchemaError,
)
from grove.training.errors import TrainingError

PUBLIC = {
    "grove.config": {
        "EMBEDDED",
        "EXTERNAL",
        "RUN_CONTROL_FIELDS",
        "AsyncRLConfig",
        "CheckpointingConfig",
        "ConfigurationError",
        "DataConfig",
        "EngineConfig",
        "GRPOConfig",
        "GroveConfig",
        "HarnessConfig",
        "LoggingConfig",
        "LossConfig",
        "ModelConfig",
        "PolicyConfig",
        "TokenCaptureConfig",
        "config_field_paths",
        "load_config",
        "unsupported_combinations",
    },
    "grove.training.loss": {
        "DEFAULT_CLIP",
        "ClipRange",
        "LossResult",
        "RowSequenceErrors",
        "TokenDiagnostics",
        "clipped_policy_gradient_loss",
        "retained_token_mask",
        "row_sequence_errors",
        "token_diagnostics",
    },
    "grove.training.trainer": {
        "LogprobFunction",
        "MicroBatchPlan",
        "RowLayout",
        "StepBatch",
        "StepReport",
        "Trainer",
        "causal_token_logprobs",
        "recompute_token_logprobs",
        "rollout_warmup_scheduler",
        "row_logprobs",
        "step_batch",
    },
    "grove.training.checkpoint": {
        "CHECKPOINT_FILES",
        "CHECKPOINT_SCHEMA",
        "CheckpointDigestMismatch",
        "CheckpointError",
        "CheckpointExists",
        "CheckpointFileMissing",
        "CheckpointIncompatible",
        "CheckpointMetadata",
        "CheckpointSchemaError",
        "ResumeExpectation",
        "checkpoint_name",
        "latest_checkpoint",
        "load_checkpoint",
        "save_checkpoint",
        "verify_checkpoint",
    },
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_module_exports_exactly_its_pinned_names(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert set(module.__all__) == PUBLIC[module_name]
    assert all(hasattr(module, name) for name in module.__all__)


@pytest.mark.parametrize(
    "error",
    [
        CheckpointExists,
        CheckpointFileMissing,
        CheckpointDigestMismatch,
        CheckpointSchemaError,
        CheckpointIncompatible,
    ],
)
def test_every_checkpoint_error_is_a_checkpoint_error(error: type[Exception]) -> None:
    assert issubclass(error, CheckpointError)
    assert issubclass(error, TrainingError)
