"""``AttemptLog.intend(at=state)`` appends an intent only at the version it was planned against,
on both databases: a plan made on a state another writer has moved past fails, writing nothing."""

from __future__ import annotations

import pytest

from grove.ledger.attempt import AttemptLog, StaleAttemptState
from grove.ledger.store import EventStore

from .scenario import committed, intended, opened


@pytest.fixture
def log(store: EventStore) -> AttemptLog:
    attempts = AttemptLog(store)
    attempts.open(opened("att-1"))
    return attempts


def test_an_intent_planned_on_the_latest_state_lands_right_after_it(log: AttemptLog):
    planned = log.load("att-1")
    assert log.intend("att-1", intended("c1"), at=planned)
    assert log.known_version("att-1") == planned.version + 1 == 2
    assert log.load("att-1").pending_call_ids == ("c1",)


def test_an_intent_planned_on_a_state_another_writer_moved_past_writes_nothing(log: AttemptLog):
    planned = log.load("att-1")
    AttemptLog(log.store).intend("att-1", intended("c1"))  # another gateway, same attempt
    with pytest.raises(StaleAttemptState) as refused:
        log.intend("att-1", intended("c2"), at=planned)
    assert (refused.value.planned, refused.value.actual, refused.value.call_id) == (1, 2, "c2")
    assert [e.payload.get("call_id") for e in log.store.read_stream("att-1")] == [None, "c1"]


def test_the_commit_returns_the_version_it_landed_at(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    assert log.commit("att-1", committed("att-1", "c1")) == 3
    assert log.commit("att-1", committed("att-1", "c1")) is None  # an idempotent retry
