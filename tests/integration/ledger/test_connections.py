"""Pooled PostgreSQL connections: pinged only after sitting idle, and replaced when dead.

The server ends the store's sessions (as a restart or an idle timeout would) while their
connections sit in the pool; what the next read meets depends on how long they sat there
(``ledger/database.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import event
from sqlalchemy.engine import make_url

import grove.ledger.database
from grove.ledger import migrate
from grove.ledger.errors import DatabaseUnavailable
from grove.ledger.store import EventStore

from .scenario import opened

pytestmark = pytest.mark.postgres


@pytest.fixture
def store(postgres_url: str) -> Iterator[EventStore]:
    """A store on a fresh PostgreSQL database holding one event, its connection pooled."""
    migrate.upgrade(postgres_url)
    opened_store = EventStore.open(postgres_url)
    opened_store.append("att-1", [opened("att-1")], expected_version=0)
    try:
        yield opened_store
    finally:
        opened_store.close()


def end_sessions(url: str) -> None:
    """End every other session on ``url``'s database, and wait until they are gone."""
    dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    others = "datname = current_database() AND pid <> pg_backend_pid()"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {others}")
        while admin.execute(f"SELECT count(*) FROM pg_stat_activity WHERE {others}").fetchone()[0]:
            admin.execute("SELECT pg_sleep(0.05)")


def test_an_idle_pooled_connection_whose_session_ended_is_replaced_at_checkout(
    store: EventStore, postgres_url: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(
        grove.ledger.database, "IDLE_PING_S", 0.0
    )  # every pooled connection is idle
    end_sessions(postgres_url)
    assert [e.event_type for e in store.read_stream("att-1")] == ["attempt.opened"]


def test_a_recently_used_connection_is_not_pinged_and_fails_once_then_the_pool_reconnects(
    store: EventStore, postgres_url: str
):
    end_sessions(postgres_url)
    with pytest.raises(DatabaseUnavailable):
        store.read_stream("att-1")
    assert [e.event_type for e in store.read_stream("att-1")] == ["attempt.opened"]


def test_sixteen_connections_at_once_are_kept_for_the_next_burst(store: EventStore):
    opened_connections = []
    event.listen(store.engine, "connect", lambda dbapi, record: opened_connections.append(dbapi))
    for _ in range(2):
        held = [store.engine.connect() for _ in range(16)]
        for conn in held:
            conn.close()
    assert len(opened_connections) == 16 - 1  # the fixture's append left one in the pool


def test_an_append_on_a_connection_whose_session_ended_fails_once_then_the_pool_reconnects(
    store: EventStore, postgres_url: str
):
    end_sessions(postgres_url)  # the append's statements run on the driver's cursor
    with pytest.raises(DatabaseUnavailable):
        store.append("att-2", [opened("att-2")], expected_version=0)
    store.append("att-2", [opened("att-2")], expected_version=0)
    assert [e.event_type for e in store.read_stream("att-2")] == ["attempt.opened"]
