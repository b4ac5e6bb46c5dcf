"""The job sections of Grove's configuration: what ``grove train`` runs on (``model``, ``engine``,
``harness``, ``data``, ``logging``).

Paths (``model.path``, ``data.path``) are resolved against the directory of the configuration
file when relative, so a configuration and its task file travel together. Whether a model
directory is complete, a harness importable and a task file well formed is checked by
``grove.train.preflight`` before anything starts; this module checks shapes and bounds only.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, ValidationInfo, field_validator, model_validator

from grove.config.base import Section

__all__ = [
    "EMBEDDED",
    "EXTERNAL",
    "DataConfig",
    "EngineConfig",
    "HarnessConfig",
    "LoggingConfig",
    "ModelConfig",
]

EMBEDDED = "embedded"
EXTERNAL = "external"


def _resolved(value: str | None, info: ValidationInfo) -> str | None:
    """``value`` as an absolute path, relative paths taken from the configuration's directory."""
    if value is None or value == EMBEDDED:
        return value
    base = Path((info.context or {}).get("base_dir", "."))
    return str((base / Path(value).expanduser()).resolve())


class ModelConfig(Section):
    """``model``: the policy the trainer updates and the embedded engine samples from."""

    path: str = Field(default=EMBEDDED, min_length=1)
    """``embedded`` (a tiny Qwen2-style model and byte-level tokenizer built offline in code) or
    a local Hugging Face directory: ``config.json``, safetensors weights, and a tokenizer whose
    chat template renders the conversations (``docs/export.md``)."""

    dtype: Literal["float32", "bfloat16", "float16", "float64"] = "float32"
    """Parameter dtype of the loaded model (training and sampling)."""

    architecture: Literal["dense", "moe", "vlm"] = "dense"
    """Architecture of the embedded model: ``dense`` (Qwen2-style), ``moe`` (Qwen2-MoE-style,
    4 experts, 2 per token, in every layer), whose routed experts the engine captures and the
    trainer replays (``docs/moe.md``), or ``vlm`` (a tiny Qwen2-VL), which takes images, captures
    their processed pixels and trains on them (``docs/media.md``). ``model.path: embedded``
    only: a directory's ``config.json`` names its own."""

    warm_start: bool = False
    """Before training, fit the embedded model briefly on synthetic conversations of a
    tool-using agent (reasoning, tool calls, tool results, summaries), so that such an agent
    works from the first step; the fit is deterministic and cached under ``WORKDIR/warm_start``
    (``docs/train.md``, "The warm start"). ``model.path: embedded`` only."""

    @field_validator("path")
    @classmethod
    def _resolve(cls, value: str, info: ValidationInfo) -> str:
        return _resolved(value, info) or value


class EngineConfig(Section):
    """``engine``: the inference engine and the gateway in front of it (``docs/engines.md``).

    ``kind: embedded`` samples in the training process on the trainer's own weights;
    ``kind: vllm`` samples on a vLLM server (launched by Grove, or running at ``vllm_url``) that
    reloads each optimizer step's weights before the next step's rollouts."""

    kind: Literal["embedded", "vllm"] = "embedded"
    """``embedded``: in-process sampling on the trainer's weights; ``vllm``: a vLLM server
    (``vllm_launch`` or ``vllm_url``) to which each step's weights are published."""

    vllm_url: str | None = Field(default=None, min_length=1)
    """Root URL (``http://host:port``) of a running vLLM server to sample from. It must have
    been started with ``VLLM_SERVER_DEV_MODE=1`` and be able to read ``vllm_weights_dir``, where
    Grove writes each step's weights for it to reload (``docs/engines.md``)."""

    vllm_launch: bool = False
    """Grove starts the vLLM server itself (``vllm_python -m vllm.entrypoints.openai.api_server``)
    on the run's weights, waits for it to serve, and stops it when the run ends."""

    vllm_python: str | None = Field(default=None, min_length=1)
    """The python that runs a launched vLLM server: a path (an environment that has vLLM, e.g.
    ``.venv-vllm/bin/python``) or a command on ``PATH``; ``None``: the python running Grove."""

    vllm_args: list[str] = Field(default_factory=list)
    """Further command-line arguments of a launched vLLM server (``--enforce-eager``,
    ``--tensor-parallel-size 2``, ...), after Grove's own; a later flag wins."""

    vllm_start_timeout_s: float = Field(default=600.0, gt=0, le=86_400)
    """Seconds a launched vLLM server may take to serve ``/health`` before the run stops."""

    vllm_weights_dir: str | None = Field(default=None, min_length=1)
    """Directory where each step's weights are written as a Hugging Face directory for vLLM to
    reload (it must be readable by the server); ``None``: a temporary directory, removed when
    the run ends."""

    host: str = Field(default="127.0.0.1", min_length=1)
    """Address the gateway listens on."""

    port: int = Field(default=0, ge=0, le=65535)
    """Port the gateway listens on; 0 picks a free one (printed at start, and written to the run
    directory's ``run.json``)."""

    auth_token: str | None = Field(default=None, min_length=1)
    """Bearer token every gateway request must carry; ``None``: no authentication."""

    default_max_tokens: int = Field(default=256, ge=1, le=1_000_000)
    """Tokens a call may generate when it names no ``max_tokens`` (capped by the context left)."""

    @field_validator("vllm_weights_dir")
    @classmethod
    def _resolve(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolved(value, info)

    @field_validator("vllm_python")
    @classmethod
    def _resolve_python(cls, value: str | None, info: ValidationInfo) -> str | None:
        """A path made absolute without following links (a virtual environment's python is a
        link to the base interpreter, which lacks the environment's packages); a bare name is
        looked up on ``PATH`` when the server starts."""
        if value is None or "/" not in value:
            return value
        base = Path((info.context or {}).get("base_dir", "."))
        return os.path.abspath(base / Path(value).expanduser())


class HarnessConfig(Section):
    """``harness``: who plays the rollouts."""

    target: str = Field(default=EXTERNAL, min_length=1)
    """``module:function`` called once per rollout as ``function(client, task, seed, **options)``
    with an ``openai.OpenAI`` client bound to the rollout's attempt, the task record and the
    rollout's seed, returning the harness result (``output`` and ``reward``); or ``external``:
    Grove serves the gateway and trains on the attempts agents open themselves."""

    concurrency: int = Field(default=1, ge=1, le=1024)
    """Rollouts played at once by an in-process harness (threads)."""

    options: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to an in-process harness with every rollout."""

    _config_dir: str = PrivateAttr(default=".")

    @model_validator(mode="after")
    def _remember_config_dir(self, info: ValidationInfo) -> HarnessConfig:
        self._config_dir = str((info.context or {}).get("base_dir", "."))
        return self

    @property
    def config_dir(self) -> Path:
        """The configuration file's directory (the current one for a mapping): a ``target``
        module beside the file is importable from it (``grove/train/harness.py``)."""
        return Path(self._config_dir)


class DataConfig(Section):
    """``data``: the tasks an in-process harness plays, one prompt group per task."""

    path: str | None = Field(default=None, min_length=1)
    """A JSONL file: one JSON object per line, handed to the harness as the task record. Each
    task becomes a prompt group of ``grpo.num_generations_per_prompt`` logical rollouts."""

    shuffle: bool = True
    """Visit the tasks in a seeded random order, drawn afresh each epoch."""

    shuffle_seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of the task order."""

    epochs: int = Field(default=1, ge=1, le=1_000_000)
    """Passes over the task file; the run stops when they are used up (or at the step limit)."""

    @field_validator("path")
    @classmethod
    def _resolve(cls, value: str | None, info: ValidationInfo) -> str | None:
        return _resolved(value, info)


class LoggingConfig(Section):
    """``logging``: where each step's metrics go besides ``WORKDIR/runs/RUN/metrics.jsonl``."""

    tensorboard: bool = True
    """Also write TensorBoard event files under ``WORKDIR/runs/RUN/tensorboard``."""
