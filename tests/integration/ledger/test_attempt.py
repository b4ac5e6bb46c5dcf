"""The attempt lifecycle rules, recorded on both databases."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from grove.ledger.attempt import AttemptError, AttemptLog, CallStatus
from grove.ledger.errors import EventIdConflict
from grove.ledger.events import CallFailed, RolloutSelected
from grove.ledger.store import EventStore

from .scenario import committed, intended, opened


@pytest.fixture
def log(store: EventStore) -> AttemptLog:
    attempts = AttemptLog(store)
    attempts.open(opened("att-1"))
    return attempts


def test_open_twice_with_the_same_payload_is_idempotent(log: AttemptLog):
    log.open(opened("att-1"))
    assert log.load("att-1").version == 1


def test_intend_on_an_unknown_attempt_is_refused(log: AttemptLog):
    with pytest.raises(AttemptError, match=r"unknown attempt: open it first \(attempt att-9"):
        log.intend("att-9", intended("c1"))


def test_call_lifecycle_pending_then_committed(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    assert log.load("att-1").pending_call_ids == ("c1",)
    log.commit("att-1", committed("att-1", "c1"))
    state = log.load("att-1")
    assert state.calls["c1"].status is CallStatus.COMMITTED
    assert state.pending_call_ids == ()


def test_retried_intent_is_idempotent(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    log.intend("att-1", intended("c1"))
    assert log.load("att-1").version == 2


def test_second_intent_with_the_same_call_id_is_refused(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    with pytest.raises(EventIdConflict, match=r"att-1:c1:intended is already recorded"):
        log.intend("att-1", intended("c1", prompt_tokens=99))


def test_intent_after_admissions_closed_is_refused(log: AttemptLog):
    log.close_admissions("att-1")
    with pytest.raises(AttemptError, match=r"admissions are closed.*call c1"):
        log.intend("att-1", intended("c1"))


@pytest.mark.parametrize("parent_fate", ["pending", "failed", "unknown"])
def test_a_parent_that_is_not_committed_is_refused(log: AttemptLog, parent_fate: str):
    if parent_fate != "unknown":
        log.intend("att-1", intended("c1"))
    if parent_fate == "failed":
        log.fail("att-1", CallFailed(call_id="c1", reason="engine_error"))
    with pytest.raises(AttemptError, match=r"parent c1 is not a committed call of this attempt"):
        log.intend("att-1", intended("c2", parent="c1"))


def test_commit_after_a_failure_is_refused(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    log.fail("att-1", CallFailed(call_id="c1", reason="engine_error"))
    with pytest.raises(AttemptError, match=r"already failed"):
        log.commit("att-1", committed("att-1", "c1"))


def test_failure_after_a_commit_keeps_the_call_committed_with_its_reason(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    log.commit("att-1", committed("att-1", "c1"))
    reason = "request_finished_without_staged_coordinates"
    log.fail("att-1", CallFailed(call_id="c1", reason=reason))
    call = log.load("att-1").calls["c1"]
    assert (call.status, call.failure.reason) == (CallStatus.COMMITTED, reason)


def test_settle_times_out_with_the_pending_calls(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    state = log.settle("att-1", timeout_s=0.2)
    assert state.settled.pending_call_ids == ("c1",)
    assert state.settled.timed_out


def test_settle_ends_when_a_failure_is_recorded(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    timer = threading.Timer(
        0.2, log.fail, args=("att-1", CallFailed(call_id="c1", reason="engine_error"))
    )
    timer.start()
    state = log.settle("att-1", timeout_s=30)
    timer.join()
    assert (state.settled.pending_call_ids, state.settled.timed_out) == ((), False)


def test_commit_after_settling_is_late_and_never_a_parent(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    log.settle("att-1", timeout_s=0.05)
    log.commit("att-1", committed("att-1", "c1"))
    state = log.load("att-1")
    assert state.calls["c1"].late
    assert state.parentable_call_ids == ()


def test_selection_needs_closed_admissions_and_known_calls(log: AttemptLog):
    selected = RolloutSelected(policy="returned_history", call_ids=("c1",), reward=1.0)
    with pytest.raises(AttemptError, match=r"close first"):
        log.select("att-1", selected)
    log.close_admissions("att-1")
    with pytest.raises(AttemptError, match=r"unknown calls \['c1'\]"):
        log.select("att-1", selected)


def test_independent_calls_may_be_intended_concurrently(log: AttemptLog):
    with ThreadPoolExecutor(8) as pool:
        for future in [pool.submit(log.intend, "att-1", intended(f"c{i}")) for i in range(16)]:
            future.result()
    assert sorted(log.load("att-1").pending_call_ids) == sorted(f"c{i}" for i in range(16))
