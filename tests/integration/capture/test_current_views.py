"""A capture service plans a call from its own view of the attempt without reading the ledger
when the view holds everything this process appended, and a plan that another writer has made
stale fails before anything is written (on both databases)."""

from __future__ import annotations

import pytest
from sqlalchemy import event

from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.ledger.attempt import AttemptLog, StaleAttemptState

from .conftest import OPTIONS

FIRST = [{"role": "user", "content": "Count the apples."}]


def _call(messages: list[dict[str, str]], call_id: str) -> ModelCall:
    return ModelCall(messages, OPTIONS, SamplingParams(4), call_id=call_id)


def _selects(service: CaptureService) -> list[str]:
    seen: list[str] = []
    event.listen(
        service.log.store.engine,
        "before_cursor_execute",
        lambda _c, _k, statement, *_a: seen.append(statement.split(None, 1)[0].upper()),
    )
    return seen


def test_a_continuation_is_planned_from_the_current_view_without_a_read(service: CaptureService):
    service.current_state("att-1")
    first = service.generate("att-1", _call(FIRST, "c1"), refresh=False)
    history = [*FIRST, first.message, {"role": "user", "content": "And the pears?"}]
    statements = _selects(service)
    state = service.current_state("att-1")
    second = service.generate("att-1", _call(history, "c2"), refresh=False)
    assert state.version == 3  # opened, c1 intended and committed: folded, not read
    assert "SELECT" not in statements
    assert (second.decision.kind.value, second.decision.parent_call_id) == ("continuation", "c1")
    assert service.log.load("att-1") == AttemptLog(service.log.store).load("att-1")


def test_a_call_planned_before_another_writers_append_fails_and_writes_nothing(
    service: CaptureService,
):
    service.current_state("att-1")
    other = AttemptLog(service.log.store)  # another gateway's writer of the same attempt
    other.close_admissions("att-1")
    with pytest.raises(StaleAttemptState):
        service.generate("att-1", _call(FIRST, "c1"), refresh=False)
    assert "c1" not in other.load("att-1").calls
    assert service.state("att-1").admissions_closed  # read again: the next plan sees it
