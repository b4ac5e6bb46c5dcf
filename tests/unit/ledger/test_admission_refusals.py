"""What each admission refusal says and carries: the whole message a client reads, and the
fields a caller inspects (``ledger/admission.py``)."""

from __future__ import annotations

import pytest

from grove.ledger.admission import (
    AdmissionIndex,
    AmbiguousParentError,
    AssistantPrefillError,
    EmptyRequestError,
    EmptySuffixError,
    locate_boundary,
)
from tests.unit.capture.test_admission import (
    ANSWER,
    FOLLOW_UP,
    SYSTEM,
    TASK,
    call,
    decide_request,
)


def test_an_empty_request_is_refused_saying_it_needs_a_message() -> None:
    with pytest.raises(EmptyRequestError) as raised:
        locate_boundary(())

    assert str(raised.value) == "A request needs at least one message; got 0 items"


def test_assistant_prefill_is_refused_saying_how_to_end_the_request() -> None:
    prefill = {"role": "assistant", "content": "The answer is"}
    index = AdmissionIndex([call("c1", [SYSTEM, TASK], ANSWER)])

    with pytest.raises(AssistantPrefillError) as raised:
        decide_request(index, SYSTEM, TASK, ANSWER, FOLLOW_UP, prefill)

    assert str(raised.value) == (
        "Assistant prefill is not supported: the last of the request's 5 messages is an "
        "assistant message; end the request with a user or tool message and let the model "
        "write the assistant turn"
    )
    assert raised.value.item_count == 5


def test_an_empty_suffix_is_refused_naming_every_call_it_repeats() -> None:
    index = AdmissionIndex([call("c1", [TASK], ANSWER), call("c2", [TASK], ANSWER)])

    with pytest.raises(EmptySuffixError) as raised:
        decide_request(index, TASK, ANSWER)

    assert str(raised.value) == (
        "A request must add at least one user or tool message after the output it continues: "
        "all 2 messages equal the source of committed call(s) c1, c2, so the suffix is empty"
    )
    assert (raised.value.call_ids, raised.value.item_count) == (("c1", "c2"), 2)


def test_an_ambiguous_parent_is_refused_naming_the_calls_and_the_echoed_ids() -> None:
    index = AdmissionIndex(
        [
            call("c1", [TASK], ANSWER, response_ids=["msg_1"]),
            call("c2", [TASK], ANSWER, response_ids=["msg_2"]),
        ]
    )
    echoing = {**ANSWER, "id": "msg_9", "provider_data": {"response_id": "resp_9"}}

    with pytest.raises(AmbiguousParentError) as raised:
        decide_request(index, TASK, echoing, FOLLOW_UP)

    assert str(raised.value) == (
        "Ambiguous parent: the request's first 2 messages equal the source of committed calls "
        "c1, c2, and the response ids it echoes (msg_9, resp_9) do not pick exactly one of "
        "them; echo the chosen response's id on its output item"
    )
    error = raised.value
    assert (error.call_ids, error.echoed_ids, error.prefix_item_count) == (
        ("c1", "c2"),
        ("msg_9", "resp_9"),
        2,
    )
