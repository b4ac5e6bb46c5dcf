"""Step metrics: one observation per logical rollout, never per row (``docs/metrics.md``).

Length metrics, per verified rollout:

- ``gen_tokens_per_sample``: uniquely owned generated tokens summed over the rollout's rows;
- ``max_gen_tokens_per_turn``: its largest single model generation;
- ``total_tokens_per_sample``: its longest context chain (longest row).

Rewritten input, shared-prefix copies and execution padding never count as generated output.
A masked (unverifiable) rollout contributes zeros; environment or error filtering does not erase
verified generations. These are generation statistics before learner-side filtering.

Step counters: ``finalize/selection_not_closed_rollouts`` (rollouts masked because a selected
continuation's parent was left out), ``finalize/masked_rollouts`` (every mask reason),
``dropped_prompt_groups`` and ``dropped_prompt_groups/<reason>`` (the prompt groups dropped for
the step, whose rollouts are not in its batch, in all and by reason),
``num_mask_sample_filtered`` (rollouts the environment flagged, once each),
``forest/masked_rows`` (real rows excluded by a rollout decision), ``forest/rows``,
``forest/padding_rows``, ``forest/rows_per_rollout`` (mean over rollouts with rows),
``scheduler_step_increment`` (logical rollouts in the step — the schedule never advances by
rows), ``optimizer_steps`` (1), and ``forest/logical_advantages/mean`` and ``/sum`` (over logical
rollouts; kept apart from token-grid advantage statistics, which are taken over rows). Which
failure and drop cases each counter counts: ``docs/forest.md``, "Failures and drops".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from grove.training.advantages import (
    GroupDecision,
    LogicalAdvantages,
    RolloutFilter,
    RolloutOutcome,
)
from grove.training.batch import TrainingBatch
from grove.training.errors import AdvantageError
from grove.training.forest import Forest, MaskReason

__all__ = [
    "DROPPED_PROMPT_GROUPS",
    "GEN_TOKENS_PER_SAMPLE",
    "LOGICAL_ADVANTAGES_MEAN",
    "LOGICAL_ADVANTAGES_SUM",
    "MASKED_ROLLOUTS",
    "MASKED_ROWS",
    "MAX_GEN_TOKENS_PER_TURN",
    "MEDIA_INVALID_ROLLOUTS",
    "NUM_MASK_SAMPLE_FILTERED",
    "OPTIMIZER_STEPS",
    "PADDING_ROWS",
    "ROWS",
    "ROWS_PER_ROLLOUT",
    "SCHEDULER_STEP_INCREMENT",
    "SELECTION_NOT_CLOSED_ROLLOUTS",
    "TOTAL_TOKENS_PER_SAMPLE",
    "RolloutLengths",
    "length_metrics",
    "rollout_lengths",
    "step_metrics",
]

GEN_TOKENS_PER_SAMPLE: Final = "gen_tokens_per_sample"
MAX_GEN_TOKENS_PER_TURN: Final = "max_gen_tokens_per_turn"
TOTAL_TOKENS_PER_SAMPLE: Final = "total_tokens_per_sample"
SELECTION_NOT_CLOSED_ROLLOUTS: Final = "finalize/selection_not_closed_rollouts"
MASKED_ROLLOUTS: Final = "finalize/masked_rollouts"
MEDIA_INVALID_ROLLOUTS: Final = "finalize/media_invalid_rollouts"
"""Rollouts masked because an image broke the trained model's media rules (``media_invalid``)."""
DROPPED_PROMPT_GROUPS: Final = "dropped_prompt_groups"
_DROPPED_BY_REASON: Final = "dropped_prompt_groups/{reason}"
NUM_MASK_SAMPLE_FILTERED: Final = "num_mask_sample_filtered"
MASKED_ROWS: Final = "forest/masked_rows"
ROWS: Final = "forest/rows"
PADDING_ROWS: Final = "forest/padding_rows"
ROWS_PER_ROLLOUT: Final = "forest/rows_per_rollout"
SCHEDULER_STEP_INCREMENT: Final = "scheduler_step_increment"
OPTIMIZER_STEPS: Final = "optimizer_steps"
LOGICAL_ADVANTAGES_MEAN: Final = "forest/logical_advantages/mean"
LOGICAL_ADVANTAGES_SUM: Final = "forest/logical_advantages/sum"


@dataclass(frozen=True)
class RolloutLengths:
    """One rollout's length observation (all zero for a masked rollout)."""

    gen_tokens: int
    max_gen_tokens_per_turn: int
    total_tokens: int
    rows: int


def rollout_lengths(forest: Forest) -> RolloutLengths:
    """The rollout's owned generated tokens, largest generation, longest row and row count."""
    generations = [
        segment.end - segment.generated_start for row in forest.rows for segment in row.segments
    ]
    return RolloutLengths(
        gen_tokens=sum(sum(row.loss_mask) for row in forest.rows),
        max_gen_tokens_per_turn=max(generations, default=0),
        total_tokens=max((len(row.token_ids) for row in forest.rows), default=0),
        rows=len(forest.rows),
    )


def length_metrics(lengths: Sequence[RolloutLengths]) -> dict[str, float]:
    """Means over rollouts (``gen_tokens_per_sample``, ``total_tokens_per_sample``, rows per
    rollout with rows) and the largest single generation (``max_gen_tokens_per_turn``)."""
    count = len(lengths)
    with_rows = [length.rows for length in lengths if length.rows]
    return {
        GEN_TOKENS_PER_SAMPLE: sum(length.gen_tokens for length in lengths) / count
        if count
        else 0.0,
        MAX_GEN_TOKENS_PER_TURN: float(
            max((length.max_gen_tokens_per_turn for length in lengths), default=0)
        ),
        TOTAL_TOKENS_PER_SAMPLE: (
            sum(length.total_tokens for length in lengths) / count if count else 0.0
        ),
        ROWS_PER_ROLLOUT: sum(with_rows) / len(with_rows) if with_rows else 0.0,
    }


def step_metrics(
    *,
    outcomes: Sequence[RolloutOutcome],
    decisions: Sequence[GroupDecision],
    advantages: LogicalAdvantages,
    batch: TrainingBatch,
) -> dict[str, float]:
    """Counters of one optimizer step.

    ``outcomes``, ``advantages`` and ``batch`` are those of the step's batch (its kept groups);
    ``decisions`` every group decision of the step: the batch's groups and the dropped ones.
    """
    if advantages.rollout_ids != batch.rollout_ids:
        raise AdvantageError(
            "rollout_order", "advantages and batch must list the same logical rollouts in order"
        )
    trained_rows = advantages.trained[batch.parent_indices.clamp(min=0)]
    real_rows = batch.parent_indices >= 0
    by_reason: dict[str, float] = {}
    for decision in decisions:
        if not decision.kept:
            name = _DROPPED_BY_REASON.format(reason=decision.reason)
            by_reason[name] = by_reason.get(name, 0.0) + 1.0
    return {
        SELECTION_NOT_CLOSED_ROLLOUTS: float(
            sum(o.masked_reason == MaskReason.SELECTION_NOT_CLOSED for o in outcomes)
        ),
        MASKED_ROLLOUTS: float(sum(o.masked_reason is not None for o in outcomes)),
        MEDIA_INVALID_ROLLOUTS: float(
            sum(o.masked_reason == MaskReason.MEDIA_INVALID for o in outcomes)
        ),
        DROPPED_PROMPT_GROUPS: float(sum(not decision.kept for decision in decisions)),
        **by_reason,
        NUM_MASK_SAMPLE_FILTERED: float(
            sum(f == RolloutFilter.ENVIRONMENT for f in advantages.filters)
        ),
        MASKED_ROWS: float((real_rows & ~trained_rows).sum()),
        ROWS: float(real_rows.sum()),
        PADDING_ROWS: float(batch.num_padding_rows),
        SCHEDULER_STEP_INCREMENT: float(batch.num_rollouts),
        OPTIMIZER_STEPS: 1.0,
        LOGICAL_ADVANTAGES_MEAN: float(advantages.advantages.mean()),
        LOGICAL_ADVANTAGES_SUM: float(advantages.advantages.sum()),
    }
