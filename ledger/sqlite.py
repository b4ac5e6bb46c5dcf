"""SQLite specifics: reading in position order, and bulk import as one batched insert.

SQLite has one writer at a time and positions are assigned under the write lock, so position
order is commit order: a reader that keeps the last position it consumed never skips an event.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Integer, Row, String, bindparam, insert, select, union_all
from sqlalchemy.types import TypeEngine

from grove.ledger.append_batch import AppendBatch, Meanwhile
from grove.ledger.appending import append_statement
from grove.ledger.compiled import CompiledStatement
from grove.ledger.events import LedgerPosition
from grove.ledger.schema import EVENTS

__all__ = ["SqliteBackend"]

_TYPES: dict[str, TypeEngine[Any]] = {
    "event_id": String(),
    "ordinal": Integer(),
    "event_type": String(),
    "schema_version": Integer(),
    "payload": String(),  # the event's JSON text, as the store prepared it
}


@functools.cache
def _append(count: int) -> CompiledStatement:
    """The append of ``count`` rows: each row's values are parameters ``NAME_INDEX``."""
    selects = [
        select(*(bindparam(f"{name}_{i}", type_=_TYPES[name]).label(name) for name in _TYPES))
        for i in range(count)
    ]
    rows = selects[0].subquery("rows") if count == 1 else union_all(*selects).subquery("rows")
    return CompiledStatement(append_statement(rows))


class SqliteBackend:
    """The SQLite implementation of the store's backend operations."""

    name = "sqlite"

    def recorded(self, conn: Connection, event_ids: Sequence[str]) -> Sequence[Row]:
        """The rows already recorded under any of ``event_ids``, in position order."""
        query = select(EVENTS).where(EVENTS.c.event_id.in_(event_ids)).order_by(EVENTS.c.position)
        return conn.execute(query).all()

    def prepares_while_writing(self, count: int) -> bool:
        """Never: every append is one statement, its rows prepared before the transaction
        begins (which takes SQLite's write lock)."""
        del count
        return False

    def insert_rows(
        self,
        conn: Connection,
        batch: AppendBatch,
        expected_version: int | None,
        meanwhile: Meanwhile | None = None,
    ) -> Sequence[Row] | None:
        """Append the batch's rows in one statement, when the stream's version is
        ``expected_version`` (None: whatever it is): their ``position``, ``event_id`` and
        ``stream_version``; None, with nothing written, when the version differs. A recorded
        event id: IntegrityError. (``meanwhile`` is never called: the statement returns once
        the rows are written, leaving nothing to overlap.)"""
        del meanwhile
        parameters: dict[str, Any] = {"stream_id": batch.stream_id, "expected": expected_version}
        for index, (event_id, event, payload) in enumerate(batch.rows()):
            parameters[f"event_id_{index}"] = event_id
            parameters[f"ordinal_{index}"] = index + 1
            parameters[f"event_type_{index}"] = event.type
            parameters[f"schema_version_{index}"] = event.schema_version
            parameters[f"payload_{index}"] = payload
        return _append(len(batch)).execute(conn, parameters).all() or None

    def read_after(self, conn: Connection, mark: LedgerPosition, limit: int) -> Sequence[Row]:
        """Committed events after ``mark`` in commit order."""
        query = (
            select(EVENTS)
            .where(EVENTS.c.position > mark.position)
            .order_by(EVENTS.c.position)
            .limit(limit)
        )
        return conn.execute(query).all()

    def horizon_passed(self, conn: Connection) -> bool:
        """Always: with one writer at a time, every committed event is readable at once."""
        del conn
        return True

    def mark_of(self, row: Row) -> LedgerPosition:
        """The reader mark after consuming ``row``."""
        return LedgerPosition(transaction_id=None, position=row.position)

    def bulk_insert(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared rows in one batched statement."""
        conn.execute(insert(EVENTS), list(rows))
