"""GRPO advantages per logical rollout, broadcast to its physical rows.

- Group normalization: within a prompt group, ``A_i = (r_i - mean) / (std + epsilon)`` over the
  rollouts that take part in the baseline (``std`` is the unbiased sample deviation, 0 for one
  participant); ``normalize_std=False`` leaves ``r_i - mean``. One advantage per logical rollout,
  however many rows it has; then clamped to ``[advantage_clip_low, advantage_clip_high]``.
- Leave-one-out baseline (RLOO, ``grpo.use_leave_one_out_baseline``): rollout ``i``'s baseline
  is the mean reward of the *other* participants of its group, ``b_i = (sum - r_i) / (n - 1)``,
  so its own reward never lowers its own advantage. With ``normalize_std`` the scale is also left
  out: ``s_i`` is the unbiased deviation of those ``n - 1`` other rewards (0 when fewer than two),
  and ``A_i = (r_i - b_i) / (s_i + epsilon)`` where ``s_i > 0``, else ``r_i - b_i`` (dividing by
  ``epsilon`` alone would blow a two-rollout group up to ``1 / epsilon``; ``docs/forest.md``,
  "Around the forest", works an example). A group with a single participant has no sibling to
  compare with: its advantage is 0.
- Only verified rollouts (a forest with no mask reason) take part. A verified rollout can still be
  filtered: flagged by the environment (``env_masked``), truncated under ``overlong_filtering``
  (any selected generation hit a length limit), or over ``seq_logprob_error_threshold`` (its
  pooled token multiplicative probability error). A filtered rollout trains nothing and gets
  advantage 0, even when 0 lies outside the clip interval; ``masked_reward_policy`` says whether
  its reward stays in the baseline (``include``, once) or leaves it (``exclude``, the default).
  Under ``include`` with the leave-one-out baseline, a filtered rollout is one of the "others" of
  every sibling.
- Groups: a group with no verified rollout has no valid layout and is dropped; with
  ``min_valid_fraction_per_group`` set, a group whose verified fraction is below it is dropped
  too. Each rollout counts once and padding never counts.
- Broadcast: row ``r`` gets the advantage of ``parent_indices[r]``; padding (-1) gets 0.

The pooled error (TMPE, defined in ``docs/metrics.md``, "Trainer and generation agreement: TMPE
and generation KL") weighs every uniquely owned generated token equally, so splitting the same
generations into more rows leaves the decision unchanged. Textbook GRPO has one sequence per
sample; here a sample is a logical rollout with one or more rows (``docs/forest.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import torch

from grove.training.errors import AdvantageError
from grove.training.forest import Forest

__all__ = [
    "AdvantageConfig",
    "GroupDecision",
    "LogicalAdvantages",
    "MaskedRewardPolicy",
    "RolloutFilter",
    "RolloutOutcome",
    "broadcast_to_rows",
    "compute_advantages",
    "group_decisions",
    "pooled_logprob_error",
]


class MaskedRewardPolicy(StrEnum):
    """Whether a filtered rollout's reward stays in its group's baseline
    (``grpo.masked_reward_policy``)."""

    EXCLUDE = "exclude"
    INCLUDE = "include"


class RolloutFilter(StrEnum):
    """Why a verified rollout trains nothing, in checking order."""

    ENVIRONMENT = "environment"
    OVERLONG = "overlong"
    LOGPROB_ERROR = "logprob_error"


@dataclass(frozen=True)
class AdvantageConfig:
    """Advantage settings (the ``grpo.*`` and ``token_capture.*`` keys of the same names).

    ``advantage_clip_low`` / ``advantage_clip_high``: optional clamp, low <= high.
    ``masked_reward_policy``: ``exclude`` or ``include``. ``min_valid_fraction_per_group``:
    optional, in (0, 1]. ``seq_logprob_error_threshold``: optional, >= 1 (the error is at least 1).
    ``overlong_filtering``: filter truncated rollouts. ``normalize_std``: divide by the group's
    std. ``leave_one_out_baseline``: each rollout's baseline (and std) over its group's other
    participants (``grpo.use_leave_one_out_baseline``). ``epsilon`` > 0 keeps the division finite.
    """

    advantage_clip_low: float | None = None
    advantage_clip_high: float | None = None
    masked_reward_policy: MaskedRewardPolicy = MaskedRewardPolicy.EXCLUDE
    min_valid_fraction_per_group: float | None = None
    seq_logprob_error_threshold: float | None = None
    overlong_filtering: bool = False
    normalize_std: bool = True
    leave_one_out_baseline: bool = False
    epsilon: float = 1e-6

    def __post_init__(self) -> None:
        low, high = self.advantage_clip_low, self.advantage_clip_high
        if low is not None and high is not None and low > high:
            raise AdvantageError(
                "clip_interval",
                f"advantage_clip_low {low} must not exceed advantage_clip_high {high}",
            )
        if self.masked_reward_policy not in tuple(MaskedRewardPolicy):
            raise AdvantageError(
                "masked_reward_policy",
                "masked_reward_policy must be 'exclude' or 'include', got "
                f"{self.masked_reward_policy!r}",
            )
        fraction = self.min_valid_fraction_per_group
        if fraction is not None and not 0.0 < fraction <= 1.0:
            raise AdvantageError(
                "min_valid_fraction",
                f"min_valid_fraction_per_group must be in (0, 1], got {fraction}",
            )
        threshold = self.seq_logprob_error_threshold
        if threshold is not None and not threshold >= 1.0:
            raise AdvantageError(
                "logprob_error_threshold",
                f"seq_logprob_error_threshold must be >= 1 (the error's minimum), got {threshold}",
            )
        if not self.epsilon > 0.0:
            raise AdvantageError("epsilon", f"epsilon must be > 0, got {self.epsilon}")


@dataclass(frozen=True)
class RolloutOutcome:
    """What the advantage stage knows of one logical rollout (producer: the projector and the
    trainer; consumer: ``group_decisions``, ``compute_advantages``, metrics).

    ``masked_reason`` is the forest's (or capture's) mask reason, None when verified.
    ``env_masked`` is the environment's flag; ``truncated`` the forest's; ``logprob_error`` the
    pooled error from ``pooled_logprob_error`` (None before the trainer scored the rows).
    """

    rollout_id: str
    group_id: str
    reward: float
    masked_reason: str | None = None
    env_masked: bool = False
    truncated: bool = False
    logprob_error: float | None = None

    @property
    def verified(self) -> bool:
        """Whether the rollout's layout is verified (no mask reason)."""
        return self.masked_reason is None

    @classmethod
    def from_forest(
        cls,
        rollout_id: str,
        group_id: str,
        reward: float,
        forest: Forest,
        *,
        masked_reason: str | None = None,
        env_masked: bool = False,
    ) -> RolloutOutcome:
        """The outcome of a reconstructed rollout; an earlier ``masked_reason`` (capture
        completion) takes precedence over the forest's."""
        return cls(
            rollout_id=rollout_id,
            group_id=group_id,
            reward=reward,
            masked_reason=masked_reason or forest.masked_reason,
            env_masked=env_masked,
            truncated=forest.truncated,
        )


@dataclass(frozen=True)
class GroupDecision:
    """Whether a prompt group trains: ``reason`` is why it is dropped, else None
    (``group_decisions`` decides ``no_valid_layout`` and ``below_min_valid_fraction``;
    ``grove.training.groups.decide_group`` the others). ``detail`` says more where there is more to
    say: the rollout, the harness's error, the policy versions."""

    group_id: str
    kept: bool
    reason: str | None
    verified_rollouts: int
    rollouts: int
    detail: str = ""


@dataclass(frozen=True, eq=False)
class LogicalAdvantages:
    """Per logical rollout, in input order (producer: ``compute_advantages``).

    ``advantages`` float32 ``(N,)``, 0 where not ``trained``; ``trained`` bool ``(N,)``;
    ``filters[i]`` the reason a verified rollout trains nothing (None otherwise);
    ``in_baseline`` bool ``(N,)``, the rollouts whose reward entered their group's baseline.
    """

    rollout_ids: tuple[str, ...]
    advantages: torch.Tensor
    trained: torch.Tensor
    in_baseline: torch.Tensor
    filters: tuple[RolloutFilter | None, ...]


def group_decisions(
    outcomes: Sequence[RolloutOutcome], min_valid_fraction: float | None = None
) -> list[GroupDecision]:
    """One decision per prompt group, in order of first appearance."""
    decisions = []
    for group_id, members in _groups(outcomes):
        verified = sum(1 for outcome in members if outcome.verified)
        if verified == 0:
            reason: str | None = "no_valid_layout"
        elif min_valid_fraction is not None and verified / len(members) < min_valid_fraction:
            reason = "below_min_valid_fraction"
        else:
            reason = None
        decisions.append(GroupDecision(group_id, reason is None, reason, verified, len(members)))
    return decisions


def compute_advantages(
    outcomes: Sequence[RolloutOutcome], config: AdvantageConfig
) -> LogicalAdvantages:
    """Group-normalized, clipped advantage per logical rollout (see the module docstring)."""
    position = {outcome.rollout_id: index for index, outcome in enumerate(outcomes)}
    if len(position) != len(outcomes):
        raise AdvantageError("duplicate_rollout", "each logical rollout must appear once")
    count = len(outcomes)
    advantages = torch.zeros(count, dtype=torch.float64)
    trained = torch.zeros(count, dtype=torch.bool)
    in_baseline = torch.zeros(count, dtype=torch.bool)
    filters: list[RolloutFilter | None] = [None] * count
    for _, members in _groups(outcomes):
        indices = [position[outcome.rollout_id] for outcome in members]
        rewards = torch.tensor([outcome.reward for outcome in members], dtype=torch.float64)
        if not torch.isfinite(rewards).all():
            raise AdvantageError("reward", f"rewards must be finite, got {rewards.tolist()}")
        for index, outcome in zip(indices, members, strict=True):
            filters[index] = _filter(outcome, config) if outcome.verified else None
            trained[index] = outcome.verified and filters[index] is None
            in_baseline[index] = trained[index] or (
                outcome.verified and config.masked_reward_policy == MaskedRewardPolicy.INCLUDE
            )
        group = torch.tensor(indices)
        voting = in_baseline[group]
        if not voting.any():
            continue
        if config.leave_one_out_baseline:
            normalized = _leave_one_out(rewards, voting, config)
        else:
            normalized = _group_normalized(rewards, voting, config)
        if config.advantage_clip_low is not None or config.advantage_clip_high is not None:
            normalized = normalized.clamp(config.advantage_clip_low, config.advantage_clip_high)
        advantages[group] = torch.where(trained[group], normalized, 0.0)
    return LogicalAdvantages(
        rollout_ids=tuple(outcome.rollout_id for outcome in outcomes),
        advantages=advantages.to(torch.float32),
        trained=trained,
        in_baseline=in_baseline,
        filters=tuple(filters),
    )


def broadcast_to_rows(values: torch.Tensor, parent_indices: torch.Tensor) -> torch.Tensor:
    """``(R,)``: each row takes its logical owner's value; padding rows (-1) take 0 (or False).

    Serves advantages, trained flags and any other per-rollout quantity; ``values`` is ``(N,)``.
    """
    if values.ndim != 1 or parent_indices.ndim != 1:
        raise AdvantageError(
            "broadcast_shape",
            f"values must be (N,) and parent_indices (R,), got {tuple(values.shape)} and "
            f"{tuple(parent_indices.shape)}",
        )
    if parent_indices.numel() and (
        int(parent_indices.min()) < -1 or int(parent_indices.max()) >= values.shape[0]
    ):
        raise AdvantageError(
            "parent_index",
            f"parent indices must lie in [-1, {values.shape[0]}), got "
            f"[{int(parent_indices.min())}, {int(parent_indices.max())}]",
        )
    gathered = values[parent_indices.clamp(min=0)]
    return torch.where(parent_indices >= 0, gathered, torch.zeros((), dtype=values.dtype))


def pooled_logprob_error(
    generation_logprobs: torch.Tensor,
    trainer_logprobs: torch.Tensor,
    loss_mask: torch.Tensor,
    token_owners: torch.Tensor,
    num_rollouts: int,
) -> torch.Tensor:
    """``(N,)`` float64: each rollout's mean of ``exp(|generation - trainer logprob|)`` over its
    uniquely owned generated tokens (``loss_mask``), NaN for a rollout with none.

    All token tensors share one shape (padded ``(R, L)`` or packed ``(N_tokens,)``);
    ``token_owners`` is the owner index per token, -1 on padding (``TrainingBatch.token_owners``).
    ``trainer_logprobs[t]`` is the trainer's logprob of token ``t``. Tokens whose generation
    logprob is ``-inf`` (filtered by top-k/top-p) are left out.
    """
    shapes = {
        tuple(t.shape) for t in (generation_logprobs, trainer_logprobs, loss_mask, token_owners)
    }
    if len(shapes) != 1:
        raise AdvantageError(
            "token_shape", f"token tensors must share one shape, got {sorted(shapes)}"
        )
    counted = loss_mask.bool() & (token_owners >= 0) & torch.isfinite(generation_logprobs)
    owners = token_owners[counted]
    errors = torch.exp(
        (generation_logprobs[counted].double() - trainer_logprobs[counted].double()).abs()
    )
    sums = torch.zeros(num_rollouts, dtype=torch.float64).index_add_(0, owners, errors)
    counts = torch.zeros(num_rollouts, dtype=torch.float64).index_add_(
        0, owners, torch.ones_like(errors)
    )
    return sums / counts


def _group_normalized(
    rewards: torch.Tensor, voting: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """``(G,)``: ``(r - mean) / (std + epsilon)`` with the participants' mean and std."""
    participants = rewards[voting]
    baseline = participants.mean()
    std = participants.std() if participants.numel() > 1 else torch.zeros((), dtype=torch.float64)
    normalized = rewards - baseline
    if config.normalize_std:
        normalized = normalized / (std + config.epsilon)
    return normalized


def _leave_one_out(
    rewards: torch.Tensor, voting: torch.Tensor, config: AdvantageConfig
) -> torch.Tensor:
    """``(G,)``: each participant's reward against the mean (and std) of the other participants;
    0 for a lone participant and for rollouts that do not vote (they never train)."""
    participants = rewards[voting]  # (n,)
    count = participants.numel()
    normalized = torch.zeros_like(rewards)
    if count < 2:
        return normalized
    others = 1.0 - torch.eye(count, dtype=torch.float64)  # (n, n): row i leaves out i
    baseline = (others @ participants) / (count - 1)  # (n,)
    centered = participants - baseline
    if config.normalize_std and count > 2:
        spread = (participants[None, :] - baseline[:, None]) * others  # (n, n)
        std = (spread.square().sum(dim=1) / (count - 2)).sqrt()  # (n,), unbiased over n - 1
        centered = torch.where(std > 0, centered / (std + config.epsilon), centered)
    normalized[voting] = centered
    return normalized


def _filter(outcome: RolloutOutcome, config: AdvantageConfig) -> RolloutFilter | None:
    if outcome.env_masked:
        return RolloutFilter.ENVIRONMENT
    if config.overlong_filtering and outcome.truncated:
        return RolloutFilter.OVERLONG
    threshold = config.seq_logprob_error_threshold
    error = outcome.logprob_error
    if threshold is not None and error is not None and error > threshold:
        return RolloutFilter.LOGPROB_ERROR
    return None


def _groups(outcomes: Sequence[RolloutOutcome]) -> list[tuple[str, list[RolloutOutcome]]]:
    grouped: dict[str, list[RolloutOutcome]] = {}
    for outcome in outcomes:
        grouped.setdefault(outcome.group_id, []).append(outcome)
    return list(grouped.items())
