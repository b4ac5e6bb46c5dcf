"""Appends of many events keep the store's contract (on PostgreSQL they go by ``COPY``).

``ledger/postgres.py`` appends ``COPY_APPEND_MIN`` events or more with ``COPY`` instead of one
``INSERT … SELECT``; every check of a small append must hold for them too, on both databases.
``PARTS`` events go in several parts, each validated while the server writes the one before: an
invalid event in the last part must still write nothing.
"""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text

from grove.ledger.attempt import fold_attempt
from grove.ledger.errors import EventIdConflict, InvalidEventPayload, WrongExpectedVersion
from grove.ledger.events import AttemptSettled, CallFailed, Event
from grove.ledger.postgres import COPY_APPEND_MIN, COPY_PART
from grove.ledger.store import EventStore, NewEvent

from .scenario import committed, intended, opened

MANY = COPY_APPEND_MIN + 4
PARTS = 7 * COPY_PART + 3  # three parts: 64, 128 and the 259 left


def failures(count: int, detail: str = "d") -> list[CallFailed]:
    return [CallFailed(call_id=f"c{i}", reason="engine_error", detail=detail) for i in range(count)]


@pytest.mark.parametrize("count", [MANY, PARTS])
def test_many_events_land_at_consecutive_versions_in_position_order(store: EventStore, count: int):
    store.append("att-1", failures(2), expected_version=0)
    result = store.append("att-1", failures(count), expected_version=2)
    assert result.stream_version == 2 + count and not result.duplicate
    assert list(result.positions) == sorted(result.positions)
    events = store.read_stream("att-1", after_version=2)
    assert [e.stream_version for e in events] == list(range(3, 3 + count))
    assert [e.position for e in events] == list(result.positions)
    assert [e.decode() for e in events] == failures(count)


def _forged_last(count: int) -> list[Event]:
    forged = CallFailed.model_construct(call_id=7, reason=None)  # invalid, built unchecked
    return [*failures(count - 1), forged]


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic warns while dumping the forgery
def test_an_invalid_event_in_the_last_part_writes_nothing(store: EventStore):
    with pytest.raises(InvalidEventPayload, match=r"Invalid payload for event 'call\.failed'"):
        store.append("att-1", _forged_last(PARTS), expected_version=0)
    assert store.count() == 0
    assert _contradictions(store, "att-1") == []
    assert store.append("att-1", failures(1), expected_version=0).stream_version == 1


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic warns while dumping the forgery
@pytest.mark.parametrize("where", ["first", "last"])
def test_an_invalid_event_is_reported_before_a_stale_version(store: EventStore, where: str):
    store.append("att-1", failures(3), expected_version=0)
    events = _forged_last(PARTS)
    if where == "first":
        events.reverse()
    with pytest.raises(InvalidEventPayload):
        store.append("att-1", events, expected_version=1)
    assert store.count() == 3


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic warns while dumping the forgery
def test_an_invalid_event_is_reported_before_a_repeated_id(store: EventStore):
    events = [NewEvent(e, "ev-1") for e in _forged_last(PARTS)]
    with pytest.raises(InvalidEventPayload):
        store.append("att-1", events)
    assert store.count() == 0


@pytest.mark.parametrize(
    "detail",
    ["tab\there", "line\nend\r", "back\\slash \\N", "nul\x00", "\uffff0", "ünï 😀", "\\."],
    ids=repr,
)
def test_strings_that_copy_and_jsonb_escape_round_trip(store: EventStore, detail: str):
    events = [NewEvent(e, f"ev\t{i}\\{detail[:2]}") for i, e in enumerate(failures(MANY, detail))]
    first = store.append("att-1", events, expected_version=0)
    again = store.append("att-1", events, expected_version=0)  # idempotent: compares decoded
    assert again.duplicate and again.positions == first.positions
    stored = store.read_stream("att-1")
    assert [e.decode() for e in stored] == [e.event for e in events]
    assert [e.event_id for e in stored] == [e.event_id for e in events]


def test_many_events_at_a_stale_version_raise_and_write_nothing(store: EventStore):
    store.append("att-1", failures(3), expected_version=0)
    with pytest.raises(WrongExpectedVersion) as info:
        store.append("att-1", failures(MANY), expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 3)
    assert store.count() == 3


def test_many_events_ahead_of_the_stream_raise_and_write_nothing(store: EventStore):
    store.append("att-1", failures(3), expected_version=0)
    with pytest.raises(WrongExpectedVersion) as info:
        store.append("att-1", failures(MANY), expected_version=5)
    assert (info.value.expected, info.value.actual) == (5, 3)
    assert store.count() == 3


def test_a_retried_append_of_many_events_returns_the_recorded_positions(store: EventStore):
    events = [NewEvent(e, f"ev-{i}") for i, e in enumerate(failures(MANY))]
    first = store.append("att-1", events, expected_version=0)
    again = store.append("att-1", events, expected_version=0)
    assert again.duplicate and again.positions == first.positions
    assert again.stream_version == MANY
    assert store.count() == MANY


def test_many_events_reusing_one_recorded_id_raise_and_write_nothing(store: EventStore):
    store.append("att-1", [NewEvent(failures(1, "other")[0], "ev-7")])
    events = [NewEvent(e, f"ev-{i}") for i, e in enumerate(failures(MANY))]
    with pytest.raises(EventIdConflict, match=r"ev-7 .*part of this append is already recorded"):
        store.append("att-2", events)
    assert store.count() == 1


def test_racing_appends_of_many_events_let_exactly_one_win(store: EventStore):
    store.append("att-1", failures(1), expected_version=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(3)

    def writer() -> None:
        barrier.wait()
        try:
            store.append("att-1", failures(MANY), expected_version=1)
            outcomes.append("won")
        except WrongExpectedVersion:
            outcomes.append("conflict")

    threads = [threading.Thread(target=writer) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict", "conflict", "won"]
    assert store.stream_version("att-1") == 1 + MANY


def _contradictions(store: EventStore, key: str) -> list[str]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT contradiction FROM grove_contradictions WHERE capture_key = :k "
                    "ORDER BY stream_version"
                ),
                {"k": key},
            ).scalars()
        )


def test_many_events_of_an_attempt_never_opened_are_each_a_contradiction(store: EventStore):
    events: list[Event] = [*failures(MANY, "tab\tand\\slash\nline")]
    store.append("att-1", events, expected_version=0)
    expected = list(fold_attempt("att-1", events).contradictions)
    assert len(expected) == MANY
    assert _contradictions(store, "att-1") == expected


def test_a_whole_attempt_in_one_append_shows_in_the_views_as_folded(store: EventStore):
    events: list[Event] = [opened("att-1")]
    parent = None
    for i in range(MANY // 2):
        events += [intended(f"c{i}", parent=parent), committed("att-1", f"c{i}", parent=parent)]
        parent = f"c{i}"
    events.append(intended("c0"))  # a second intent of c0: a contradiction
    store.append("att-1", events, expected_version=0)
    state = fold_attempt("att-1", events)
    with store.engine.connect() as conn:
        shown = {
            (r.call_id, r.parent_call_id, r.status)
            for r in conn.execute(text("SELECT * FROM grove_calls WHERE capture_key = 'att-1'"))
        }
    assert shown == {(c.call_id, c.parent_call_id, c.status.value) for c in state.calls.values()}
    assert len(shown) == MANY // 2
    assert _contradictions(store, "att-1") == list(state.contradictions)


def test_contradictions_of_calls_named_with_tabs_and_backslashes_read_back_exactly(
    store: EventStore,
):
    events: list[Event] = [
        CallFailed(call_id=f"c\t{i}\\N\n", reason="engine_error", detail="d") for i in range(MANY)
    ]
    store.append("att-1", events, expected_version=0)
    expected = list(fold_attempt("att-1", events).contradictions)
    assert _contradictions(store, "att-1") == expected
    assert expected[0] == "call.failed of call c\t0\\N\n: the attempt was never opened"


def test_contradictions_of_events_without_a_call_have_no_call_id(store: EventStore):
    events: list[Event] = [AttemptSettled() for _ in range(MANY)]
    store.append("att-1", events, expected_version=0)
    with store.engine.connect() as conn:
        call_ids = conn.execute(
            text("SELECT call_id FROM grove_contradictions WHERE capture_key = 'att-1'")
        ).scalars()
        assert list(call_ids) == [None] * MANY
    assert _contradictions(store, "att-1") == list(fold_attempt("att-1", events).contradictions)


def _contradiction_rows(store: EventStore, key: str) -> list[tuple]:
    with store.engine.connect() as conn:
        return [
            tuple(row)
            for row in conn.execute(
                text(
                    "SELECT stream_version, event_type, call_id, contradiction "
                    "FROM grove_contradictions WHERE capture_key = :k ORDER BY stream_version"
                ),
                {"k": key},
            )
        ]


@pytest.mark.parametrize("opened_first", [False, True], ids=["never-opened", "opened"])
@pytest.mark.parametrize("call", ["c", "c\x00nul", "c\t\\N"], ids=repr)
def test_a_batch_records_the_contradictions_of_its_events_appended_one_by_one(
    store: EventStore, opened_first: bool, call: str
):
    # A batch of attempt events stages its contradictions as if its stream were never opened;
    # the claim must confirm that, or the events are folded one by one as below.
    events: list[Event] = [
        committed("x", f"{call}{i}")
        if i % 2
        else CallFailed(call_id=f"{call}{i}", reason="engine_error", detail="d")
        for i in range(MANY)
    ]
    for key in ("batch", "single"):
        if opened_first:
            store.append(key, [opened(key)], expected_version=0)
    store.append("batch", events)
    for event in events:
        store.append("single", [event])
    assert _contradiction_rows(store, "batch") == _contradiction_rows(store, "single")
    assert len(_contradiction_rows(store, "batch")) == MANY
