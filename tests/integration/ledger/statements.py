"""Counting the statements a store runs, to pin what a read or an append costs the database."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from ledger.store import EventStore


@contextmanager
def statements(store: EventStore) -> Iterator[Counter[str]]:
    """Count the statements ``store`` runs while inside, by first keyword: ``SELECT``,
    ``INSERT`` (and ``BEGIN`` on SQLite, whose write transactions Grove begins itself)."""
    counts: Counter[str] = Counter()

    def count(_conn, _cursor, statement: str, *_args) -> None:
        counts[statement.split(None, 1)[0].upper()] += 1

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
