"""A call's intent is committed without its own flush; its commit, durable, flushes both.

``docs/reliability.md`` ("Durability"): on PostgreSQL the intent's transaction runs with
``synchronous_commit = off`` and that transaction alone; ``read_after`` returns nothing before it
is flushed; an intent lost to a crash makes the call's commit fail, writing nothing.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import event, text

from ledger import migrate
from ledger.attempt import AttemptError, AttemptLog, CallStatus
from ledger.events import LedgerPosition
from ledger.store import EventStore

from .scenario import committed, intended, opened


@contextmanager
def transactions(store: EventStore) -> Iterator[list[list[str]]]:
    """The statements ``store`` runs while inside, grouped by transaction."""
    seen: list[list[str]] = []

    def begin(_conn) -> None:
        seen.append([])

    def statement(_conn, _cursor, sql: str, *_args) -> None:
        if seen:
            seen[-1].append(sql.split(None, 1)[0].upper() + (" " + sql if "SET" in sql else ""))

    event.listen(store.engine, "begin", begin)
    event.listen(store.engine, "before_cursor_execute", statement)
    try:
        yield seen
    finally:
        event.remove(store.engine, "begin", begin)
        event.remove(store.engine, "before_cursor_execute", statement)


@pytest.fixture
def log(store: EventStore) -> AttemptLog:
    attempts = AttemptLog(store)
    attempts.open(opened("att-1"))
    return attempts


def test_only_the_intent_commits_without_waiting_for_its_flush(log: AttemptLog):
    with transactions(log.store) as seen:
        log.intend("att-1", intended("c1"))
        log.commit("att-1", committed("att-1", "c1"))
    relaxed = ["SET LOCAL synchronous_commit = off" in " ".join(t) for t in seen]
    on_postgres = log.store.backend.name == "postgresql"
    assert relaxed == [on_postgres, False]


def test_the_relaxed_commit_ends_with_its_transaction(log: AttemptLog):
    log.intend("att-1", intended("c1"))
    if log.store.backend.name != "postgresql":
        pytest.skip("SQLite keeps every append at synchronous=FULL")
    with log.store.engine.connect() as conn:  # the pool's only connection: the intent's
        assert conn.execute(text("SHOW synchronous_commit")).scalar_one() == "on"


def test_a_commit_after_an_unflushed_intent_lands_on_the_expected_version(log: AttemptLog):
    assert log.intend("att-1", intended("c1"))
    log.commit("att-1", committed("att-1", "c1"))
    versions = [(e.stream_version, e.event_type) for e in log.store.read_stream("att-1")]
    assert versions == [(1, "attempt.opened"), (2, "call.intended"), (3, "call.committed")]
    assert AttemptLog(log.store).load("att-1").calls["c1"].status is CallStatus.COMMITTED


def test_read_after_returns_an_unflushed_intent_only_once_it_is_flushed(log: AttemptLog):
    if log.store.backend.name != "postgresql":
        pytest.skip("SQLite syncs every commit")
    log.intend("att-1", intended("c1"))
    with log.store.engine.connect() as conn:
        appended = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one()
    # The gap-free reader also waits for other sessions' open transactions on the server (other
    # tests'): read until the intent is returned, then check it was flushed by then.
    deadline = time.monotonic() + 30.0
    while True:
        batch = log.store.read_after(LedgerPosition(transaction_id=None, position=0))
        types = [e.event_type for e in batch.events]
        if len(types) == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert types == ["attempt.opened", "call.intended"]
    with log.store.engine.connect() as conn:
        flushed = conn.execute(
            text("SELECT pg_current_wal_flush_lsn() >= CAST(:lsn AS pg_lsn)"), {"lsn": appended}
        ).scalar_one()
    assert flushed


def test_an_intent_lost_to_a_crash_fails_the_commit_and_writes_nothing(tmp_path: Path):
    # A crash that loses the unflushed intent leaves the ledger as it was before it: here the
    # database file is put back as it was, under the running writer.
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    try:
        log = AttemptLog(store)
        log.open(opened("att-1"))
        store.close()
        shutil.copy(path, tmp_path / "before.db")
        log.intend("att-1", intended("c1"))
        store.close()
        shutil.copy(tmp_path / "before.db", path)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(AttemptError, match="commit of a call that was never intended"):
            log.commit("att-1", committed("att-1", "c1"))
        assert [e.event_type for e in store.read_stream("att-1")] == ["attempt.opened"]
    finally:
        store.close()
