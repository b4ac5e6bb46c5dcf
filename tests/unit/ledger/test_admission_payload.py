"""An admission decision survives its ``call.intended`` record field for field: the root reason,
the equivalences used, a tie broken by an echoed id, and the boundary of a request with no
output (``ledger/admission.py``)."""

from __future__ import annotations

from grove.capture.render import admission_items, normalize_messages
from grove.ledger.admission import (
    AdmissionDecision,
    AdmissionIndex,
    Equivalence,
    RequestBoundary,
    RootReason,
    locate_boundary,
)
from tests.unit.capture.test_admission import (
    ANSWER,
    FOLLOW_UP,
    SYSTEM,
    TASK,
    TOOL_CALL,
    TOOL_RESULT,
    call,
    decide_request,
)


def round_trip(decision: AdmissionDecision) -> AdmissionDecision:
    return AdmissionDecision.from_payload(decision.as_payload())


def test_a_root_keeps_its_reason_through_the_record() -> None:
    index = AdmissionIndex([call("c1", [TASK], ANSWER)])
    rewritten = decide_request(index, {"role": "user", "content": "Other task"}, ANSWER, FOLLOW_UP)

    payload = rewritten.as_payload()

    assert payload["reason"] == RootReason.HISTORY_REWRITTEN.value
    assert round_trip(rewritten).reason is RootReason.HISTORY_REWRITTEN


def test_a_continuation_keeps_the_equivalences_it_used_through_the_record() -> None:
    index = AdmissionIndex(
        [call("c1", [TASK], {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]})]
    )
    echoed = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    decision = decide_request(index, TASK, echoed, TOOL_RESULT, proven=True)

    assert decision.as_payload()["equivalences"] == [Equivalence.TOOL_CONTENT_NULL_EMPTY.value]
    assert round_trip(decision).equivalences == (Equivalence.TOOL_CONTENT_NULL_EMPTY,)


def test_a_tie_broken_by_an_echoed_id_stays_broken_through_the_record() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, response_ids=["msg_1"]),
            call("c2", [TASK], ANSWER, response_ids=["msg_2"]),
        ]
    )
    decision = decide_request(index, TASK, {**ANSWER, "id": "msg_2"}, FOLLOW_UP)

    assert decision.tie_broken_by_echoed_id is True
    assert round_trip(decision) == decision


def boundary_of(*messages: dict[str, object]) -> RequestBoundary:
    return locate_boundary(admission_items(normalize_messages(messages)))


def test_a_request_of_observations_alone_records_no_prefix_and_only_observations() -> None:
    items = admission_items(normalize_messages([TASK, {**FOLLOW_UP, "id": "u2"}]))
    boundary = locate_boundary(items)

    assert items[-1].echoed_ids == ("u2",)

    assert (boundary.prefix_item_count, boundary.echoed_ids) == (0, ())
    assert (boundary.prefix_digest, boundary.canonical_prefix_digest) == (None, None)
    assert boundary.suffix_only_observations is True


def test_a_request_with_a_system_message_and_no_output_records_more_than_observations() -> None:
    boundary = boundary_of(SYSTEM, TASK)

    assert (boundary.prefix_item_count, boundary.prefix_digest) == (0, None)
    assert boundary.suffix_only_observations is False
