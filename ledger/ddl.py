"""Database objects SQLAlchemy cannot declare: append-only triggers and the transaction-id default.

Both databases refuse UPDATE and DELETE on ``grove_events`` with a trigger; PostgreSQL also refuses
TRUNCATE (SQLite has no TRUNCATE; ``DELETE`` without WHERE is caught by the delete trigger).
The statements are constants, applied by migrations through ``append_only_statements``.
"""

from __future__ import annotations

__all__ = [
    "APPEND_ONLY_MESSAGE",
    "append_only_statements",
    "drop_append_only_statements",
    "transaction_id_default_statements",
]

APPEND_ONLY_MESSAGE = "grove_events is append-only"

_POSTGRES_TRIGGERS = (
    """
    CREATE OR REPLACE FUNCTION grove_events_refuse_change() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'grove_events is append-only: % refused', TG_OP
            USING ERRCODE = 'insufficient_privilege';
    END
    $$
    """,
    """
    CREATE TRIGGER grove_events_no_update_delete BEFORE UPDATE OR DELETE ON grove_events
    FOR EACH ROW EXECUTE FUNCTION grove_events_refuse_change()
    """,
    """
    CREATE TRIGGER grove_events_no_truncate BEFORE TRUNCATE ON grove_events
    FOR EACH STATEMENT EXECUTE FUNCTION grove_events_refuse_change()
    """,
)

_SQLITE_TRIGGERS = (
    """
    CREATE TRIGGER grove_events_no_update BEFORE UPDATE ON grove_events
    BEGIN SELECT RAISE(ABORT, 'grove_events is append-only: UPDATE refused'); END
    """,
    """
    CREATE TRIGGER grove_events_no_delete BEFORE DELETE ON grove_events
    BEGIN SELECT RAISE(ABORT, 'grove_events is append-only: DELETE refused'); END
    """,
)

_DROP = {
    "postgresql": (
        "DROP TRIGGER IF EXISTS grove_events_no_truncate ON grove_events",
        "DROP TRIGGER IF EXISTS grove_events_no_update_delete ON grove_events",
        "DROP FUNCTION IF EXISTS grove_events_refuse_change()",
    ),
    "sqlite": (
        "DROP TRIGGER IF EXISTS grove_events_no_update",
        "DROP TRIGGER IF EXISTS grove_events_no_delete",
    ),
}

# xid8 as bigint: a 64-bit, epoch-extended transaction id that never wraps.
_POSTGRES_TRANSACTION_ID = (
    "ALTER TABLE grove_events ALTER COLUMN transaction_id "
    "SET DEFAULT (pg_current_xact_id()::text::bigint)",
)


def _for(dialect: str, table: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    if dialect not in table:
        raise ValueError(f"unsupported database dialect {dialect!r}: use sqlite or postgresql")
    return table[dialect]


def append_only_statements(dialect: str) -> tuple[str, ...]:
    """The statements that make ``grove_events`` append-only on ``dialect``."""
    return _for(dialect, {"postgresql": _POSTGRES_TRIGGERS, "sqlite": _SQLITE_TRIGGERS})


def drop_append_only_statements(dialect: str) -> tuple[str, ...]:
    """The statements that remove the append-only triggers (downgrade only)."""
    return _for(dialect, _DROP)


def transaction_id_default_statements(dialect: str) -> tuple[str, ...]:
    """The statements that fill ``transaction_id`` with the writing transaction's id."""
    return _for(dialect, {"postgresql": _POSTGRES_TRANSACTION_ID, "sqlite": ()})
