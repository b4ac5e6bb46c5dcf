"""GRPO advantages per logical rollout: normalization, filters, baselines, broadcast, errors."""

from __future__ import annotations

import math

import pytest
import torch

from grove.training.advantages import (
    AdvantageConfig,
    MaskedRewardPolicy,
    RolloutFilter,
    RolloutOutcome,
    broadcast_to_rows,
    compute_advantages,
    group_decisions,
    pooled_logprob_error,
)
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import AdvantageError
from grove.training.forest import CallRecord, MaskReason, build_forest
from grove.training.rows import rollout_rows

PLAIN = AdvantageConfig(epsilon=1e-12)


def outcome(rollout_id: str, reward: float, group: str = "g", **fields: object) -> RolloutOutcome:
    return RolloutOutcome(rollout_id=rollout_id, group_id=group, reward=reward, **fields)  # type: ignore[arg-type]


def values(outcomes: list[RolloutOutcome], config: AdvantageConfig = PLAIN) -> list[float]:
    return compute_advantages(outcomes, config).advantages.tolist()


def test_group_normalization_uses_mean_and_sample_std() -> None:
    # rewards 1, 0, 1, 0: mean 0.5, unbiased std sqrt(1/3) = 0.57735; 0.5 / 0.57735 = 0.866025
    got = values([outcome("a", 1), outcome("b", 0), outcome("c", 1), outcome("d", 0)])

    assert got == pytest.approx([0.866025, -0.866025, 0.866025, -0.866025], abs=1e-6)


def test_groups_are_normalized_separately() -> None:
    got = values(
        [outcome("a", 1, "g0"), outcome("b", 0, "g0"), outcome("c", 5, "g1"), outcome("d", 5, "g1")]
    )

    # g0: +-(0.5 / 0.707107) = +-0.707107; g1: equal rewards give 0
    assert got == pytest.approx([0.707107, -0.707107, 0.0, 0.0], abs=1e-6)


def test_single_rollout_group_has_zero_advantage() -> None:
    assert values([outcome("a", 3.0)]) == [0.0]


def test_without_std_normalization_advantage_is_reward_minus_mean() -> None:
    got = values([outcome("a", 3), outcome("b", 1)], AdvantageConfig(normalize_std=False))

    assert got == [1.0, -1.0]


def test_masked_rollout_is_out_of_the_baseline_and_gets_zero() -> None:
    outcomes = [
        outcome("a", 1),
        outcome("b", 0),
        outcome("c", 100, masked_reason=MaskReason.SELECTION_NOT_CLOSED),
    ]

    result = compute_advantages(outcomes, PLAIN)

    assert result.advantages.tolist() == pytest.approx([0.707107, -0.707107, 0.0], abs=1e-6)
    assert result.trained.tolist() == [True, True, False]
    assert result.in_baseline.tolist() == [True, True, False]
    assert result.filters == (None, None, None)


RLOO = AdvantageConfig(leave_one_out_baseline=True, normalize_std=False)


def test_leave_one_out_baseline_is_the_mean_of_the_other_rewards() -> None:
    # rewards 1, 0, 0, 1: a's others are 0, 0, 1 -> baseline 1/3; b's are 1, 0, 1 -> 2/3.
    # Baselines [1/3, 2/3, 2/3, 1/3]; advantages [2/3, -2/3, -2/3, 2/3].
    got = values([outcome("a", 1), outcome("b", 0), outcome("c", 0), outcome("d", 1)], RLOO)

    assert got == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3], abs=1e-7)


def test_leave_one_out_changes_the_advantages_of_the_same_group() -> None:
    group = [outcome("a", 1), outcome("b", 0), outcome("c", 0), outcome("d", 1)]
    # the default baseline is the mean 0.5 over all four: advantages +-0.5; RLOO gives +-2/3
    # (n / (n - 1) times as large).
    default = values(group, AdvantageConfig(normalize_std=False))

    assert default == [0.5, -0.5, -0.5, 0.5]
    assert values(group, RLOO) != pytest.approx(default)


def test_leave_one_out_with_std_divides_by_the_deviation_of_the_others() -> None:
    # a (1): others 0, 0, 1, mean 1/3, unbiased variance ((1/3)^2 * 2 + (2/3)^2) / 2 = 1/3,
    # std 1/sqrt(3); (1 - 1/3) / (1/sqrt(3)) = 2/sqrt(3) = 1.154701. b (0): others 1, 0, 1, mean
    # 2/3, variance 1/3: (0 - 2/3) * sqrt(3) = -1.154701. The group std would give 0.866025.
    config = AdvantageConfig(leave_one_out_baseline=True, epsilon=1e-12)

    got = values([outcome("a", 1), outcome("b", 0), outcome("c", 0), outcome("d", 1)], config)

    assert got == pytest.approx([1.154701, -1.154701, -1.154701, 1.154701], abs=1e-6)


def test_leave_one_out_skips_the_std_when_the_others_do_not_vary() -> None:
    # two participants: each has one other reward, whose deviation is 0, so the advantage stays
    # r - b: a: 1 - 0 = 1, b: 0 - 1 = -1 (never (r - b) / epsilon).
    config = AdvantageConfig(leave_one_out_baseline=True)

    assert values([outcome("a", 1), outcome("b", 0)], config) == [1.0, -1.0]


def test_leave_one_out_group_with_one_participant_has_zero_advantage() -> None:
    masked = outcome("b", 0, masked_reason=MaskReason.SELECTION_NOT_CLOSED)
    config = AdvantageConfig(leave_one_out_baseline=True)

    assert values([outcome("a", 3.0)], config) == [0.0]
    result = compute_advantages([outcome("a", 3.0), masked], config)
    assert result.advantages.tolist() == [0.0, 0.0]
    assert result.trained.tolist() == [True, False]


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        # exclude: participants a (1), b (0): a's baseline 0 -> 1; b's baseline 1 -> -1
        (MaskedRewardPolicy.EXCLUDE, [1.0, -1.0, 0.0]),
        # include: c (0.5) votes once but trains nothing: a's baseline (0 + 0.5) / 2 = 0.25 ->
        # 0.75; b's (1 + 0.5) / 2 = 0.75 -> -0.75; c gets 0
        (MaskedRewardPolicy.INCLUDE, [0.75, -0.75, 0.0]),
    ],
)
def test_leave_one_out_counts_a_filtered_reward_once_under_include(
    policy: MaskedRewardPolicy, expected: list[float]
) -> None:
    config = AdvantageConfig(
        leave_one_out_baseline=True, normalize_std=False, masked_reward_policy=policy
    )
    outcomes = [outcome("a", 1), outcome("b", 0), outcome("c", 0.5, env_masked=True)]

    result = compute_advantages(outcomes, config)

    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-7)
    assert result.trained.tolist() == [True, True, False]


def test_clip_bounds_each_trained_advantage() -> None:
    config = AdvantageConfig(advantage_clip_low=-0.5, advantage_clip_high=0.25, epsilon=1e-12)

    assert values([outcome("a", 1), outcome("b", 0)], config) == [0.25, -0.5]


def test_filtered_owner_keeps_zero_even_when_zero_is_outside_the_clip_interval() -> None:
    config = AdvantageConfig(advantage_clip_low=0.5, advantage_clip_high=2.0, epsilon=1e-12)
    outcomes = [outcome("a", 1), outcome("b", 0), outcome("c", 1, env_masked=True)]

    assert values(outcomes, config) == [pytest.approx(0.707107, abs=1e-6), 0.5, 0.0]


@pytest.mark.parametrize(
    ("policy", "expected", "in_baseline"),
    [
        # exclude: baseline over a, b, c: mean 2/3, std sqrt(1/3); a: (1/3) / 0.57735 = 0.57735
        (MaskedRewardPolicy.EXCLUDE, [0.57735, -1.154701, 0.57735, 0.0], [True, True, True, False]),
        # include: baseline over a, b, c, d once: mean 0.75, std 0.5; a: 0.25 / 0.5 = 0.5
        (MaskedRewardPolicy.INCLUDE, [0.5, -1.5, 0.5, 0.0], [True, True, True, True]),
    ],
)
def test_masked_reward_policy_decides_whether_a_filtered_reward_stays_in_the_baseline(
    policy: MaskedRewardPolicy, expected: list[float], in_baseline: list[bool]
) -> None:
    outcomes = [outcome("a", 1), outcome("b", 0), outcome("c", 1), outcome("d", 1, env_masked=True)]

    result = compute_advantages(outcomes, AdvantageConfig(masked_reward_policy=policy))

    assert result.advantages.tolist() == pytest.approx(expected, abs=1e-5)
    assert result.in_baseline.tolist() == in_baseline
    assert result.trained.tolist() == [True, True, True, False]
    assert result.filters[3] == RolloutFilter.ENVIRONMENT


def test_truncated_rollout_is_filtered_only_with_overlong_filtering() -> None:
    outcomes = [outcome("a", 1), outcome("b", 0, truncated=True)]

    assert compute_advantages(outcomes, PLAIN).trained.tolist() == [True, True]
    filtered = compute_advantages(outcomes, AdvantageConfig(overlong_filtering=True))
    assert filtered.trained.tolist() == [True, False]
    assert filtered.filters == (None, RolloutFilter.OVERLONG)


def test_logprob_error_above_threshold_filters_the_rollout() -> None:
    config = AdvantageConfig(seq_logprob_error_threshold=1.05)
    outcomes = [
        outcome("a", 1, logprob_error=1.04),
        outcome("b", 0, logprob_error=1.06),
        outcome("c", 0, logprob_error=math.nan),
    ]

    result = compute_advantages(outcomes, config)

    assert result.filters == (None, RolloutFilter.LOGPROB_ERROR, None)
    assert result.trained.tolist() == [True, False, True]


def test_duplicate_rollouts_and_non_finite_rewards_raise() -> None:
    with pytest.raises(AdvantageError, match="duplicate_rollout"):
        compute_advantages([outcome("a", 1), outcome("a", 0)], PLAIN)
    with pytest.raises(AdvantageError, match="reward"):
        compute_advantages([outcome("a", math.inf)], PLAIN)


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"advantage_clip_low": 1.0, "advantage_clip_high": 0.0}, "clip_interval"),
        ({"masked_reward_policy": "keep"}, "masked_reward_policy"),
        ({"min_valid_fraction_per_group": 0.0}, "min_valid_fraction"),
        ({"min_valid_fraction_per_group": 1.5}, "min_valid_fraction"),
        ({"seq_logprob_error_threshold": 0.9}, "logprob_error_threshold"),
        ({"epsilon": 0.0}, "epsilon"),
    ],
)
def test_invalid_advantage_settings_raise(fields: dict[str, object], rule: str) -> None:
    with pytest.raises(AdvantageError, match=rule):
        AdvantageConfig(**fields)  # type: ignore[arg-type]


# --- groups --------------------------------------------------------------------------------------


def test_group_without_verified_rollout_is_dropped_as_no_valid_layout() -> None:
    masked = MaskReason.SELECTED_CALL_FAILED
    outcomes = [outcome("a", 1, "g0"), outcome("b", 0, "g1", masked_reason=masked)]

    decisions = group_decisions(outcomes)

    assert [(d.group_id, d.kept, d.reason) for d in decisions] == [
        ("g0", True, None),
        ("g1", False, "no_valid_layout"),
    ]


def test_group_below_min_valid_fraction_is_dropped() -> None:
    masked = MaskReason.CAPTURE_PENDING
    outcomes = [
        outcome("a", 1),
        outcome("b", 0, masked_reason=masked),
        outcome("c", 0, masked_reason=masked),
    ]

    (low,) = group_decisions(outcomes, min_valid_fraction=0.5)
    (enough,) = group_decisions(outcomes, min_valid_fraction=1 / 3)

    assert (low.kept, low.reason, low.verified_rollouts, low.rollouts) == (
        False,
        "below_min_valid_fraction",
        1,
        3,
    )
    assert enough.kept is True


def test_outcome_from_forest_takes_mask_and_truncation() -> None:
    calls = [
        CallRecord("a", None, [1], [2], [-1.0], finish_reason="length"),
        CallRecord("b", "a", [3], [4], [-1.0]),
    ]

    trainable = RolloutOutcome.from_forest("r", "g", 1.0, build_forest(calls, ["a", "b"]))
    masked = RolloutOutcome.from_forest("r", "g", 1.0, build_forest(calls, ["b"]))
    captured = RolloutOutcome.from_forest(
        "r", "g", 1.0, build_forest(calls, ["b"]), masked_reason=MaskReason.CAPTURE_PENDING
    )

    assert (trainable.verified, trainable.truncated) == (True, True)
    assert masked.masked_reason == MaskReason.SELECTION_NOT_CLOSED
    assert captured.masked_reason == MaskReason.CAPTURE_PENDING


# --- broadcast -----------------------------------------------------------------------------------


def multi_row_rollout(rollout_id: str, group: str, rows: int) -> LogicalRollout:
    calls = [CallRecord(f"{rollout_id}.{i}", None, [1], [2, 3], [-1.0, -1.0]) for i in range(rows)]
    forest = build_forest(calls, [c.call_id for c in calls])
    return LogicalRollout(rollout_id, group, tuple(rollout_rows(forest)))


def test_each_row_gets_its_own_rollouts_advantage_across_rollouts_and_groups() -> None:
    rollouts = [
        multi_row_rollout("a", "g0", 2),
        multi_row_rollout("b", "g0", 1),
        multi_row_rollout("c", "g0", 3),
        multi_row_rollout("d", "g1", 1),
        multi_row_rollout("e", "g1", 2),
    ]
    batch = assemble_batch(rollouts, row_multiple=4)
    rewards = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 0.0, "e": 1.0}
    logical = compute_advantages(
        [outcome(r.rollout_id, rewards[r.rollout_id], r.group_id) for r in rollouts],
        AdvantageConfig(normalize_std=False),
    )

    per_row = broadcast_to_rows(logical.advantages, batch.parent_indices)

    # g0 mean 2: a +1, b -1, c 0; g1 mean 0.5: d -0.5, e +0.5; padding rows 0
    assert batch.parent_indices.tolist() == [0, 0, 1, 2, 2, 2, -1, -1, 3, 4, 4, -1]
    assert per_row.tolist() == [1.0, 1.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.5, 0.5, 0.5, 0.0]


def test_broadcast_of_flags_gives_padding_false() -> None:
    flags = torch.tensor([True, False])

    assert broadcast_to_rows(flags, torch.tensor([1, 0, -1])).tolist() == [False, True, False]


def test_broadcast_rejects_out_of_range_parents_and_bad_shapes() -> None:
    with pytest.raises(AdvantageError, match=r"parent_index.*\[-1, 2\)"):
        broadcast_to_rows(torch.zeros(2), torch.tensor([0, 2]))
    with pytest.raises(AdvantageError, match="parent_index"):
        broadcast_to_rows(torch.zeros(2), torch.tensor([-2]))
    with pytest.raises(AdvantageError, match="broadcast_shape"):
        broadcast_to_rows(torch.zeros(2, 1), torch.tensor([0]))


# --- pooled logprob error -------------------------------------------------------------------------


def test_pooled_error_is_the_mean_multiplicative_error_over_owned_tokens() -> None:
    generation = torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, 0.0]])
    trainer = torch.tensor([[0.0, -1.5, -2.0], [0.0, -0.5, 0.0]])
    mask = torch.tensor([[False, True, True], [False, True, False]])
    owners = torch.tensor([[0, 0, 0], [1, 1, -1]])

    error = pooled_logprob_error(generation, trainer, mask, owners, num_rollouts=3)

    # rollout 0: (e^0.5 + e^0) / 2; rollout 1: e^0.5; rollout 2 owns no token
    assert error[0].item() == pytest.approx((math.exp(0.5) + 1) / 2)
    assert error[1].item() == pytest.approx(math.exp(0.5))
    assert math.isnan(error[2].item())


def test_pooled_error_does_not_change_when_generations_split_into_more_rows() -> None:
    one_row = pooled_logprob_error(
        torch.tensor([[-1.0, -2.0, -3.0, -4.0]]),
        torch.tensor([[-1.1, -2.5, -3.0, -3.0]]),
        torch.ones(1, 4, dtype=torch.bool),
        torch.zeros(1, 4, dtype=torch.int64),
        num_rollouts=1,
    )
    two_rows = pooled_logprob_error(
        torch.tensor([[-1.0, 0.0, 0.0], [-2.0, -3.0, -4.0]]),
        torch.tensor([[-1.1, 0.0, 0.0], [-2.5, -3.0, -3.0]]),
        torch.tensor([[True, False, False], [True, True, True]]),
        torch.zeros(2, 3, dtype=torch.int64),
        num_rollouts=1,
    )

    assert two_rows.item() == pytest.approx(one_row.item(), abs=1e-12)


def test_pooled_error_skips_negative_infinity_generation_tokens_and_padding() -> None:
    error = pooled_logprob_error(
        torch.tensor([-1.0, -math.inf, -1.0]),
        torch.tensor([-1.0, -3.0, -9.0]),
        torch.tensor([True, True, True]),
        torch.tensor([0, 0, -1]),
        num_rollouts=1,
    )

    assert error.tolist() == [1.0]


def test_pooled_error_rejects_mismatched_shapes() -> None:
    with pytest.raises(AdvantageError, match="token_shape"):
        pooled_logprob_error(torch.zeros(3), torch.zeros(2), torch.ones(3), torch.zeros(3), 1)
