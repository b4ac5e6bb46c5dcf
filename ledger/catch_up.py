"""Projection tables folded from events: attempts, calls, rollouts and contradictions.

Every append folds its own events in its transaction (``ledger/inline_fold.py``), so the tables
and the lineage views are current as of every committed event. ``catch_up`` folds what no append
did: a ledger upgraded from before inline folding (revision 0004 empties the tables), events
imported in bulk, and every stream again after ``rebuild``. It reads with the gap-free reader and
advances the checkpoints in the same transaction as the rows, by compare-and-set, so two runners
never apply the same events twice; each stream is folded whole and in order, once, whether by an
append or by ``catch_up`` (``grove_proj_streams`` holds how far). ``rebuild`` empties the tables
and folds from position 0, which gives the same rows as following the ledger append by append.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Table, delete, select, update
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from grove.ledger.database import translate_errors
from grove.ledger.event_appliers import Folded
from grove.ledger.events import LedgerPosition
from grove.ledger.inline_fold import fold_stream
from grove.ledger.schema import (
    PROJ_ATTEMPTS,
    PROJ_CALLS,
    PROJ_CHECKPOINTS,
    PROJ_CONTRADICTIONS,
    PROJ_ROLLOUTS,
    PROJ_STREAMS,
)
from grove.ledger.store import EventStore, StoredEvent

__all__ = ["PROJECTIONS", "Projection", "catch_up", "projection_marks", "rebuild"]


@dataclass(frozen=True)
class Projection:
    """A table folded from events (``ledger/inline_fold.py`` holds the rules)."""

    name: str
    table: Table


PROJECTIONS: tuple[Projection, ...] = (
    Projection("attempts", PROJ_ATTEMPTS),
    Projection("calls", PROJ_CALLS),
    Projection("rollouts", PROJ_ROLLOUTS),
    Projection("contradictions", PROJ_CONTRADICTIONS),
)

# -- running -------------------------------------------------------------------------------------


def _mark_row(conn: Connection, name: str) -> LedgerPosition:
    row = conn.execute(
        select(PROJ_CHECKPOINTS).where(PROJ_CHECKPOINTS.c.projection == name)
    ).first()
    if row is None:
        return LedgerPosition(position=0)
    return LedgerPosition(transaction_id=row.transaction_id, position=row.position)


def projection_marks(store: EventStore) -> dict[str, LedgerPosition]:
    """Each projection's checkpoint: the last event it has folded."""
    with translate_errors(store.url), store.engine.connect() as conn:
        return {p.name: _mark_row(conn, p.name) for p in PROJECTIONS}


def _ensure_checkpoints(conn: Connection) -> None:
    dialect_insert = postgres_insert if conn.dialect.name == "postgresql" else sqlite_insert
    rows = [{"projection": p.name, "transaction_id": None, "position": 0} for p in PROJECTIONS]
    conn.execute(dialect_insert(PROJ_CHECKPOINTS).on_conflict_do_nothing(), rows)


def _claim(conn: Connection, name: str, old: LedgerPosition, new: LedgerPosition) -> bool:
    """Move the checkpoint from ``old`` to ``new`` first thing in the fold transaction.

    The UPDATE row-locks the checkpoint on PostgreSQL (SQLite's write lock does the same), so a
    concurrent runner waits, then finds the checkpoint moved and folds nothing.
    """
    result = conn.execute(
        update(PROJ_CHECKPOINTS)
        .where(
            PROJ_CHECKPOINTS.c.projection == name,
            PROJ_CHECKPOINTS.c.position == old.position,
            PROJ_CHECKPOINTS.c.transaction_id.is_not_distinct_from(old.transaction_id),
        )
        .values(transaction_id=new.transaction_id, position=new.position)
    )
    return result.rowcount == 1


def _set_mark(conn: Connection, name: str, mark: LedgerPosition) -> None:
    conn.execute(
        update(PROJ_CHECKPOINTS)
        .where(PROJ_CHECKPOINTS.c.projection == name)
        .values(transaction_id=mark.transaction_id, position=mark.position)
    )


class _CheckpointMoved(Exception):
    """Raised inside a fold transaction to roll it back when another runner got there first."""


def _fold_batch(conn: Connection, events: tuple[StoredEvent, ...]) -> None:
    """Fold each stream of ``events`` up to its last event in the batch (and no further)."""
    streams: dict[str, list[Folded]] = {}
    for stored in events:
        folded = Folded(stored.stream_id, stored.stream_version, stored.position, stored.decode())
        streams.setdefault(stored.stream_id, []).append(folded)
    for stream_id, items in streams.items():
        fold_stream(conn, stream_id, sorted(items, key=lambda item: item.stream_version))


def catch_up(
    store: EventStore, batch_size: int = 1000, wait_s: float = 5.0
) -> dict[str, LedgerPosition]:
    """Fold every committed event no append folded yet; returns the new marks.

    Waits up to ``wait_s`` for events held behind the reader's horizon (``wait_for_horizon``),
    so the projections reflect everything committed before the call.
    """
    store.wait_for_horizon(wait_s)
    driver = PROJECTIONS[0].name
    with translate_errors(store.url):
        with store.engine.begin() as conn:
            _ensure_checkpoints(conn)
        while True:
            with store.engine.connect() as conn:
                mark = _mark_row(conn, driver)
            batch = store.read_after(mark, batch_size)
            if not batch.events:
                break
            try:
                with store.engine.begin() as conn:
                    if not _claim(conn, driver, mark, batch.mark):
                        raise _CheckpointMoved
                    for projection in PROJECTIONS[1:]:
                        _set_mark(conn, projection.name, batch.mark)
                    _fold_batch(conn, batch.events)
            except _CheckpointMoved:
                continue  # another runner folded these events first; nothing is kept
    return {projection.name: mark for projection in PROJECTIONS}


def rebuild(
    store: EventStore, batch_size: int = 1000, wait_s: float = 5.0
) -> dict[str, LedgerPosition]:
    """Empty every projection and fold the whole ledger again from position 0."""
    with translate_errors(store.url), store.engine.begin() as conn:
        for projection in PROJECTIONS:
            conn.execute(delete(projection.table))
        conn.execute(delete(PROJ_STREAMS))
        conn.execute(delete(PROJ_CHECKPOINTS))
    return catch_up(store, batch_size, wait_s)
