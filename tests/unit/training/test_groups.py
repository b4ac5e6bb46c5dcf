"""The group rules (``grove.training.groups``): which complete prompt groups a step may take."""

from __future__ import annotations

import pytest

from grove.training.advantages import RolloutOutcome
from grove.training.errors import AdvantageError
from grove.training.groups import (
    DropReason,
    GroupMember,
    GroupRules,
    abandonment_policy,
    abandonment_reason,
    decide_group,
)


def member(
    index: int,
    *,
    masked: bool = False,
    versions: tuple[int, ...] = (),
    abandoned: DropReason | None = None,
) -> GroupMember:
    outcome = RolloutOutcome(
        f"g-r{index}", "g", 1.0, masked_reason="capture_failed" if masked else None
    )
    return GroupMember(outcome, abandoned, () if masked else versions)


def reason(members: list[GroupMember], step: int | None = None, **rules: object) -> str | None:
    decision = decide_group("g", members, GroupRules(**rules), step)  # type: ignore[arg-type]
    assert decision.kept == (decision.reason is None)
    return decision.reason


def test_an_abandoned_rollout_drops_its_group_before_any_other_rule() -> None:
    members = [member(0, masked=True, abandoned=DropReason.ROLLOUT_TIMEOUT), member(1)]

    assert reason(members, min_valid_fraction=1.0) == "rollout_timeout"
    decision = decide_group("g", members, GroupRules())
    assert decision.detail == "rollout g-r0 abandoned"


def test_a_group_with_no_verified_rollout_has_no_valid_layout() -> None:
    assert reason([member(0, masked=True), member(1, masked=True)]) == "no_valid_layout"


def test_a_group_below_the_min_valid_fraction_is_dropped_and_one_at_it_is_kept() -> None:
    half = [member(0, masked=True), member(1)]

    assert reason(half, min_valid_fraction=0.75) == "below_min_valid_fraction"
    assert reason(half, min_valid_fraction=0.5) is None
    assert reason(half) is None


def test_calls_further_apart_than_max_policy_lag_drop_the_group() -> None:
    spread = [member(0, versions=(3,)), member(1, versions=(4, 5))]

    assert reason(spread, max_policy_lag=1) == "policy_lag_exceeded"  # 5 - 3 = 2 > 1
    assert reason(spread, max_policy_lag=2) is None
    assert reason(spread) is None  # no lag rule
    detail = decide_group("g", spread, GroupRules(max_policy_lag=1)).detail
    assert (
        detail
        == "its calls were sampled by policy versions 3 to 5, more than max_policy_lag 1 apart"
    )


def test_a_group_older_than_the_step_by_more_than_the_lag_is_dropped_at_that_step() -> None:
    old = [member(0, versions=(3,)), member(1, versions=(3,))]

    assert reason(old, step=3, max_policy_lag=0) is None
    assert reason(old, step=4, max_policy_lag=0) == "policy_lag_exceeded"
    assert reason(old, step=4, max_policy_lag=1) is None
    assert reason(old, step=None, max_policy_lag=0) is None  # the step's rule left out


def test_calls_of_unknown_policy_version_and_masked_rollouts_constrain_nothing() -> None:
    # a masked rollout trains no call; a rollout whose calls record no version has none
    members = [member(0, versions=(7,)), member(1, masked=True, versions=(0,)), member(2)]

    assert reason(members, step=7, max_policy_lag=0) is None


def test_an_abandonment_is_a_selection_of_no_call_without_result_named_for_its_reason() -> None:
    policy = abandonment_policy(DropReason.HARNESS_FAILED)

    assert policy == "abandoned:harness_failed"
    assert abandonment_reason(policy, (), None) == DropReason.HARNESS_FAILED
    assert abandonment_reason(policy, ("c0",), None) is None  # a harness's own selection
    assert abandonment_reason(policy, (), {"reward": 0.0}) is None
    assert abandonment_reason("returned_history", (), None) is None
    with pytest.raises(AdvantageError, match="abandoned for"):
        abandonment_policy(DropReason.NO_VALID_LAYOUT)
