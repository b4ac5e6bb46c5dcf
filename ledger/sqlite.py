"""SQLite specifics: reading in position order, and bulk import as one batched insert.

SQLite has one writer at a time and positions are assigned under the write lock, so position
order is commit order: a reader that keeps the last position it consumed never skips an event.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, insert, select

from ledger.events import LedgerPosition
from ledger.schema import EVENTS

__all__ = ["SqliteBackend"]


class SqliteBackend:
    """The SQLite implementation of the store's backend operations."""

    name = "sqlite"

    def recorded(self, conn: Connection, event_ids: Sequence[str]) -> Sequence[Row]:
        """The rows already recorded under any of ``event_ids``, in position order."""
        query = select(EVENTS).where(EVENTS.c.event_id.in_(event_ids)).order_by(EVENTS.c.position)
        return conn.execute(query).all()

    def insert_rows(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> list[int]:
        """Insert prepared rows (insertmanyvalues); their positions, in row order."""
        result = conn.execute(
            insert(EVENTS).returning(EVENTS.c.position, sort_by_parameter_order=True), list(rows)
        )
        return list(result.scalars())

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
