"""Counting the statements a store runs on the event table, to pin what a read or an append of
events costs the database (the projection tables an append also folds into are left out)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event

from grove.ledger.store import EventStore

_EVENT_TABLE = re.compile(r"\bgrove_events\b")


@contextmanager
def statements(store: EventStore) -> Iterator[Counter[str]]:
    """Count the statements on the event table (``grove_events``) that ``store`` runs while
    inside, by first keyword: ``SELECT``, ``INSERT``."""
    counts: Counter[str] = Counter()

    def count(_conn, _cursor, statement: str, *_args) -> None:
        if _EVENT_TABLE.search(statement):
            counts[statement.split(None, 1)[0].upper()] += 1

    event.listen(store.engine, "before_cursor_execute", count)
    try:
        yield counts
    finally:
        event.remove(store.engine, "before_cursor_execute", count)
