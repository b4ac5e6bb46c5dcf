"""PostgreSQL specifics: the gap-free reader over transaction ids, and bulk import by ``COPY``.

Positions come from a sequence, so a transaction can commit position 7 after another committed
position 8; a reader that kept only "last position 8" would skip 7 forever. Each row records its
writing transaction id (``pg_current_xact_id()``, the 64-bit xid8), and the reader only reads rows
whose transaction is older than the oldest still running (``pg_snapshot_xmin`` of the statement's
snapshot): that set can no longer change, and it is read in ``(transaction_id, position)`` order
with a ``(transaction_id, position)`` mark. Every transaction not yet finished has an id at or
above that horizon, so nothing can appear behind the mark later.

JSONB cannot hold the character U+0000 in a string: a payload with one is refused as
``InvalidEventPayload`` before anything is written (SQLite stores it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Row,
    Text,
    bindparam,
    cast,
    column,
    func,
    insert,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.dml import Insert

from ledger.errors import InvalidEventPayload
from ledger.events import LedgerPosition
from ledger.schema import EVENTS

__all__ = ["COPY_COLUMNS", "PostgresBackend"]

COPY_COLUMNS = (
    "event_id",
    "stream_id",
    "stream_version",
    "event_type",
    "schema_version",
    "payload",
)


def _oldest_running_transaction():
    return cast(cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text), BigInteger)


_ROW_TYPES = {
    "event_id": Text,
    "stream_id": Text,
    "stream_version": Integer,
    "event_type": Text,
    "schema_version": Integer,
    "payload": JSONB,
}


def _recordset_insert() -> Insert:
    # The whole batch travels as one JSON document expanded by jsonb_to_recordset: one short
    # query and one parameter. insertmanyvalues renders six placeholders per row, and psycopg
    # spent most of an append parsing them (bench/ledger_append.py: 0.12 of COPY's rate).
    rows = (
        func.jsonb_to_recordset(bindparam("rows", type_=Text).cast(JSONB))
        .table_valued(*(column(name, type_) for name, type_ in _ROW_TYPES.items()))
        .render_derived("rows", with_types=True)
    )
    return (
        insert(EVENTS)
        .from_select(list(_ROW_TYPES), select(*(rows.c[name] for name in _ROW_TYPES)))
        .returning(EVENTS.c.position, EVENTS.c.event_id)
    )


_INSERT = _recordset_insert()


def _holds_nul(value: object) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False


def _refuse_nul(rows: Sequence[dict[str, Any]]) -> None:
    """``InvalidEventPayload`` for the first row whose payload holds U+0000 (JSONB cannot)."""
    for row in rows:
        if _holds_nul(row["payload"]):
            raise InvalidEventPayload(
                row["event_type"],
                row["schema_version"],
                "a string holds the character U+0000, which PostgreSQL cannot store in JSONB; "
                "remove it from the event (e.g. from a harness result or a failure detail)",
            )


class PostgresBackend:
    """The PostgreSQL implementation of the store's backend operations."""

    name = "postgresql"

    def recorded(self, conn: Connection, event_ids: Sequence[str]) -> Sequence[Row]:
        """The rows already recorded under any of ``event_ids``, in position order."""
        # IN (SELECT unnest(...)), not = ANY(...): psycopg prepares repeated statements, and
        # a generic plan's ANY over a parameter array scans the table testing every element
        # (0.35 s per 500 ids at 50,000 events); the sub-select is probed through the index.
        ids = func.unnest(bindparam("ids", list(event_ids), type_=ARRAY(Text)))
        query = (
            select(EVENTS)
            .where(EVENTS.c.event_id.in_(select(ids).scalar_subquery()))
            .order_by(EVENTS.c.position)
        )
        return conn.execute(query).all()

    def insert_rows(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert prepared rows in one statement; their positions, in row order."""
        document = json.dumps([{name: row[name] for name in _ROW_TYPES} for row in rows])
        if "\\u0000" in document:  # json.dumps escapes U+0000 so; then check exactly
            _refuse_nul(rows)
        by_id = {r.event_id: r.position for r in conn.execute(_INSERT, {"rows": document})}
        return [by_id[row["event_id"]] for row in rows]

    def read_after(self, conn: Connection, mark: LedgerPosition, limit: int) -> Sequence[Row]:
        """Events of finished transactions after ``mark``, in (transaction id, position) order."""
        after = tuple_(EVENTS.c.transaction_id, EVENTS.c.position) > tuple_(
            mark.transaction_id or 0, mark.position
        )
        query = (
            select(EVENTS)
            .where(EVENTS.c.transaction_id < _oldest_running_transaction(), after)
            .order_by(EVENTS.c.transaction_id, EVENTS.c.position)
            .limit(limit)
        )
        return conn.execute(query).all()

    def horizon_passed(self, conn: Connection) -> bool:
        """Whether every committed event is below the reader's horizon (readable now)."""
        newest = select(func.coalesce(func.max(EVENTS.c.transaction_id), -1)).scalar_subquery()
        return bool(conn.execute(select(newest < _oldest_running_transaction())).scalar_one())

    def mark_of(self, row: Row) -> LedgerPosition:
        """The reader mark after consuming ``row``."""
        return LedgerPosition(transaction_id=row.transaction_id, position=row.position)

    def bulk_insert(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared rows with ``COPY … FROM STDIN`` on the connection's transaction."""
        _refuse_nul(rows)
        statement = f"COPY grove_events ({', '.join(COPY_COLUMNS)}) FROM STDIN"  # constant names
        driver = conn.connection.driver_connection
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(
                    (
                        row["event_id"],
                        row["stream_id"],
                        row["stream_version"],
                        row["event_type"],
                        row["schema_version"],
                        json.dumps(row["payload"], separators=(",", ":")),
                    )
                )
