"""Grove's configuration: one typed schema (``schema.py``) of training sections (``training.py``)
and job sections (``job.py``), read once at the entry point (``loading.py``). ``docs/train.md``
is the reference: every key, its default, its meaning and the code that reads it."""

from grove.config.job import (
    EMBEDDED,
    EXTERNAL,
    DataConfig,
    EngineConfig,
    HarnessConfig,
    LoggingConfig,
    ModelConfig,
)
from grove.config.loading import ConfigurationError, load_config
from grove.config.schema import (
    RUN_CONTROL_FIELDS,
    GroveConfig,
    config_field_paths,
    unsupported_combinations,
)
from grove.config.training import (
    AsyncRLConfig,
    CheckpointingConfig,
    GRPOConfig,
    LossConfig,
    PolicyConfig,
    TokenCaptureConfig,
)

__all__ = [
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
]
