"""History cannot change: the database refuses UPDATE, DELETE and TRUNCATE on the event table."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.engine import make_url

from grove.ledger.errors import AppendOnlyViolation
from grove.ledger.store import EventStore

from .scenario import execute_raw, opened


@pytest.fixture
def recorded(store: EventStore) -> EventStore:
    store.append("att-1", [opened("att-1")])
    return store


@pytest.mark.parametrize(
    ("statement", "operation"),
    [
        ("UPDATE grove_events SET stream_id = 'elsewhere'", "UPDATE"),
        ("DELETE FROM grove_events", "DELETE"),
    ],
)
def test_changing_history_is_refused(recorded: EventStore, statement: str, operation: str):
    with pytest.raises(AppendOnlyViolation, match=f"{operation} refused"):
        execute_raw(recorded, statement)
    assert recorded.count() == 1


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_truncate_is_refused_on_postgres(recorded: EventStore):
    with pytest.raises(AppendOnlyViolation, match="TRUNCATE refused"):
        execute_raw(recorded, "TRUNCATE grove_events")
    assert recorded.count() == 1


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_select_insert_role_can_append_but_not_change_history(recorded: EventStore, ledger_url):
    """The application role of docs/ledger.md: SELECT and INSERT only, no trigger needed."""
    dsn = make_url(ledger_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "DO $$ BEGIN CREATE ROLE grove_app NOLOGIN; "
            "EXCEPTION WHEN duplicate_object THEN NULL; END $$"
        )
        conn.execute("GRANT SELECT, INSERT ON grove_events TO grove_app")
        conn.execute("GRANT USAGE ON SEQUENCE grove_events_position_seq TO grove_app")
        conn.execute("SET ROLE grove_app")
        conn.execute(
            "INSERT INTO grove_events (event_id, stream_id, stream_version, event_type, "
            "schema_version, payload) VALUES ('e2', 'att-2', 1, 'call.failed', 1, "
            '\'{"call_id": "c1", "reason": "x", "detail": ""}\')'
        )
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute("UPDATE grove_events SET stream_id = 'x'")
        with pytest.raises(psycopg.errors.InsufficientPrivilege, match="permission denied"):
            conn.execute("DELETE FROM grove_events")
        conn.execute("RESET ROLE")
    assert recorded.count() == 2
