"""Grove's configuration: one typed schema, parsed once at the entry point, refused whole if wrong.

``GroveConfig`` joins the training sections (``grove/config/training.py``: the keys the forest
training rules are written in) and the job sections (``grove/config/job.py``: model, engine,
harness, data, logging). Unknown keys are errors, so a typo never silently falls back to a
default. Settings Grove does not support together are collected and refused in ONE bulleted
error (``unsupported_combinations``), so a user fixes them in one pass.

Where Grove departs from the forest-training rules it implements (``docs/train.md``): the learner
is Grove's own torch trainer (``training/trainer.py``), so Megatron is not required (nor run: its
GPTModel needs CUDA even for a forward pass; the sharded learner is FSDP2); and Grove always takes
one optimizer step per logical batch, so ``policy.train_global_batch_size`` must equal the logical
rollouts per step in every mode.
"""

from __future__ import annotations

import hashlib
import json

from pydantic import BaseModel, Field, model_validator
from pydantic_core import PydanticCustomError

from grove.config.base import Section
from grove.config.gateway import GatewayConfig
from grove.config.job import (
    EMBEDDED,
    EXTERNAL,
    DataConfig,
    EngineConfig,
    HarnessConfig,
    LoggingConfig,
    ModelConfig,
)
from grove.config.training import (
    AsyncRLConfig,
    CheckpointingConfig,
    GRPOConfig,
    LossConfig,
    PolicyConfig,
    TokenCaptureConfig,
)

__all__ = ["RUN_CONTROL_FIELDS", "GroveConfig", "config_field_paths", "unsupported_combinations"]

RUN_CONTROL_FIELDS: frozenset[str] = frozenset(
    {
        "grpo.max_num_steps",
        "engine.host",
        "engine.port",
        "engine.auth_token",
        "engine.vllm_url",
        "engine.vllm_python",
        "engine.vllm_start_timeout_s",
        "engine.vllm_weights_dir",
        "harness.concurrency",
        "logging.tensorboard",
        "policy.dtensor_cfg.enabled",
    }
)
"""Fields left out of ``GroveConfig.digest``: they say how long, where and how visibly a run
goes, not what it computes, so a resumed run may change them (``--steps`` extends a run; a vLLM
server may move). FSDP2 sharding is one: a checkpoint holds the whole model and optimizer state
whether or not its run was sharded, and the sharded step computes the unsharded one's gradients
(in another summation order), so a run may resume with the sharding turned on or off."""


class GroveConfig(Section):
    """The whole configuration; build it with ``grove.config.load_config``."""

    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of the model's initial weights (embedded), of python, numpy and torch generators at
    the start of a run, and of each rollout's seed."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    """The policy model."""

    engine: EngineConfig = Field(default_factory=EngineConfig)
    """The inference engine and the gateway."""

    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    """How the gateway bounds its clients (left out of ``digest``: it shapes no computation)."""

    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    """Who plays the rollouts."""

    data: DataConfig = Field(default_factory=DataConfig)
    """The tasks."""

    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    """Metrics sinks."""

    token_capture: TokenCaptureConfig = Field(default_factory=TokenCaptureConfig)
    """Capture and selection."""

    grpo: GRPOConfig = Field(default_factory=GRPOConfig)
    """Groups and advantages."""

    loss_fn: LossConfig = Field(default_factory=LossConfig)
    """The policy-gradient loss."""

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    """The learner."""

    async_rl: AsyncRLConfig = Field(default_factory=AsyncRLConfig)
    """Rollout collection."""

    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoints."""

    @model_validator(mode="after")
    def _refuse_unsupported_combinations(self) -> GroveConfig:
        problems = unsupported_combinations(self)
        if problems:
            raise PydanticCustomError(
                "unsupported_combination",
                "unsupported combination of settings:\n{bullets}",
                {"bullets": "\n".join(f"- {p}" for p in problems), "problems": tuple(problems)},
            )
        return self

    def digest(self) -> str:
        """sha256 of the canonical JSON of every value that shapes the computation (all but
        ``RUN_CONTROL_FIELDS``), recorded in checkpoints and compared on resume."""
        values = self.model_dump(mode="json")
        for path in RUN_CONTROL_FIELDS:
            *sections, name = path.split(".")
            held = values
            for section in sections:
                held = held[section]
            held.pop(name)
        values.pop("gateway")  # how the gateway bounds clients, not what the run computes
        canonical = json.dumps(values, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def unsupported_combinations(config: GroveConfig) -> list[str]:
    """Every rule the settings break together, one sentence each (empty when supported)."""
    capture, grpo, loss, policy = config.token_capture, config.grpo, config.loss_fn, config.policy
    problems: list[str] = []
    logical_rollouts = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
    if policy.train_global_batch_size != logical_rollouts:
        problems.append(
            f"policy.train_global_batch_size ({policy.train_global_batch_size}) must equal the "
            "logical rollouts per step, grpo.num_prompts_per_step x "
            f"grpo.num_generations_per_prompt ({logical_rollouts}): one optimizer step per batch"
        )
    if grpo.forks.per_step > grpo.num_prompts_per_step:
        problems.append(
            f"grpo.forks.per_step ({grpo.forks.per_step}) must not exceed "
            f"grpo.num_prompts_per_step ({grpo.num_prompts_per_step}): fork groups take the "
            "place of task groups in a step"
        )
    if grpo.forks.per_step and config.harness.target == EXTERNAL:
        problems.append(
            "grpo.forks.per_step needs an in-process harness (harness.target: module:function): "
            "grove train plays the forks itself; external agents open forks with grove.client "
            "(docs/fork.md)"
        )
    if (
        grpo.advantage_clip_low is not None
        and grpo.advantage_clip_high is not None
        and grpo.advantage_clip_low > grpo.advantage_clip_high
    ):
        problems.append(
            f"grpo.advantage_clip_low ({grpo.advantage_clip_low}) must not exceed "
            f"grpo.advantage_clip_high ({grpo.advantage_clip_high})"
        )
    if not capture.enabled:
        problems.append(
            "token_capture.enabled: false is not supported: Grove trains only on the exact "
            "tokens it captured"
        )
    if not loss.token_level_loss:
        problems.append("loss_fn.token_level_loss: false is not supported (token-level loss only)")
    if loss.sequence_level_importance_ratios:
        problems.append("loss_fn.sequence_level_importance_ratios: true is not supported")
    if policy.dtensor_cfg.enabled and policy.tree_packing:
        problems.append(
            "policy.dtensor_cfg.enabled: true is not supported with policy.tree_packing: true: a "
            "tree-packed micro batch holds whole prompt trees, so ranks may run different "
            "numbers of passes, and FSDP2 gathers every layer in every pass on every rank; turn "
            "one of them off (unsharded data-parallel ranks sum gradients once per step, so "
            "tree packing trains on them)"
        )
    if policy.dynamic_batching.enabled:
        problems.append("policy.dynamic_batching.enabled: true is not supported")
    if policy.megatron_cfg.enabled:
        problems.append(
            "policy.megatron_cfg.enabled: true is not supported: megatron-core's GPTModel needs "
            "CUDA even for a forward pass (its rotary embedding and attention buffers call "
            "torch.cuda.current_device()), so Grove cannot test a Megatron learner on the CPU "
            "its tests run on; the sharded learner is FSDP2: set policy.dtensor_cfg.enabled: true"
        )
    problems.extend(_sequence_packing_problems(config))
    if policy.tree_packing and config.model.architecture != "dense":
        problems.append(
            "policy.tree_packing: true is not supported with model.architecture: "
            f"{config.model.architecture}: tree-packed training neither replays routed experts "
            "nor feeds media; turn policy.tree_packing off"
        )
    problems.extend(_vlm_problems(config))
    problems.extend(_precision_problems(config))
    if config.model.architecture != "dense" and config.model.path != EMBEDDED:
        problems.append(
            f"model.architecture: {config.model.architecture} builds the embedded model only "
            "(model.path: embedded); a model directory's config.json names its architecture: "
            "remove model.architecture"
        )
    if config.model.architecture == "moe" and config.model.warm_start:
        problems.append(
            "model.warm_start fits the dense embedded model only; with model.architecture: moe "
            "remove model.warm_start"
        )
    if config.model.warm_start and config.model.path != EMBEDDED:
        problems.append(
            "model.warm_start fits the embedded model only (model.path: embedded); a model "
            "directory brings its own trained weights: remove model.warm_start"
        )
    if capture.selection_policy != "returned_history" and not capture.forest_training:
        problems.append(
            f"token_capture.selection_policy {capture.selection_policy!r} needs "
            "token_capture.forest_training: true"
        )
    problems.extend(_unimplemented_problems(config))
    problems.extend(_harness_problems(config))
    problems.extend(_engine_problems(config))
    return problems


def _sequence_packing_problems(config: GroveConfig) -> list[str]:
    """What ``policy.sequence_packing`` cannot be combined with (``docs/train.md``, "Sequence
    packing")."""
    policy = config.policy
    packing = policy.sequence_packing
    if not packing.enabled:
        return []
    problems = [
        f"policy.sequence_packing.{name} ({tokens}) must be at least "
        f"policy.max_total_sequence_length ({policy.max_total_sequence_length}): every row must "
        "fit one bin"
        for name, tokens in (
            ("train_mb_tokens", packing.train_mb_tokens),
            ("logprob_mb_tokens", packing.logprob_mb_tokens),
        )
        if tokens < policy.max_total_sequence_length
    ]
    if policy.tree_packing:
        problems.append(
            "policy.sequence_packing.enabled and policy.tree_packing lay out a micro batch two "
            "ways: tree packing computes the shared prefixes of whole rollouts once, sequence "
            "packing gives every row its own attention context in token-budget bins; turn one off"
        )
    if config.model.architecture != "dense":
        problems.append(
            "policy.sequence_packing.enabled: true is not supported with model.architecture: "
            f"{config.model.architecture}: packed rows neither replay routed experts nor feed "
            "media; turn policy.sequence_packing off"
        )
    return problems


def _vlm_problems(config: GroveConfig) -> list[str]:
    """What the embedded vision-language model (``model.architecture: vlm``, docs/media.md)
    cannot be combined with."""
    if config.model.architecture != "vlm":
        return []
    problems = []
    if config.engine.kind != "embedded":
        problems.append(
            "model.architecture: vlm is served by the embedded engine only: Grove sends vLLM "
            "exact prompt token ids without images (docs/media.md, 'vLLM'); set engine.kind: "
            "embedded"
        )
    if config.model.warm_start:
        problems.append(
            "model.warm_start fits the text models on a corpus without images, not "
            "model.architecture: vlm: remove model.warm_start"
        )
    return problems


def _precision_problems(config: GroveConfig) -> list[str]:
    """``policy.precision`` and ``policy.device`` against the model (``docs/train.md``,
    "Devices, precision and activation checkpointing")."""
    policy, model = config.policy, config.model
    problems = []
    if policy.precision == "bfloat16" and model.dtype != "float32":
        problems.append(
            f"policy.precision: bfloat16 keeps float32 master weights and optimizer state and "
            f"runs the forward under bfloat16 autocast, but model.dtype is {model.dtype}: set "
            "model.dtype: float32 (or policy.precision: float32 to train in the model's dtype)"
        )
    if policy.device == "cuda" and model.architecture == "vlm":
        problems.append(
            "policy.device: cuda is not supported with model.architecture: vlm: the embedded "
            "vision-language model and its engine run on the CPU; set policy.device: cpu or auto"
        )
    return problems


def _unimplemented_problems(config: GroveConfig) -> list[str]:
    """Switches of features Grove does not implement, refused in every mode."""
    capture, grpo, policy = config.token_capture, config.grpo, config.policy
    problems = [
        f"{name}: true is not supported: {why}"
        for name, on, why in (
            (
                "token_capture.defer_routed_experts_to_policy",
                capture.defer_routed_experts_to_policy,
                "routed experts are assembled with each call's capture",
            ),
            (
                "policy.automodel_cfg.enabled",
                policy.automodel_cfg.enabled,
                "Grove's learner is its torch trainer",
            ),
            (
                "grpo.calculate_advantages_on_gpu",
                grpo.calculate_advantages_on_gpu,
                "advantages are computed per logical rollout on the CPU",
            ),
            (
                "grpo.reward_shaping.enabled",
                grpo.reward_shaping.enabled,
                "each logical rollout keeps the one reward its harness gave",
            ),
        )
        if on
    ]
    vpp = policy.megatron_cfg.virtual_pipeline_model_parallel_size
    if vpp is not None and vpp > 1:
        problems.append(
            f"policy.megatron_cfg.virtual_pipeline_model_parallel_size ({vpp}): interleaved "
            "Megatron is not supported"
        )
    return problems


def _harness_problems(config: GroveConfig) -> list[str]:
    harness, data = config.harness, config.data
    if harness.target == EXTERNAL:
        unread = [
            name
            for name, value, default in (
                ("data.path", data.path, None),
                ("harness.options", harness.options, {}),
                ("harness.concurrency", harness.concurrency, 1),
                (
                    "async_rl.rollout_failure.max_replacement_groups",
                    config.async_rl.rollout_failure.max_replacement_groups,
                    0,
                ),
            )
            if value != default
        ]
        return [
            f"{name} is read only by an in-process harness; with harness.target: external "
            "your agents bring their own tasks: remove it"
            for name in unread
        ]
    if data.path is None:
        return [
            f"harness.target {harness.target!r} plays tasks from a file: set data.path to a "
            "JSONL file of tasks"
        ]
    return []


_VLLM_KEYS: tuple[tuple[str, object], ...] = (
    ("vllm_url", None),
    ("vllm_launch", False),
    ("vllm_python", None),
    ("vllm_args", []),
    ("vllm_start_timeout_s", 600.0),
    ("vllm_weights_dir", None),
)
_LAUNCH_KEYS: frozenset[str] = frozenset({"vllm_python", "vllm_args", "vllm_start_timeout_s"})


def _engine_problems(config: GroveConfig) -> list[str]:
    """How the engine is reached (``docs/engines.md``): vLLM needs a server, launched or at a
    URL (not both); ``engine.vllm_*`` keys that nothing reads are refused."""
    engine = config.engine
    changed = [name for name, default in _VLLM_KEYS if getattr(engine, name) != default]
    if engine.kind == "embedded":
        return [
            f"engine.{name} is read only by engine.kind: vllm; the embedded engine samples in "
            "the training process: remove it, or set engine.kind: vllm"
            for name in changed
        ]
    problems = []
    if engine.vllm_url is None and not engine.vllm_launch:
        problems.append(
            "engine.kind: vllm needs a server: set engine.vllm_launch: true (Grove starts vLLM) "
            "or engine.vllm_url to a running vLLM server"
        )
    if engine.vllm_url is not None and engine.vllm_launch:
        problems.append(
            "engine.vllm_url and engine.vllm_launch: true name two servers: keep one of them"
        )
    if engine.vllm_url is not None:
        problems.extend(
            f"engine.{name} is read only when Grove launches vLLM (engine.vllm_launch: true); "
            f"with engine.vllm_url the server is already running: remove it"
            for name in changed
            if name in _LAUNCH_KEYS
        )
    if config.model.dtype == "float64":
        problems.append(
            "model.dtype float64 is not served by vLLM (float32, bfloat16, float16): pick one "
            "of them, or engine.kind: embedded"
        )
    return problems


def config_field_paths(model: type[BaseModel] = GroveConfig, prefix: str = "") -> frozenset[str]:
    """Dotted paths of every leaf field (``grpo.advantage_clip_low``, ...): the keys that
    ``tests/unit/config/test_key_effects.py`` and ``docs/train.md`` must each cover."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= config_field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(f"{prefix}{name}")
    return frozenset(paths)
