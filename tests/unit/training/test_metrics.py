"""Length and step metrics: one observation per logical rollout, never per row."""

from __future__ import annotations

import pytest

from grove.training.advantages import (
    AdvantageConfig,
    RolloutOutcome,
    compute_advantages,
    group_decisions,
)
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import AdvantageError
from grove.training.forest import CallRecord, build_forest
from grove.training.metrics import (
    DROPPED_PROMPT_GROUPS,
    GEN_TOKENS_PER_SAMPLE,
    LOGICAL_ADVANTAGES_MEAN,
    LOGICAL_ADVANTAGES_SUM,
    MASKED_ROLLOUTS,
    MASKED_ROWS,
    MAX_GEN_TOKENS_PER_TURN,
    MEDIA_INVALID_ROLLOUTS,
    NUM_MASK_SAMPLE_FILTERED,
    OPTIMIZER_STEPS,
    PADDING_ROWS,
    ROWS,
    ROWS_PER_ROLLOUT,
    SCHEDULER_STEP_INCREMENT,
    SELECTION_NOT_CLOSED_ROLLOUTS,
    TOTAL_TOKENS_PER_SAMPLE,
    RolloutLengths,
    length_metrics,
    rollout_lengths,
    step_metrics,
)
from grove.training.rows import rollout_rows


def compaction_calls() -> list[CallRecord]:
    """docs/forest.md's walkthrough: c3 is a rewrite root, c4 rejected, c5 the accepted retry."""
    return [
        CallRecord("c1", None, [1, 2, 3], [10, 11], [-0.1, -0.2]),
        CallRecord("c2", "c1", [4, 5], [12, 13], [-0.3, -0.4]),
        CallRecord("c3", None, [1, 2, 30, 31], [14], [-0.5]),
        CallRecord("c4", "c3", [6], [15, 16, 17], [-0.6, -0.7, -0.8]),
        CallRecord("c5", "c3", [6], [17, 18], [-0.9, -1.0]),
    ]


def test_rollout_lengths_count_owned_generations_and_the_longest_chain() -> None:
    lengths = rollout_lengths(build_forest(compaction_calls(), ["c1", "c2", "c3", "c5"]))

    # owned: A1 2 + A2 2 + A3 1 + A5 2 = 7; rows of 9 and 8 tokens; rejected c4 never counts
    assert lengths == RolloutLengths(
        gen_tokens=7, max_gen_tokens_per_turn=2, total_tokens=9, rows=2
    )


def test_shared_ancestor_generation_counts_once() -> None:
    lengths = rollout_lengths(build_forest(compaction_calls(), ["c3", "c4", "c5"]))

    # A3 1 + A4 3 + A5 2 = 6, although A3 appears in both rows
    assert lengths == RolloutLengths(
        gen_tokens=6, max_gen_tokens_per_turn=3, total_tokens=9, rows=2
    )


def test_masked_rollout_contributes_zero_lengths() -> None:
    assert rollout_lengths(build_forest(compaction_calls(), ["c2"])) == RolloutLengths(0, 0, 0, 0)


def test_length_metrics_average_over_rollouts() -> None:
    metrics = length_metrics(
        [RolloutLengths(7, 2, 9, 2), RolloutLengths(3, 3, 5, 1), RolloutLengths(0, 0, 0, 0)]
    )

    assert metrics == {
        GEN_TOKENS_PER_SAMPLE: pytest.approx(10 / 3),
        MAX_GEN_TOKENS_PER_TURN: 3.0,
        TOTAL_TOKENS_PER_SAMPLE: pytest.approx(14 / 3),
        ROWS_PER_ROLLOUT: 1.5,
    }


def test_length_metrics_of_no_rollouts_are_zero() -> None:
    assert set(length_metrics([]).values()) == {0.0}


def test_step_metrics_count_logical_rollouts_rows_and_decisions() -> None:
    calls = compaction_calls()
    trainable = build_forest(calls, ["c1", "c2", "c3", "c5"])
    single = build_forest(calls, ["c3", "c5"])
    open_selection = build_forest(calls, ["c2"])
    outcomes = [
        RolloutOutcome.from_forest("r0", "g0", 1.0, trainable),
        RolloutOutcome.from_forest("r1", "g0", 0.0, single, env_masked=True),
        RolloutOutcome.from_forest("r2", "g0", 0.0, open_selection),
        RolloutOutcome.from_forest("r3", "g1", 1.0, open_selection),
    ]
    decisions = group_decisions(outcomes)
    kept = [o for o in outcomes if o.group_id == "g0"]
    rows = {"r0": rollout_rows(trainable), "r1": rollout_rows(single), "r2": []}
    batch = assemble_batch(
        [LogicalRollout(o.rollout_id, o.group_id, tuple(rows[o.rollout_id])) for o in kept],
        row_multiple=4,
    )
    advantages = compute_advantages(kept, AdvantageConfig(normalize_std=False))

    metrics = step_metrics(
        outcomes=outcomes, decisions=decisions, advantages=advantages, batch=batch
    )

    assert metrics == {
        SELECTION_NOT_CLOSED_ROLLOUTS: 2.0,
        MASKED_ROLLOUTS: 2.0,
        MEDIA_INVALID_ROLLOUTS: 0.0,
        DROPPED_PROMPT_GROUPS: 1.0,
        "dropped_prompt_groups/no_valid_layout": 1.0,  # the same group, by its reason
        NUM_MASK_SAMPLE_FILTERED: 1.0,
        MASKED_ROWS: 1.0,  # r1's one row, excluded by its rollout's environment flag
        ROWS: 3.0,
        PADDING_ROWS: 1.0,
        SCHEDULER_STEP_INCREMENT: 3.0,  # three logical rollouts, although there are four rows
        OPTIMIZER_STEPS: 1.0,
        LOGICAL_ADVANTAGES_MEAN: 0.0,  # r0 alone in the baseline: 1 - 1 = 0
        LOGICAL_ADVANTAGES_SUM: 0.0,
    }


def test_step_metrics_reject_advantages_of_other_rollouts() -> None:
    forest = build_forest(compaction_calls(), ["c1", "c2"])
    batch = assemble_batch(
        [LogicalRollout("r0", "g0", tuple(rollout_rows(forest)))], row_multiple=1
    )
    advantages = compute_advantages([RolloutOutcome("r9", "g0", 1.0)], AdvantageConfig())

    with pytest.raises(AdvantageError, match="rollout_order"):
        step_metrics(outcomes=[], decisions=[], advantages=advantages, batch=batch)
