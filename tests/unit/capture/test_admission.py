"""Candidate admission (ledger/admission.py), every branch, on requests normalized by capture.

Admission itself is pure; these tests feed it the items capture computes, as the lifecycle will.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from grove.capture.render import admission_items, normalize_messages, replay_summary
from grove.ledger.admission import (
    AdmissionDecision,
    AdmissionError,
    AdmissionIndex,
    AmbiguousParentError,
    AssistantPrefillError,
    CallStatus,
    CandidateCall,
    DecisionKind,
    EmptyRequestError,
    EmptySuffixError,
    Equivalence,
    RootReason,
    admit,
    decide,
    locate_boundary,
)
from grove.ledger.errors import LedgerError

Message = Mapping[str, Any]
OPTIONS = "options-a"
SYSTEM = {"role": "system", "content": "You are terse."}
TASK = {"role": "user", "content": "What is 2+2?"}
ANSWER = {"role": "assistant", "content": "4"}
FOLLOW_UP = {"role": "user", "content": "And 3+3?"}
ANSWER_2 = {"role": "assistant", "content": "6"}
LAST = {"role": "user", "content": "Thanks."}
TOOL_CALL = {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "[3, 3]"}}
TOOL_RESULT = {"role": "tool", "tool_call_id": "c1", "content": "6"}


def call(
    call_id: str,
    request: Sequence[Message],
    output: Message,
    *,
    status: CallStatus = CallStatus.COMMITTED,
    options: str = OPTIONS,
    response_ids: Sequence[str] = (),
) -> CandidateCall:
    """A call of the attempt whose request and output are these messages."""
    items = admission_items(normalize_messages([*request, output]))
    return replay_summary(items, options).candidate(call_id, status, frozenset(response_ids))


def decide_request(
    index: AdmissionIndex, *messages: Message, options: str = OPTIONS, proven: bool = False
) -> AdmissionDecision:
    """Admission's decision for a request made of ``messages``."""
    return admit(
        admission_items(normalize_messages(messages)),
        render_options_digest=options,
        index=index,
        tool_content_equivalence_proven=proven,
    )


@pytest.fixture
def index() -> AdmissionIndex:
    """An attempt with one committed call: c1 answered TASK with ANSWER."""
    return AdmissionIndex([call("c1", [SYSTEM, TASK], ANSWER)])


def test_first_request_of_an_attempt_is_a_root_with_reason_first_call() -> None:
    decision = decide_request(AdmissionIndex(), SYSTEM, TASK)
    assert (decision.kind, decision.parent_call_id, decision.reason) == (
        DecisionKind.ROOT,
        None,
        RootReason.FIRST_CALL,
    )


def test_request_that_keeps_the_prefix_and_adds_a_user_message_continues_the_call(
    index: AdmissionIndex,
) -> None:
    decision = decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.parent_call_id, decision.reason) == (
        DecisionKind.CONTINUATION,
        "c1",
        None,
    )
    assert (decision.boundary.prefix_item_count, decision.boundary.item_count) == (3, 4)
    assert decision.equivalences == ()


def test_request_that_adds_tool_results_continues_the_call() -> None:
    tool_turn = {"role": "assistant", "tool_calls": [TOOL_CALL]}
    index = AdmissionIndex([call("c1", [TASK], tool_turn)])
    decision = decide_request(index, TASK, tool_turn, TOOL_RESULT, FOLLOW_UP)
    assert (decision.kind, decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")


def test_continuation_extends_the_latest_call_of_a_chain() -> None:
    index = AdmissionIndex(
        [
            call("c1", [SYSTEM, TASK], ANSWER),
            call("c2", [SYSTEM, TASK, ANSWER, FOLLOW_UP], ANSWER_2),
        ]
    )
    decision = decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP, ANSWER_2, LAST)
    assert decision.parent_call_id == "c2"


def test_edited_earlier_message_roots_the_call_with_history_rewritten(
    index: AdmissionIndex,
) -> None:
    edited_task = {"role": "user", "content": "What is 2 + 2?"}
    decision = decide_request(index, SYSTEM, edited_task, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)


def test_reasoning_removed_from_the_echoed_output_roots_the_call_with_history_rewritten() -> None:
    thought = {"role": "assistant", "content": "4", "reasoning_content": "two plus two"}
    index = AdmissionIndex([call("c1", [TASK], thought)])
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)


def test_changed_render_options_root_the_call_with_render_options_changed(
    index: AdmissionIndex,
) -> None:
    decision = decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP, options="options-b")
    assert (decision.kind, decision.reason) == (
        DecisionKind.ROOT,
        RootReason.RENDER_OPTIONS_CHANGED,
    )
    assert decision.matched_call_ids == ("c1",)


def test_request_that_adds_nothing_after_a_committed_output_raises_empty_suffix(
    index: AdmissionIndex,
) -> None:
    with pytest.raises(EmptySuffixError, match=r"all 3 messages equal the source of .* c1"):
        decide_request(index, SYSTEM, TASK, ANSWER)


def test_request_ending_with_an_assistant_message_raises_assistant_prefill(
    index: AdmissionIndex,
) -> None:
    prefill = {"role": "assistant", "content": "The answer is"}
    with pytest.raises(AssistantPrefillError, match="Assistant prefill is not supported"):
        decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP, prefill)


def test_admission_errors_are_ledger_errors() -> None:
    assert issubclass(AdmissionError, LedgerError)


def test_empty_request_raises() -> None:
    with pytest.raises(EmptyRequestError, match="got 0 items"):
        locate_boundary(())


def test_history_shortened_at_the_front_roots_the_call_with_history_rewritten(
    index: AdmissionIndex,
) -> None:
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)


def test_history_reordered_roots_the_call_with_history_rewritten(index: AdmissionIndex) -> None:
    decision = decide_request(index, TASK, SYSTEM, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)


def test_history_cut_back_to_an_earlier_call_continues_that_call() -> None:
    index = AdmissionIndex(
        [
            call("c1", [SYSTEM, TASK], ANSWER),
            call("c2", [SYSTEM, TASK, ANSWER, FOLLOW_UP], ANSWER_2),
        ]
    )
    decision = decide_request(index, SYSTEM, TASK, ANSWER, LAST)
    assert (decision.kind, decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")


def test_system_message_after_the_output_roots_the_call_with_suffix_not_observations(
    index: AdmissionIndex,
) -> None:
    decision = decide_request(index, SYSTEM, TASK, ANSWER, SYSTEM, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (
        DecisionKind.ROOT,
        RootReason.SUFFIX_NOT_OBSERVATIONS,
    )
    assert decision.matched_call_ids == ("c1",)


def test_request_without_assistant_history_in_an_attempt_with_calls_roots_as_rewritten(
    index: AdmissionIndex,
) -> None:
    summary = {"role": "user", "content": "Summary: 2+2 is 4."}
    decision = decide_request(index, SYSTEM, summary, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.HISTORY_REWRITTEN)


def test_equal_candidates_without_echoed_ids_raise_ambiguous_parent() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, response_ids=["resp_1"]),
            call("c2", [TASK], ANSWER, response_ids=["resp_2"]),
        ]
    )
    with pytest.raises(AmbiguousParentError, match=r"calls c1, c2.*echoes \(none\)") as raised:
        decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert raised.value.call_ids == ("c1", "c2")


def test_equal_candidates_are_disambiguated_by_the_echoed_response_id() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, response_ids=["resp_1", "msg_1"]),
            call("c2", [TASK], ANSWER, response_ids=["resp_2", "msg_2"]),
        ]
    )
    decision = decide_request(index, TASK, {**ANSWER, "id": "msg_2"}, FOLLOW_UP)
    assert (decision.parent_call_id, decision.tie_broken_by_echoed_id) == ("c2", True)
    assert decision.matched_call_ids == ("c1", "c2")


def test_echoed_id_of_no_candidate_leaves_the_tie_unresolved() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, response_ids=["msg_1"]),
            call("c2", [TASK], ANSWER, response_ids=["msg_2"]),
        ]
    )
    with pytest.raises(AmbiguousParentError, match=r"echoes \(msg_9\)"):
        decide_request(index, TASK, {**ANSWER, "id": "msg_9"}, FOLLOW_UP)


def test_pending_call_is_never_a_parent() -> None:
    index = AdmissionIndex([call("c1", [TASK], ANSWER, status=CallStatus.PENDING)])
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.PARENT_PENDING)


def test_failed_call_is_never_a_parent() -> None:
    index = AdmissionIndex([call("c1", [TASK], ANSWER, status=CallStatus.FAILED)])
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.reason) == (DecisionKind.ROOT, RootReason.PARENT_FAILED)


def test_failed_call_with_the_same_source_does_not_tie_with_a_committed_one() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, status=CallStatus.FAILED),
            call("c2", [TASK], ANSWER),
        ]
    )
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.parent_call_id, decision.tie_broken_by_echoed_id) == ("c2", False)


def test_a_pending_call_becomes_a_parent_once_its_commit_is_indexed() -> None:
    index = AdmissionIndex([call("c1", [TASK], ANSWER, status=CallStatus.PENDING)])
    index.add(call("c1", [TASK], ANSWER))
    assert len(index) == 1
    assert decide_request(index, TASK, ANSWER, FOLLOW_UP).parent_call_id == "c1"


def test_resampled_request_continues_the_accepted_parent_beside_the_rejected_call() -> None:
    rejected = {"role": "assistant", "content": "7"}
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER),
            call("c2", [TASK, ANSWER, FOLLOW_UP], rejected),
        ]
    )
    decision = decide_request(index, TASK, ANSWER, FOLLOW_UP)
    assert (decision.kind, decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")


def test_null_or_empty_tool_content_match_is_used_when_proven_and_recorded() -> None:
    index = AdmissionIndex(
        [call("c1", [TASK], {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]})]
    )
    echoed = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    decision = decide_request(index, TASK, echoed, TOOL_RESULT, proven=True)
    assert (decision.kind, decision.parent_call_id) == (DecisionKind.CONTINUATION, "c1")
    assert decision.equivalences == (Equivalence.TOOL_CONTENT_NULL_EMPTY,)


def test_null_or_empty_tool_content_match_is_refused_without_proof() -> None:
    index = AdmissionIndex(
        [call("c1", [TASK], {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]})]
    )
    echoed = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    decision = decide_request(index, TASK, echoed, TOOL_RESULT, proven=False)
    assert (decision.kind, decision.reason) == (
        DecisionKind.ROOT,
        RootReason.TOOL_CONTENT_NOT_EQUIVALENT,
    )
    assert decision.matched_call_ids == ("c1",)


def test_identical_tool_content_needs_no_equivalence() -> None:
    tool_turn = {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]}
    index = AdmissionIndex([call("c1", [TASK], tool_turn)])
    decision = decide_request(index, TASK, tool_turn, TOOL_RESULT, proven=False)
    assert (decision.parent_call_id, decision.equivalences) == ("c1", ())


def test_decision_payload_round_trips(index: AdmissionIndex) -> None:
    decision = decide_request(index, SYSTEM, TASK, {**ANSWER, "id": "msg_1"}, FOLLOW_UP)
    assert AdmissionDecision.from_payload(decision.as_payload()) == decision


def test_recorded_boundary_reproduces_the_decision(index: AdmissionIndex) -> None:
    decision = decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP)
    recorded = AdmissionDecision.from_payload(decision.as_payload())
    replayed = decide(recorded.boundary, render_options_digest=OPTIONS, index=index)
    assert replayed == decision


def test_rooted_decision_keeps_the_candidate_and_records_the_reason(
    index: AdmissionIndex,
) -> None:
    decision = decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP)
    rooted = decision.rooted(RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE)
    assert (rooted.kind, rooted.parent_call_id, rooted.candidate_call_id, rooted.reason) == (
        DecisionKind.ROOT,
        None,
        "c1",
        RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE,
    )
