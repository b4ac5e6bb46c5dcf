"""``AttemptLog`` appends from the state it holds, on both databases: no read before an append,
a read only after another writer got in first, and refusals that never rest on a stale state."""

from __future__ import annotations

import pytest

from grove.ledger.attempt import AttemptError, AttemptLog, CallStatus
from grove.ledger.events import CallFailed
from grove.ledger.store import EventStore

from .scenario import committed, intended, opened
from .statements import statements


@pytest.fixture
def log(store: EventStore) -> AttemptLog:
    attempts = AttemptLog(store)
    attempts.open(opened("att-1"))
    return attempts


def test_appends_from_the_held_state_read_nothing(log: AttemptLog, store: EventStore):
    with statements(store) as counts:
        log.intend("att-1", intended("c1"))
        log.commit("att-1", committed("att-1", "c1"))
        log.intend("att-1", intended("c2", parent="c1"))
    assert counts["SELECT"] == 0
    assert counts["INSERT"] == 3


def test_an_append_after_another_writer_reads_its_events_and_lands_after_them(
    log: AttemptLog, store: EventStore
):
    other = AttemptLog(store)  # another gateway recording calls of the same attempt
    other.intend("att-1", intended("c1"))
    log.intend("att-1", intended("c2"))
    assert [e.payload.get("call_id") for e in store.read_stream("att-1")] == [None, "c1", "c2"]
    assert log.load("att-1").pending_call_ids == ("c1", "c2")


def test_the_state_held_after_appending_is_the_state_folded_from_the_whole_stream(
    log: AttemptLog,
):
    other = AttemptLog(log.store)
    log.intend("att-1", intended("c1"))
    other.fail("att-1", CallFailed(call_id="c1", reason="engine_error"))
    log.intend("att-1", intended("c2"))
    log.close_admissions("att-1")
    assert log.load("att-1") == AttemptLog(log.store).load("att-1")  # held + after vs. whole


def test_a_refusal_on_a_stale_held_state_is_checked_again_on_the_ledger(log: AttemptLog):
    log.intend("att-1", intended("c1"))  # held: c1 pending
    AttemptLog(log.store).commit("att-1", committed("att-1", "c1"))  # another writer commits it
    assert log.intend("att-1", intended("c2", parent="c1"))
    assert log.load("att-1").calls["c2"].parent_call_id == "c1"


def test_a_refusal_that_holds_on_the_ledger_stands(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    AttemptLog(log.store).close_admissions("att-1")  # another writer: the harness returned
    with pytest.raises(AttemptError, match=r"admissions are closed.*call c2"):
        log.intend("att-1", intended("c2"))
    assert "c2" not in log.load("att-1").calls


def test_a_retried_intent_recorded_meanwhile_by_another_writer_is_not_appended_twice(
    log: AttemptLog,
):
    log.load("att-1")  # held before the other writer's intent
    assert AttemptLog(log.store).intend("att-1", intended("c1"))
    assert not log.intend("att-1", intended("c1"))  # the identical intent: already recorded
    assert log.load("att-1").version == 2


def test_a_log_holding_one_attempt_records_others_exactly(store: EventStore):
    log = AttemptLog(store, cached_attempts=1)
    for key in ("att-1", "att-2", "att-1", "att-2"):
        if log.load(key).opened is None:
            log.open(opened(key))
        call = f"c{len(log.load(key).calls) + 1}"
        log.intend(key, intended(call))
        log.commit(key, committed(key, call))
    for key in ("att-1", "att-2"):
        state = AttemptLog(store).load(key)
        assert [c.status for c in state.calls.values()] == [CallStatus.COMMITTED] * 2
