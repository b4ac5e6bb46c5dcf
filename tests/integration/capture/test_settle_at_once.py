"""Settling an attempt with nothing pending closes its admissions and settles it in one append
(one commit, nothing read), recording the same events as the step-by-step way, with the
selection too when it is given; when another writer appended since, the one append writes
nothing and settling goes step by step (on both databases)."""

from __future__ import annotations

from sqlalchemy import event

from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import RolloutSelected
from tests.fixtures.attempts import intended

from .conftest import OPTIONS

FIRST = [{"role": "user", "content": "Count the apples."}]


def _watch(service: CaptureService) -> list[str]:
    """Each statement's first word, and ``COMMIT`` for each commit, from now on."""
    seen: list[str] = []
    engine = service.log.store.engine
    event.listen(
        engine,
        "before_cursor_execute",
        lambda _c, _k, statement, *_a: seen.append(statement.split(None, 1)[0].upper()),
    )
    event.listen(engine, "commit", lambda _conn: seen.append("COMMIT"))
    return seen


def _types(service: CaptureService) -> list[str]:
    return [stored.event_type for stored in service.log.store.read_stream("att-1")]


def test_settling_with_nothing_pending_is_one_commit_and_reads_nothing(service: CaptureService):
    service.generate("att-1", ModelCall(FIRST, OPTIONS, SamplingParams(4), call_id="c1"))
    seen = _watch(service)

    state = service.settle("att-1", timeout_s=5)

    assert seen.count("COMMIT") == 1
    assert "SELECT" not in seen
    assert (state.version, state.admissions_closed, state.settled.timed_out) == (5, True, False)
    assert _types(service)[-2:] == ["attempt.admissions_closed", "attempt.settled"]
    assert state == AttemptLog(service.log.store).load("att-1")


def test_settling_after_admissions_closed_appends_the_settlement_alone(service: CaptureService):
    service.close("att-1")

    state = service.settle("att-1", timeout_s=5)

    assert _types(service) == ["attempt.opened", "attempt.admissions_closed", "attempt.settled"]
    assert state.settled is not None and state.settled.pending_call_ids == ()


def test_settling_after_another_writers_intent_waits_for_it_step_by_step(
    service: CaptureService,
):
    service.log.load("att-1")  # this log holds version 1
    other = AttemptLog(service.log.store)  # another gateway's writer of the same attempt
    other.intend("att-1", intended("c9", "first_call"))

    state = service.settle("att-1", timeout_s=0.0)

    assert state.settled is not None
    assert (state.settled.pending_call_ids, state.settled.timed_out) == (("c9",), True)
    assert _types(service) == [
        "attempt.opened",
        "call.intended",
        "attempt.admissions_closed",
        "attempt.settled",
    ]


def test_settling_after_another_writer_closed_admissions_settles_step_by_step(
    service: CaptureService,
):
    service.log.load("att-1")  # this log holds version 1
    AttemptLog(service.log.store).close_admissions("att-1")  # another gateway's append

    state = service.settle("att-1", timeout_s=5)

    assert state.settled is not None and state.version == 3
    assert _types(service) == ["attempt.opened", "attempt.admissions_closed", "attempt.settled"]


def test_settling_again_reads_the_recorded_settlement(service: CaptureService):
    first = service.settle("att-1", timeout_s=5)

    again = AttemptLog(service.log.store).settle("att-1", timeout_s=5)

    assert again == first
    assert _types(service) == ["attempt.opened", "attempt.admissions_closed", "attempt.settled"]


def _selected(*call_ids: str) -> RolloutSelected:
    return RolloutSelected(policy="returned_history", call_ids=call_ids, reward=1.0)


def test_settling_selecting_records_closed_settled_and_selected_in_one_commit(
    service: CaptureService,
):
    service.generate("att-1", ModelCall(FIRST, OPTIONS, SamplingParams(4), call_id="c1"))
    at = service.state("att-1")
    seen = _watch(service)

    state = service.settle_selecting("att-1", _selected("c1"), at=at)

    assert seen.count("COMMIT") == 1
    assert "SELECT" not in seen
    assert state is not None and state.selection == _selected("c1")
    assert _types(service)[-3:] == [
        "attempt.admissions_closed",
        "attempt.settled",
        "rollout.selected",
    ]
    assert state == AttemptLog(service.log.store).load("att-1")


def test_settling_selecting_from_a_state_another_writer_passed_writes_nothing(
    service: CaptureService,
):
    at = service.state("att-1")
    AttemptLog(service.log.store).close_admissions("att-1")  # another gateway's append

    assert service.settle_selecting("att-1", _selected(), at=at) is None
    assert _types(service) == ["attempt.opened", "attempt.admissions_closed"]


def test_settling_selecting_a_call_the_state_does_not_hold_writes_nothing(
    service: CaptureService,
):
    at = service.state("att-1")

    assert service.settle_selecting("att-1", _selected("c9"), at=at) is None
    assert _types(service) == ["attempt.opened"]
