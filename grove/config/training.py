"""The training sections of Grove's configuration: the keys the forest-training rules are written
in (``token_capture``, ``grpo``, ``loss_fn``, ``policy``, ``async_rl``, ``checkpointing``).

Every field has a default, bounds and a docstring, and is read by the code that runs
(``docs/train.md`` names the reader of each key). ``token_capture.context_compaction`` (the key of
earlier experimental builds) is refused with a message that names its replacement,
``token_capture.forest_training``; a custom selection policy ``module:function`` is resolved by
the training side's own resolver (``grove.training.selection.resolve_selection_policy``) during
validation, so an unknown module or attribute is an error now, not at the first rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from grove.capture.attempt_settings import DEFAULT_FOREST_MODE
from grove.capture.reward_bound import DEFAULT_MAX_ABS_REWARD, MAX_REWARD_BOUND
from grove.config.base import Section
from grove.ledger.attempt import DEFAULT_SETTLE_TIMEOUT_S
from grove.training.selection import resolve_selection_policy

__all__ = [
    "AsyncRLConfig",
    "CheckpointingConfig",
    "DTensorConfig",
    "ForksConfig",
    "GRPOConfig",
    "LossConfig",
    "MegatronConfig",
    "PolicyConfig",
    "RewardShapingConfig",
    "RolloutFailureConfig",
    "SequencePackingConfig",
    "ToggleConfig",
    "TokenCaptureConfig",
]


class TokenCaptureConfig(Section):
    """``token_capture``: what the gateway records and how training selects from it."""

    enabled: bool = True
    """Record every model call's exact tokens into the ledger; Grove trains only on captured
    tokens, so ``false`` is refused."""

    forest_training: bool = DEFAULT_FOREST_MODE
    """Train on forest rows: selected calls become one or more rows per logical rollout. Off (the
    default, for ``grove train``, ``grove serve`` and ``grove project`` alike), a rollout trains
    only as one row: one whose context was rewritten (or that branched) is masked
    ``forest_training_disabled``. It is also the forest mode of gateway attempts that give none."""

    selection_policy: str = "returned_history"
    """``returned_history``, ``all_captured`` or a custom ``module:function`` taking
    ``(records, result)``; resolved during validation. Non-default policies need forest training.
    It is the gateway's policy: attempts that name none get it, and a custom one is registered,
    so attempts may name it or a built-in and nothing else (``docs/gateway.md``)."""

    min_valid_fraction_per_group: float | None = Field(default=None, gt=0.0, le=1.0)
    """Discard a prompt group whose fraction of verified logical rollouts is below this; ``None``
    disables the filter (0 would too, so it is refused: write ``null``). Each rollout counts
    once, whatever its row count."""

    defer_routed_experts_to_policy: bool = False
    """Deferred routed-expert assembly by the policy; refused when true (routes are assembled
    with each call's capture)."""

    pending_call_timeout_s: float = Field(default=DEFAULT_SETTLE_TIMEOUT_S, gt=0.0, le=86_400.0)
    """After the harness returns, how long pending calls are awaited before masking the rollout
    (the gateway's settle timeout; ``grove serve --settle-timeout``)."""

    max_model_calls: int | None = Field(default=None, ge=1, le=1_000_000)
    """The model calls one attempt may record (``None``: unbounded). A call beyond is refused
    (409 ``call_budget_exhausted``) before its intent, nothing written; every recorded call counts,
    a resample after a rejection too (``capture/attempt_settings.py``)."""

    strict: bool = False
    """Refuse (409, with its divergence diagnostic) a call the gateway would root unexplained:
    one that continues a committed call whose exact tokens the chat template cannot extend
    (``docs/normalization.md``, "Strict mode"); off, such a call is recorded as a root."""

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


class RewardShapingConfig(Section):
    """``grpo.reward_shaping``: post-rollout reward rewriting (refused: each logical rollout keeps
    the one reward its harness gave)."""

    enabled: bool = False
    """Rewrite rewards after the rollout; refused when true."""


class ForksConfig(Section):
    """``grpo.forks``: per-state groups, prompt groups that fork a call of the previous step
    (``docs/fork.md``, "Per-state groups")."""

    per_step: int = Field(default=0, ge=0, le=1_000_000)
    """Prompt groups of each step after the first that fork a turn of the previous step's batch,
    instead of playing a task (at most ``grpo.num_prompts_per_step``); 0: none."""

    pick: Literal["uniform", "low_reward"] = "uniform"
    """Which turns to fork: drawn uniformly from every turn of the previous step's trainable
    rollouts, or from those of rollouts whose reward is below their group's mean."""


class GRPOConfig(Section):
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
    """Compute advantages on the accelerator; refused when true (advantages are per logical
    rollout, computed on the CPU)."""

    reward_shaping: RewardShapingConfig = Field(default_factory=RewardShapingConfig)
    """Post-rollout reward shaping."""

    forks: ForksConfig = Field(default_factory=ForksConfig)
    """Per-state groups: forks of the previous step's turns, compared with each other."""

    max_abs_reward: float = Field(default=DEFAULT_MAX_ABS_REWARD, gt=0.0, le=MAX_REWARD_BOUND)
    """The largest reward magnitude a harness result may carry; the gateway refuses (422
    ``reward_out_of_range``, nothing written) a result whose reward is beyond it or not finite,
    so one reward cannot overflow its group's variance (``capture/reward_bound.py``)."""


class LossConfig(Section):
    """``loss_fn``: the clipped policy-gradient loss (``training/loss.py``)."""

    ratio_clip_min: float = Field(default=0.2, ge=0.0, lt=1.0)
    """Lower clip ``eps``: the importance ratio is clamped to at least ``1 - ratio_clip_min``."""

    ratio_clip_max: float = Field(default=0.2, ge=0.0, le=100.0)
    """Upper clip ``eps``: the importance ratio is clamped to at most ``1 + ratio_clip_max``."""

    token_level_loss: bool = True
    """Normalize by the step's retained valid tokens (the only reduction Grove implements)."""

    sequence_level_importance_ratios: bool = False
    """One importance ratio per sequence instead of per token (not implemented by Grove)."""


class MegatronConfig(Section):
    """``policy.megatron_cfg``: a Megatron-core learner, which ``grove train`` does not run (its
    GPTModel needs CUDA even for a forward pass; ``docs/train.md``, "Megatron")."""

    enabled: bool = False
    """Train with Megatron-core instead of Grove's torch trainer; refused when true."""

    virtual_pipeline_model_parallel_size: int | None = Field(default=None, ge=1, le=1024)
    """Interleaved pipeline stages; above 1 (interleaving) is refused."""


class ToggleConfig(Section):
    """A switch of a learner feature Grove does not implement: only ``enabled: false`` loads."""

    enabled: bool = False
    """Turn the feature on; refused when true (``docs/train.md`` says why for each)."""


class DTensorConfig(Section):
    """``policy.dtensor_cfg``: the torch learner's sharding and memory settings."""

    enabled: bool = False
    """Shard the model with FSDP2 (``torch.distributed.fsdp.fully_shard``) per decoder layer and
    at the root, one shard per data-parallel rank."""

    activation_checkpointing: bool = False
    """Recompute each decoder layer's activations in the backward pass instead of keeping them
    (``training/activation_checkpointing.py``): less memory, one more forward per layer, the
    same gradients."""


class SequencePackingConfig(Section):
    """``policy.sequence_packing``: a step's rows packed into token-budget bins, each bin one
    sequence in which every row keeps its own attention context (``training/sequence_packing.py``,
    ``docs/train.md``, "Sequence packing"). NeMo-RL's key names."""

    enabled: bool = False
    """Pack rows into bins of ``train_mb_tokens`` (training) and ``logprob_mb_tokens``
    (logprob-only recompute) instead of micro batches of ``policy.train_micro_batch_size`` rows;
    the execution row multiple becomes ``policy.data_parallel_size``."""

    train_mb_tokens: int = Field(default=16_384, ge=2, le=100_000_000)
    """Most tokens in one training bin (one forward and backward pass); at least
    ``policy.max_total_sequence_length``, so every row fits a bin."""

    logprob_mb_tokens: int = Field(default=16_384, ge=2, le=100_000_000)
    """Most tokens in one logprob-only recompute pass (``grpo.seq_logprob_error_threshold``);
    at least ``policy.max_total_sequence_length``."""

    algorithm: Literal["first_fit_decreasing"] = "first_fit_decreasing"
    """How rows are put into bins: first-fit decreasing (longest row first, into the first bin
    with room), the only algorithm."""


class PolicyConfig(Section):
    """``policy``: the learner, its batches and its optimizer."""

    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where the model, each step's rows, logprobs, loss and optimizer state live, and where the
    embedded engine samples: ``auto`` is ``cuda`` when ``torch.cuda.is_available()``, else
    ``cpu``; ``cuda`` on a machine without CUDA is refused before the run starts."""

    precision: Literal["float32", "bfloat16"] = "float32"
    """``bfloat16``: the forward runs under ``torch.autocast(dtype=torch.bfloat16)`` with float32
    master weights and optimizer state (``model.dtype`` must stay float32); logprobs, the loss,
    TMPE and generation KL are computed in float32 from the bfloat16 logits."""

    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    """FSDP2 sharding and activation checkpointing."""

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
    """The AutoModel learner; refused (Grove's learner is its torch trainer)."""

    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    """Token-budget bins of rows instead of fixed micro batches of rows."""

    dynamic_batching: ToggleConfig = Field(default_factory=ToggleConfig)
    """Token-budget dynamic batching; refused."""

    tree_packing: bool = False
    """Train each micro batch's rows as token trees: every shared prefix token (a forest's shared
    ancestors, a prompt group's common prompt) is computed once, with an ancestor attention mask
    and position ids along each path (``docs/forest.md``, "Tree layout"). Micro batches then hold
    whole logical rollouts. Same logprobs, loss and gradients as row by row."""

    @property
    def execution_row_multiple(self) -> int:
        """Rows per step must be a multiple of this: data-parallel size x micro batch, or the
        data-parallel size alone with sequence packing (its bins are not row counts)."""
        if self.sequence_packing.enabled:
            return self.data_parallel_size
        return self.data_parallel_size * self.train_micro_batch_size


class RolloutFailureConfig(Section):
    """``async_rl.rollout_failure``: when a rollout is abandoned, and how many dropped prompt groups
    a step tolerates or replaces (``docs/forest.md``, "Failures and drops")."""

    min_step_batch_fraction: float = Field(default=1.0, gt=0.0, le=1.0)
    """Stop training when a step retains fewer than this fraction of its configured groups."""

    rollout_timeout_s: float | None = Field(default=None, gt=0.0, le=604_800.0)
    """Backstop for a hung rollout, not a deadline per model call: a rollout whose harness has not
    returned its result this many seconds after its attempt opened (an external attempt: after
    the run first saw it open) is abandoned and its prompt group dropped (``rollout_timeout``);
    ``None``: no backstop."""

    max_replacement_groups: int = Field(default=0, ge=0, le=1_000_000)
    """Per step, how many dropped prompt groups an in-process harness replaces with freshly
    played groups before the step trains (external runs replace implicitly: the step waits
    for other complete groups)."""


class AsyncRLConfig(Section):
    """``async_rl``: rollout collection policies."""

    rollout_failure: RolloutFailureConfig = Field(default_factory=RolloutFailureConfig)
    """Abandoned rollouts, and the drop and replacement budgets of a training step."""

    max_policy_lag: int = Field(default=0, ge=0, le=1_000_000)
    """How many policy versions (optimizer steps) the calls of one prompt group may span, and how
    far the oldest may lag behind the step that trains it; a group beyond it is dropped
    (``policy_lag_exceeded``). 0: strictly on-policy."""


class CheckpointingConfig(Section):
    """``checkpointing``: schema-5 checkpoints (``training/checkpoint.py``)."""

    enabled: bool = True
    """Write checkpoints."""

    checkpoint_dir: str = Field(default="checkpoints", min_length=1, max_length=4096)
    """Directory of the checkpoints, relative to the working directory unless absolute."""

    save_period: int = Field(default=1, ge=1, le=1_000_000)
    """Write a checkpoint every this many optimizer steps."""
