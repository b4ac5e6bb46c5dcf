"""The event store's contract, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest

from grove.ledger import database
from grove.ledger.append_batch import AppendBatch
from grove.ledger.errors import (
    EventIdConflict,
    ImportConflict,
    InvalidEventPayload,
    StreamIdError,
    WrongExpectedVersion,
)
from grove.ledger.events import AttemptSettled, CallFailed, LedgerPosition
from grove.ledger.store import ANY_VERSION, EventStore, ImportEvent, NewEvent

from .scenario import opened


def failed(call_id: str, reason: str = "engine_error") -> CallFailed:
    return CallFailed(call_id=call_id, reason=reason)


def test_append_to_a_new_stream_returns_positions_and_version(store: EventStore):
    result = store.append("att-1", [opened("att-1"), failed("c1")], expected_version=0)
    assert result.stream_version == 2
    assert len(result.positions) == 2 and result.positions[0] < result.positions[1]
    assert not result.duplicate


def test_read_stream_returns_events_in_version_order(store: EventStore):
    store.append("att-1", [opened("att-1")], expected_version=0)
    store.append("att-1", [failed("c1"), failed("c2")], expected_version=1)
    events = store.read_stream("att-1")
    assert [e.stream_version for e in events] == [1, 2, 3]
    assert [e.event_type for e in events] == ["attempt.opened", "call.failed", "call.failed"]
    assert events[2].decode() == failed("c2")


def test_append_with_stale_version_raises_conflict(store: EventStore):
    store.append("att-1", [opened("att-1"), failed("c1")], expected_version=0)
    with pytest.raises(
        WrongExpectedVersion,
        match=r"Wrong expected version: 1 \(Stream: att-1, Stream Version: 2\)",
    ) as info:
        store.append("att-1", [failed("c2")], expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert store.stream_version("att-1") == 2


def test_append_with_any_version_skips_the_check(store: EventStore):
    store.append("att-1", [opened("att-1")], expected_version=0)
    result = store.append("att-1", [failed("c1")], expected_version=ANY_VERSION)
    assert result.stream_version == 2


def test_retry_with_the_same_event_id_returns_the_recorded_position(store: EventStore):
    first = store.append("att-1", [NewEvent(opened("att-1"), "ev-1")], expected_version=0)
    again = store.append("att-1", [NewEvent(opened("att-1"), "ev-1")], expected_version=0)
    assert again.positions == first.positions
    assert again.duplicate
    assert store.count() == 1


def test_same_event_id_with_a_different_payload_raises_naming_the_id(store: EventStore):
    store.append("att-1", [NewEvent(failed("c1"), "ev-1")], expected_version=0)
    with pytest.raises(EventIdConflict, match=r"ev-1 is already recorded with a different payload"):
        store.append("att-1", [NewEvent(failed("c1", "storage_error"), "ev-1")])
    assert store.count() == 1


def test_same_event_id_on_another_stream_raises(store: EventStore):
    store.append("att-1", [NewEvent(failed("c1"), "ev-1")])
    with pytest.raises(EventIdConflict, match=r"different stream \('att-1', not 'att-2'\)"):
        store.append("att-2", [NewEvent(failed("c1"), "ev-1")])


def test_event_id_twice_in_one_append_is_refused(store: EventStore):
    with pytest.raises(EventIdConflict, match=r"Event id ev-1 .* same append"):
        store.append("att-1", [NewEvent(failed("c1"), "ev-1"), NewEvent(failed("c2"), "ev-1")])
    assert store.count() == 0


def test_bad_stream_id_writes_nothing(store: EventStore):
    with pytest.raises(StreamIdError, match=r"Invalid stream id '\.\./etc'"):
        store.append("../etc", [failed("c1")])
    assert store.count() == 0


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic warns while dumping the forgery
def test_invalid_event_model_writes_nothing(store: EventStore):
    forged = CallFailed.model_construct(call_id=7, reason=None)
    with pytest.raises(ValueError, match=r"Invalid payload for event 'call\.failed'"):
        store.append("att-1", [failed("c0"), forged])
    assert store.count() == 0


def test_non_event_payload_is_refused(store: EventStore):
    with pytest.raises(TypeError, match="expected a ledger event model, got dict"):
        store.append("att-1", [NewEvent({"call_id": "c1"})])  # type: ignore[arg-type]
    assert store.count() == 0


def test_racing_appends_at_the_same_version_let_exactly_one_win(store: EventStore):
    store.append("att-1", [opened("att-1")], expected_version=0)
    outcomes: list[str] = []
    barrier = threading.Barrier(4)

    def writer(index: int) -> None:
        barrier.wait()
        try:
            store.append("att-1", [failed(f"c{index}")], expected_version=1)
            outcomes.append("won")
        except WrongExpectedVersion:
            outcomes.append("conflict")

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["conflict", "conflict", "conflict", "won"]
    assert store.stream_version("att-1") == 2


def test_import_writes_rows_with_their_stream_versions(store: EventStore):
    rows = [
        ImportEvent("att-9", v, "call.failed", 1, {"call_id": f"c{v}", "reason": "x", "detail": ""})
        for v in range(1, 51)
    ]
    assert store.import_events(rows) == 50
    events = store.read_stream("att-9")
    assert [e.stream_version for e in events] == list(range(1, 51))
    assert events[-1].decode() == CallFailed(call_id="c50", reason="x")


def test_import_with_one_invalid_payload_writes_nothing(store: EventStore):
    rows = [
        ImportEvent("att-9", 1, "call.failed", 1, {"call_id": "c1", "reason": "x"}),
        ImportEvent("att-9", 2, "call.failed", 1, {"call_id": "c2"}),
    ]
    with pytest.raises(ValueError, match=r"reason: Field required"):
        store.import_events(rows)
    assert store.count() == 0


def test_read_after_delivers_each_event_once_in_order(store: EventStore):
    for index in range(7):
        store.append(f"att-{index % 3}", [failed(f"c{index}")])
    assert store.wait_for_horizon()
    mark = LedgerPosition(position=0)
    seen = []
    while batch := store.read_after(mark, limit=2).events:
        seen.extend(e.decode().call_id for e in batch)
        mark = store.read_after(mark, limit=2).mark
    assert seen == [f"c{i}" for i in range(7)]


def test_old_version_rows_are_read_through_the_upcaster(store: EventStore):
    payload = opened("att-1").model_dump(mode="json")
    del payload["forest_mode"], payload["selection_policy"]
    store.import_events([ImportEvent("att-1", 1, "attempt.opened", 1, payload)])
    event = store.read_stream("att-1")[0].decode()
    assert (event.forest_mode, event.selection_policy) == (False, "returned_history")


def test_settled_event_round_trips_its_tuple_fields(store: EventStore):
    store.append("att-1", [AttemptSettled(pending_call_ids=("c2", "c3"), timed_out=True)])
    assert store.read_stream("att-1")[0].decode() == AttemptSettled(
        pending_call_ids=("c2", "c3"), timed_out=True
    )


@pytest.mark.parametrize(
    "detail", ["a\x00b", "\uffff", "\uffff0", "x\uffff\uffff\x00\x00y", "plain"], ids=repr
)
def test_strings_with_nul_and_the_escape_character_round_trip(store: EventStore, detail: str):
    """JSONB cannot hold U+0000: the store escapes it reversibly on PostgreSQL."""
    event = CallFailed(call_id=f"c-{detail}", reason="engine_error", detail=detail)
    first = store.append("att-1", [NewEvent(event, "ev-1")])
    again = store.append("att-1", [NewEvent(event, "ev-1")])  # idempotent: compares decoded
    assert again.duplicate and again.positions == first.positions
    store.import_events([ImportEvent("att-2", 1, "call.failed", 1, event.model_dump(mode="json"))])
    assert store.read_stream("att-1")[0].decode() == event
    assert store.read_stream("att-2")[0].decode() == event


def test_an_import_colliding_with_recorded_events_is_refused_whole(store: EventStore):
    store.append("att-9", [failed("c0")])
    rows = [
        ImportEvent("att-8", 1, "call.failed", 1, {"call_id": "c1", "reason": "x"}),
        ImportEvent("att-9", 1, "call.failed", 1, {"call_id": "c2", "reason": "x"}),
    ]
    with pytest.raises(ImportConflict, match=r"Import refused: .* nothing was imported"):
        store.import_events(rows)
    assert store.count() == 1


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydantic warns while dumping the forgery
def test_an_invalid_event_is_refused_while_another_writer_holds_the_lock(
    ledger_url: str, monkeypatch: pytest.MonkeyPatch
):
    # A lock wait of 1 s instead of 60: an append that took the write lock before validating
    # would fail with the lock's error instead of the payload's.
    monkeypatch.setattr(database, "SQLITE_BUSY_TIMEOUT_S", 1.0)
    store, writer = EventStore.open(ledger_url), EventStore.open(ledger_url)
    try:
        with writer.engine.begin() as held:
            writer.backend.insert_rows(held, AppendBatch("att-0", [failed("c0")]), None)
            with pytest.raises(InvalidEventPayload, match=r"Invalid payload for event"):
                store.append("att-1", [CallFailed.model_construct(call_id=7, reason=None)])
    finally:
        store.close()
        writer.close()
