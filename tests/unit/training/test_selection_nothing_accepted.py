"""An attempt with no accepted generation (a first-call failure) selects nothing, and masks."""

from __future__ import annotations

from typing import Any

import pytest

from grove.training.errors import SelectionError
from grove.training.forest import MaskReason
from grove.training.selection import (
    REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES,
    PolicyRegistry,
    RolloutSelection,
    all_captured,
    select_rollout,
)

from .test_selection import committed, failed, pending, rejected, say

# The history a harness returns when its first call failed: observations only.
NOTHING_GENERATED = {"reward": 0.0, "output": [{"role": "user", "content": "Count the apples."}]}


def test_an_attempt_whose_first_call_failed_selects_no_call_and_masks_capture_failed() -> None:
    selection = select_rollout("returned_history", [failed("c1", None)], {"reward": 0.0})

    assert selection == RolloutSelection(
        policy="returned_history",
        call_ids=(),
        terminal_response_id=None,
        terminal_call_id=None,
        reward=0.0,
        mask_reason=MaskReason.CAPTURE_FAILED,
    )


def test_an_attempt_without_accepted_generation_runs_no_policy() -> None:
    def never(records: Any, result: Any) -> Any:
        raise AssertionError("the policy must not run when nothing can be selected")

    selection = select_rollout(never, [failed("c1", None), failed("c2", None)], NOTHING_GENERATED)

    assert (selection.call_ids, selection.reward) == ((), 0.0)


@pytest.mark.parametrize(
    ("evidence", "rule"),
    [
        ({"output": [say("never generated")]}, "missing_evidence"),
        ({"model_calls": ["c1"]}, "missing_evidence"),
        ({"terminal_response_id": "resp-x"}, "missing_evidence"),
        ({"responses": [{"id": "resp-c0", "output": [say("no")]}]}, "contradictory_evidence"),
    ],
    ids=["generated-item", "failed-call", "terminal", "rejected-response"],
)
def test_a_result_naming_a_generation_is_refused_when_nothing_was_accepted(
    evidence: dict[str, Any], rule: str
) -> None:
    records = [rejected("c0", None, [say("no")]), failed("c1", None)]

    with pytest.raises(SelectionError, match=rule):
        select_rollout("returned_history", records, {"reward": 0.0, **evidence})


def test_an_attempt_that_made_no_call_selects_nothing_and_masks_empty_selection() -> None:
    selection = select_rollout("all_captured", [], {"reward": 1.0})

    assert (selection.call_ids, selection.mask_reason) == ((), MaskReason.EMPTY_SELECTION)


def test_an_attempt_whose_only_response_was_rejected_selects_no_call() -> None:
    records = [rejected("c1", None, [say("no")]), failed("c2", None)]

    selection = select_rollout("returned_history", records, {"reward": 0.0})

    assert (selection.call_ids, selection.mask_reason) == ((), MaskReason.CAPTURE_FAILED)


def test_an_attempt_whose_call_is_still_pending_selects_no_call_and_masks_pending() -> None:
    selection = select_rollout("returned_history", [pending("c1", None)], {"reward": 0.0})

    assert (selection.call_ids, selection.mask_reason) == ((), MaskReason.CAPTURE_PENDING)


def test_a_result_without_evidence_is_still_refused_when_a_call_committed() -> None:
    records = [committed("c1", None, [say("yes")]), failed("c2", "c1")]

    with pytest.raises(SelectionError, match=r"missing_evidence"):
        select_rollout("returned_history", records, NOTHING_GENERATED)


def test_a_committed_call_whose_client_went_away_still_needs_evidence() -> None:
    # a cancellation recorded after the commit leaves the call committed: it can be returned
    gone = committed(
        "c1", None, [say("yes")], failure_reason=REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES
    )

    with pytest.raises(SelectionError, match=r"missing_evidence"):
        select_rollout("returned_history", [gone], {"reward": 1.0, "output": []})


def test_the_reward_of_a_result_without_accepted_generation_is_still_checked() -> None:
    with pytest.raises(SelectionError, match=r"invalid_result.*finite number"):
        select_rollout("returned_history", [failed("c1", None)], {"reward": float("nan")})


def test_a_registry_records_an_empty_selection_under_the_attempts_policy() -> None:
    registry = PolicyRegistry.of("returned_history")

    selection = registry.select("all_captured", [failed("c1", None)], {"reward": 0.0})

    assert (selection.policy, selection.call_ids) == ("all_captured", ())
    assert all_captured is registry.resolve("all_captured")
