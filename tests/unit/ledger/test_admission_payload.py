"""An admission decision survives its ``call.intended`` record field for field: the root reason,
the equivalences used and a tie broken by an echoed id (``ledger/admission.py``)."""

from __future__ import annotations

from grove.ledger.admission import AdmissionDecision, AdmissionIndex, Equivalence, RootReason
from tests.unit.capture.test_admission import (
    ANSWER,
    FOLLOW_UP,
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
