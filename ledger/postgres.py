"""PostgreSQL specifics: the gap-free reader over transaction ids, and bulk import by ``COPY``.

Positions come from a sequence, so a transaction can commit position 7 after another committed
position 8; a reader that kept only "last position 8" would skip 7 forever. Each row records its
writing transaction id (``pg_current_xact_id()``, the 64-bit xid8), and the reader only reads rows
whose transaction is older than the oldest still running (``pg_snapshot_xmin`` of the statement's
snapshot): that set can no longer change, and it is read in ``(transaction_id, position)`` order
with a ``(transaction_id, position)`` mark. Every transaction not yet finished has an id at or
above that horizon, so nothing can appear behind the mark later.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import BigInteger, Connection, Row, Text, cast, func, select, tuple_

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


class PostgresBackend:
    """The PostgreSQL implementation of the store's backend operations."""

    name = "postgresql"

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

    def mark_of(self, row: Row) -> LedgerPosition:
        """The reader mark after consuming ``row``."""
        return LedgerPosition(transaction_id=row.transaction_id, position=row.position)

    def bulk_insert(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared rows with ``COPY … FROM STDIN`` on the connection's transaction."""
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
