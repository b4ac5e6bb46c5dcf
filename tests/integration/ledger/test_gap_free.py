"""Gap-free reading: a reader never skips an event that commits after a later one.

(a) The hard way: hold an append uncommitted, commit later appends, and show that the reader's mark
does not pass the gap; then the late event is delivered once it commits.
(b) 8 writer processes x 5,000 events with 2 tailing readers: each sees every event exactly once.
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time

import pytest
from sqlalchemy import insert

from grove.ledger.events import CallFailed, LedgerPosition
from grove.ledger.schema import EVENTS
from grove.ledger.store import EventStore

WRITERS = 8
EVENTS_PER_WRITER = 5_000
READERS = 2


def failed(call_id: str) -> CallFailed:
    return CallFailed(call_id=call_id, reason="engine_error")


def _held_row(call_id: str) -> dict:
    return {
        "event_id": f"held-{call_id}",
        "stream_id": "held",
        "stream_version": 1,
        "event_type": "call.failed",
        "schema_version": 1,
        "payload": failed(call_id).model_dump(mode="json"),
    }


def _drain(store: EventStore, mark: LedgerPosition) -> tuple[list[str], LedgerPosition]:
    seen = []
    while True:
        batch = store.read_after(mark, limit=100)
        if not batch.events:
            return seen, mark
        seen.extend(e.decode().call_id for e in batch.events)
        mark = batch.mark


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_reader_mark_does_not_pass_an_uncommitted_append_on_postgres(store: EventStore):
    store.append("before", [failed("c0")])
    assert store.wait_for_horizon()
    seen, mark = _drain(store, LedgerPosition(position=0))
    assert seen == ["c0"]

    held = store.engine.connect()
    transaction = held.begin()
    held.execute(insert(EVENTS), [_held_row("late")])  # lower position, not committed
    store.append("after", [failed("c1")])
    store.append("after", [failed("c2")])

    assert not store.wait_for_horizon(timeout_s=0.3)  # held back by our open transaction
    seen, stalled = _drain(store, mark)
    assert seen == []  # the committed later events wait behind the open transaction
    assert stalled == mark

    transaction.commit()
    held.close()
    assert store.wait_for_horizon()  # other tests' transactions on the server may lag a moment
    seen, _ = _drain(store, mark)
    assert seen == ["late", "c1", "c2"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_reader_mark_does_not_pass_an_uncommitted_append_on_sqlite(store: EventStore):
    store.append("before", [failed("c0")])
    seen, mark = _drain(store, LedgerPosition(position=0))

    held = store.engine.connect()
    transaction = held.begin()  # BEGIN IMMEDIATE: SQLite's single writer
    held.execute(insert(EVENTS), [_held_row("late")])
    later = threading.Thread(target=lambda: store.append("after", [failed("c1")]))
    later.start()
    time.sleep(0.3)
    seen, stalled = _drain(store, mark)
    assert seen == [] and stalled == mark
    assert later.is_alive()  # the later append waits for the writer lock

    transaction.commit()
    held.close()
    later.join(timeout=30)
    seen, _ = _drain(store, mark)
    assert seen == ["late", "c1"]


def _writer(url: str, index: int, count: int) -> None:
    store = EventStore.open(url)
    rng = random.Random(index)
    written = 0
    while written < count:
        size = min(rng.randint(1, 12), count - written)
        events = [failed(f"w{index}-{written + i}") for i in range(size)]
        store.append(f"writer-{index}", events)
        written += size
    store.close()


def _reader(url: str, total: int, deadline_s: float, queue) -> None:
    store = EventStore.open(url)
    mark = LedgerPosition(position=0)
    seen: list[str] = []
    deadline = time.monotonic() + deadline_s
    while len(seen) < total and time.monotonic() < deadline:
        batch = store.read_after(mark, limit=500)
        if not batch.events:
            time.sleep(0.01)
            continue
        seen.extend(e.payload["call_id"] for e in batch.events)
        mark = batch.mark
    time.sleep(0.5)  # anything delivered twice or beyond the total would show up now
    seen.extend(e.payload["call_id"] for e in store.read_after(mark, limit=500).events)
    store.close()
    queue.put(seen)


@pytest.mark.slow
def test_eight_writers_and_two_tailing_readers_see_every_event_exactly_once(ledger_url: str):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    total = WRITERS * EVENTS_PER_WRITER
    readers = [
        ctx.Process(target=_reader, args=(ledger_url, total, 300, queue)) for _ in range(READERS)
    ]
    writers = [
        ctx.Process(target=_writer, args=(ledger_url, i, EVENTS_PER_WRITER)) for i in range(WRITERS)
    ]
    for process in readers + writers:
        process.start()
    for process in writers:
        process.join(timeout=300)
        assert process.exitcode == 0
    results = [queue.get(timeout=300) for _ in readers]
    for process in readers:
        process.join(timeout=30)
    expected = {f"w{w}-{i}" for w in range(WRITERS) for i in range(EVENTS_PER_WRITER)}
    for seen in results:
        assert len(seen) == total
        assert set(seen) == expected
