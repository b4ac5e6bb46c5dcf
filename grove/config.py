"""Grove's configuration: one typed schema, parsed once at the entry point, refused whole if wrong.

The keys follow the forest-training documentation (seed ``000``, "Configuration and supported
scope"): ``token_capture.*``, ``grpo.*``, ``loss_fn.*``, ``policy.*`` and
``async_rl.rollout_failure.*``. Every field has a default, bounds and a docstring. Unknown keys are
errors, so a typo never silently falls back to a default.

Three rules run during validation, before any rollout:

- ``token_capture.context_compaction`` (the key of earlier experimental builds) is refused with a
  message that names its replacement, ``token_capture.forest_training``.
- A custom selection policy ``module:function`` is resolved by the training side's own resolver
  (``training.selection.resolve_selection_policy``): an unknown module, a missing attribute or a
  non-callable target is an error now, not at the first rollout.
- Combinations Grove does not support are collected and refused together in ONE bulleted error, so
  a user fixes them in one pass (the ``validate_physical_trace_training_config`` pattern that the
  review of seed ``002`` praised).

Where Grove departs from the seed: Grove's learner is its own torch trainer
(``training/trainer.py``) with Megatron as an optional adapter, so ``policy.megatron_cfg.enabled``
is not required; and Grove always takes one optimizer step per logical batch, so
``policy.train_global_batch_size`` must equal the logical rollouts per step in every mode, not only
in forest mode.

A test pins the set of known fields (``config_field_paths``): a new field turns it red until
someone triages it against the combination rules (review item AI-2 in seed ``002``).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_core import PydanticCustomError

from training.selection import resolve_selection_policy

__all__ = [
    "ConfigurationError",
    "GroveConfig",
    "config_field_paths",
    "load_config",
    "unsupported_combinations",
]


class ConfigurationError(ValueError):
    """The configuration was refused; ``problems`` lists every reason, one line each."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = tuple(problems)
        bullets = "\n".join(f"- {problem}" for problem in problems)
        super().__init__(f"Invalid Grove configuration ({source}):\n{bullets}")


class _Section(BaseModel):
    """Base of every section: frozen, unknown keys refused, field docstrings become descriptions."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class TokenCaptureConfig(_Section):
    """``token_capture``: what the gateway records and how training selects from it."""

    enabled: bool = False
    """Record every model call's exact tokens into the ledger (required by forest training)."""

    forest_training: bool = False
    """Train on forest rows: selected calls become one or more rows per logical rollout."""

    selection_policy: str = "returned_history"
    """``returned_history``, ``all_captured`` or a custom ``module:function`` taking
    ``(records, result)``; resolved during validation. Non-default policies need forest training."""

    min_valid_fraction_per_group: float | None = Field(default=None, ge=0.0, le=1.0)
    """Discard a prompt group whose fraction of verified logical rollouts is below this; ``None``
    disables the filter. Each rollout counts once, whatever its row count."""

    defer_routed_experts_to_policy: bool = False
    """Deferred routed-expert assembly by the policy; not supported with forest training."""

    pending_call_timeout_s: float = Field(default=300.0, gt=0.0, le=86_400.0)
    """After the harness returns, how long pending calls are awaited before masking the rollout."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_renamed_keys(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and "context_compaction" in data:
            raise PydanticCustomError(
                "renamed_key",
                "token_capture.context_compaction was renamed to token_capture.forest_training: "
                "rename the key and keep its value ({value})",
                {"value": repr(data["context_compaction"])},
            )
        return data

    @field_validator("selection_policy")
    @classmethod
    def _resolve_selection_policy(cls, value: str) -> str:
        resolve_selection_policy(value)
        return value


class RewardShapingConfig(_Section):
    """``grpo.reward_shaping``: post-rollout reward rewriting (not supported in forest training)."""

    enabled: bool = False
    """Rewrite rewards after the rollout; forest training keeps one unshaped reward per rollout."""


class GRPOConfig(_Section):
    """``grpo``: prompt groups, advantages and the per-rollout masking rules."""

    num_prompts_per_step: int = Field(default=4, ge=1, le=1_000_000)
    """Prompt groups per optimizer step."""

    num_generations_per_prompt: int = Field(default=4, ge=1, le=100_000)
    """Logical rollouts per prompt group."""

    max_num_steps: int = Field(default=100, ge=1, le=100_000_000)
    """Optimizer steps to run."""

    normalize_rewards: bool = True
    """Divide each group's centred rewards by the group's standard deviation."""

    use_leave_one_out_baseline: bool = False
    """Baseline each rollout on its siblings only (RLOO) instead of the whole group's mean."""

    advantage_clip_low: float | None = Field(default=None, ge=-1e6, le=1e6)
    """Clamp each logical rollout's advantage from below before broadcast; ``None``: no clamp.
    Padding and filtered owners keep zero even outside the interval."""

    advantage_clip_high: float | None = Field(default=None, ge=-1e6, le=1e6)
    """Clamp each logical rollout's advantage from above before broadcast; ``None``: no clamp."""

    seq_logprob_error_threshold: float | None = Field(default=None, ge=1.0, le=1e6)
    """Exclude a rollout's rows from loss when its pooled token multiplicative probability error
    (over uniquely owned generated tokens) exceeds this; ``None``: diagnostic only."""

    masked_reward_policy: Literal["exclude", "include"] = "exclude"
    """Whether a masked rollout's reward still votes in its group's baseline (once)."""

    overlong_filtering: bool = False
    """Exclude every row of a rollout in which any selected generation hit a length limit."""

    calculate_advantages_on_gpu: bool = False
    """Compute advantages on the accelerator; not supported with forest training."""

    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    """Post-rollout reward shaping."""


class LossConfig(_Section):
    """``loss_fn``: the clipped policy-gradient loss (``training/loss.py``)."""

    ratio_clip_min: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Lower clip ``eps``: the importance ratio is clamped to at least ``1 - ratio_clip_min``."""

    ratio_clip_max: float = Field(default=0.2, ge=0.0, le=100.0)
    """Upper clip ``eps``: the importance ratio is clamped to at most ``1 + ratio_clip_max``."""

    token_level_loss: bool = True
    """Normalize by the step's retained valid tokens (the only reduction Grove implements)."""

    sequence_level_importance_ratios: bool = False
    """One importance ratio per sequence instead of per token (not implemented by Grove)."""


class MegatronConfig(_Section):
    """``policy.megatron_cfg``: the optional Megatron-core learner (``training/megatron.py``)."""

    enabled: bool = False
    """Train with Megatron-core on packed rows instead of Grove's torch trainer."""

    virtual_pipeline_model_parallel_size: int | None = Field(default=None, ge=1, le=1024)
    """Interleaved pipeline stages; anything above 1 is interleaving, not supported for forests."""


class ToggleConfig(_Section):
    """A feature switch with one ``enabled`` field."""

    enabled: bool = False
    """Turn the feature on."""


class PolicyConfig(_Section):
    """``policy``: the learner, its batches and its optimizer."""

    train_global_batch_size: int = Field(default=16, ge=1, le=100_000_000)
    """Logical rollouts per optimizer step (never rows: a rollout may have several rows)."""

    train_micro_batch_size: int = Field(default=4, ge=1, le=1_000_000)
    """Rows per forward/backward pass."""

    logprob_micro_batch_size: int = Field(default=4, ge=1, le=1_000_000)
    """Rows per forward pass when only log-probabilities are recomputed."""

    data_parallel_size: int = Field(default=1, ge=1, le=1_000_000)
    """Data-parallel ranks; with the micro batch it sets the execution row multiple."""

    learning_rate: float = Field(default=1e-6, gt=0.0, le=1.0)
    """Peak learning rate of the AdamW optimizer."""

    weight_decay: float = Field(default=0.0, ge=0.0, le=1.0)
    """AdamW decoupled weight decay."""

    max_grad_norm: float | None = Field(default=1.0, gt=0.0, le=1e6)
    """Clip the global gradient norm to this before each step; ``None``: no clipping."""

    lr_warmup_rollouts: int = Field(default=0, ge=0, le=1_000_000_000)
    """Linear warm-up length counted in logical rollouts (the scheduler never counts rows)."""

    max_total_sequence_length: int = Field(default=4096, ge=2, le=10_000_000)
    """Longest row, prompt and generations together, that the learner accepts."""

    megatron_cfg: MegatronConfig = Field(default_factory=MegatronConfig)
    """Megatron-core learner settings."""

    automodel_cfg: ToggleConfig = Field(default_factory=ToggleConfig)
    """The AutoModel learner; not qualified for forest training."""

    sequence_packing: ToggleConfig = Field(default_factory=ToggleConfig)
    """Pack rows into one ``thd`` sequence per micro batch (Megatron only)."""

    dynamic_batching: ToggleConfig = Field(default_factory=ToggleConfig)
    """Token-budget dynamic batching; not supported."""

    @property
    def execution_row_multiple(self) -> int:
        """Rows per step must be a multiple of this: data-parallel size x micro batch when batches
        are fixed, the data-parallel size alone when rows are packed."""
        if self.sequence_packing.enabled:
            return self.data_parallel_size
        return self.data_parallel_size * self.train_micro_batch_size


class RolloutFailureConfig(_Section):
    """``async_rl.rollout_failure``: how many dropped prompt groups a step tolerates."""

    min_step_batch_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """Stop training when a step retains fewer than this fraction of its configured groups."""


class AsyncRLConfig(_Section):
    """``async_rl``: rollout collection policies."""

    rollout_failure: RolloutFailureConfig = Field(default_factory=RolloutFailureConfig)
    """Drop budget of a training step."""


class CheckpointingConfig(_Section):
    """``checkpointing``: schema-5 checkpoints (``training/checkpoint.py``)."""

    enabled: bool = True
    """Write checkpoints."""

    checkpoint_dir: str = Field(default="checkpoints", min_length=1, max_length=4096)
    """Directory of the checkpoints, relative to the working directory unless absolute."""

    save_period: int = Field(default=1, ge=1, le=1_000_000)
    """Write a checkpoint every this many optimizer steps."""


class GroveConfig(_Section):
    """The whole configuration; build it with ``load_config``."""

    seed: int = Field(default=0, ge=0, le=2**32 - 1)
    """Seed of python, numpy and torch generators at the start of a run."""

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
        """sha256 of the canonical JSON of every value, recorded in checkpoints."""
        canonical = json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
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
    if (
        grpo.advantage_clip_low is not None
        and grpo.advantage_clip_high is not None
        and grpo.advantage_clip_low > grpo.advantage_clip_high
    ):
        problems.append(
            f"grpo.advantage_clip_low ({grpo.advantage_clip_low}) must not exceed "
            f"grpo.advantage_clip_high ({grpo.advantage_clip_high})"
        )
    if not loss.token_level_loss:
        problems.append("loss_fn.token_level_loss: false is not supported (token-level loss only)")
    if loss.sequence_level_importance_ratios:
        problems.append("loss_fn.sequence_level_importance_ratios: true is not supported")
    if policy.dynamic_batching.enabled:
        problems.append("policy.dynamic_batching.enabled: true is not supported")
    if policy.sequence_packing.enabled and not policy.megatron_cfg.enabled:
        problems.append(
            "policy.sequence_packing.enabled needs policy.megatron_cfg.enabled: Grove's torch "
            "trainer runs fixed micro batches"
        )
    if capture.selection_policy != "returned_history" and not capture.forest_training:
        problems.append(
            f"token_capture.selection_policy {capture.selection_policy!r} needs "
            "token_capture.forest_training: true"
        )
    if capture.forest_training:
        problems.extend(_forest_training_problems(config))
    return problems


def _forest_training_problems(config: GroveConfig) -> list[str]:
    capture, grpo, policy = config.token_capture, config.grpo, config.policy
    problems: list[str] = []
    if not capture.enabled:
        problems.append("token_capture.forest_training needs token_capture.enabled: true")
    if capture.defer_routed_experts_to_policy:
        problems.append(
            "token_capture.defer_routed_experts_to_policy must be false with forest training"
        )
    if policy.automodel_cfg.enabled:
        problems.append("policy.automodel_cfg.enabled must be false with forest training")
    vpp = policy.megatron_cfg.virtual_pipeline_model_parallel_size
    if policy.megatron_cfg.enabled and vpp is not None and vpp > 1:
        problems.append(
            f"policy.megatron_cfg.virtual_pipeline_model_parallel_size ({vpp}): interleaved "
            "Megatron is not supported with forest training"
        )
    if grpo.calculate_advantages_on_gpu:
        problems.append("grpo.calculate_advantages_on_gpu must be false with forest training")
    if grpo.reward_shaping.enabled:
        problems.append("grpo.reward_shaping.enabled must be false with forest training")
    return problems


def config_field_paths(model: type[BaseModel] = GroveConfig, prefix: str = "") -> frozenset[str]:
    """Dotted paths of every leaf field (``grpo.advantage_clip_low``, ...), for the pinning test."""
    paths: set[str] = set()
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            paths |= config_field_paths(annotation, f"{prefix}{name}.")
        else:
            paths.add(f"{prefix}{name}")
    return frozenset(paths)


def _problem_lines(error: ValidationError) -> list[str]:
    lines: list[str] = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"])
        problems = item.get("ctx", {}).get("problems")
        if problems:
            lines.extend(problems)
        else:
            message = item["msg"].removeprefix("Value error, ")
            lines.append(f"{where}: {message}" if where else message)
    return lines


def load_config(source: Mapping[str, Any] | str | os.PathLike[str] | None = None) -> GroveConfig:
    """Parse a configuration from a mapping, or a ``.yaml``/``.yml``/``.json`` file; ``None`` gives
    the defaults. Raises ``ConfigurationError`` listing every problem; nothing is half-applied."""
    if source is None:
        data: Any = {}
        label = "defaults"
    elif isinstance(source, Mapping):
        data, label = source, "mapping"
    else:
        path = Path(source)
        label = str(path)
        try:
            text = path.read_text()
        except OSError as error:
            raise ConfigurationError(label, [f"cannot read the file: {error}"]) from error
        try:
            if path.suffix in (".yaml", ".yml"):
                data = yaml.safe_load(text)
            elif path.suffix == ".json":
                data = json.loads(text)
            else:
                raise ConfigurationError(
                    label, [f"unknown file type {path.suffix!r}: use .yaml, .yml or .json"]
                )
        except (yaml.YAMLError, json.JSONDecodeError) as error:
            raise ConfigurationError(label, [f"cannot parse the file: {error}"]) from error
        if data is None:
            data = {}
    if not isinstance(data, Mapping):
        raise ConfigurationError(
            label, [f"the top level must be a mapping, got {type(data).__name__}"]
        )
    try:
        return GroveConfig.model_validate(dict(data))
    except ValidationError as error:
        raise ConfigurationError(label, _problem_lines(error)) from error
