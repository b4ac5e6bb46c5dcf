"""The contradictions the fold records: why an event is left out, and its row.

When a projection statement changes nothing, the fold reads the attempt's rows into
``LifecycleFacts`` (``lifecycle_facts``) and the attempt fold's rule
(``grove.ledger.lifecycle.lifecycle_violation``) says why; the event is then recorded in
``grove_proj_contradictions`` with those words (``contradiction_row``, ``record_contradictions``),
never raised (``docs/sql.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from sqlalchemy import Connection, insert, select

from grove.ledger.events import RolloutSelected
from grove.ledger.lifecycle import CallFacts, LifecycleFacts, contradiction_entry
from grove.ledger.pgcopy import copy_block, copy_lines
from grove.ledger.schema import PROJ_ATTEMPTS, PROJ_CALLS, PROJ_CONTRADICTIONS, PROJ_ROLLOUTS

if TYPE_CHECKING:
    from grove.ledger.event_appliers import Folded

__all__ = [
    "CONTRADICTION_COLUMNS",
    "COPY_CONTRADICTIONS_MIN",
    "ContradictionRow",
    "contradiction_lines",
    "contradiction_row",
    "lifecycle_facts",
    "record_contradictions",
]

CONTRADICTION_COLUMNS = (
    "capture_key",
    "stream_version",
    "position",
    "event_type",
    "call_id",
    "contradiction",
)

ContradictionRow = tuple[str, int, int, str, str | None, str]
"""A contradiction's values, in ``CONTRADICTION_COLUMNS`` order."""

COPY_CONTRADICTIONS_MIN = 16
"""Contradictions recorded at once from this many on go by ``COPY`` on PostgreSQL (psycopg
sends an ``executemany`` as one statement per row, and a batched append of a stream never opened
records every event)."""


def lifecycle_facts(conn: Connection, item: Folded) -> LifecycleFacts:
    """The lifecycle facts of the event's attempt, read from the projection rows."""
    key = item.stream_id
    opened = conn.execute(
        select(PROJ_ATTEMPTS.c.capture_key).where(PROJ_ATTEMPTS.c.capture_key == key)
    ).first()
    if opened is None:
        return LifecycleFacts(opened=False)
    rollout = conn.execute(
        select(PROJ_ROLLOUTS.c.status).where(PROJ_ROLLOUTS.c.capture_key == key)
    ).first()
    unknown: tuple[str, ...] = ()
    if isinstance(item.event, RolloutSelected):
        named = tuple(dict.fromkeys(item.event.call_ids))
        known = set(
            conn.execute(
                select(PROJ_CALLS.c.call_id).where(
                    PROJ_CALLS.c.capture_key == key, PROJ_CALLS.c.call_id.in_(named)
                )
            ).scalars()
        )
        unknown = tuple(c for c in named if c not in known)
    call_id = getattr(item.event, "call_id", None)
    call = None
    if isinstance(call_id, str):
        row = conn.execute(
            select(
                PROJ_CALLS.c.parent_call_id, PROJ_CALLS.c.status, PROJ_CALLS.c.failure_reason
            ).where(PROJ_CALLS.c.capture_key == key, PROJ_CALLS.c.call_id == call_id)
        ).first()
        if row is not None:
            call = CallFacts(
                parent_call_id=row.parent_call_id,
                committed=row.status == "committed",
                failed=row.status == "failed",
                has_failure=row.failure_reason is not None,
            )
    return LifecycleFacts(
        opened=True,
        call=call,
        selected=rollout is not None,
        finalized=rollout is not None and rollout.status != "selected",
        unknown_selected=unknown,
    )


def contradiction_row(item: Folded, why: str | None) -> ContradictionRow:
    """The contradiction row of ``item``, left out for ``why`` (the rule's words)."""
    call_id = getattr(item.event, "call_id", None)
    return (
        item.stream_id,
        item.stream_version,
        item.position,
        item.event.type,
        call_id,
        contradiction_entry(item.event, why or "the projection rows do not allow it"),
    )


def contradiction_lines(rows: Sequence[ContradictionRow], dialect: str) -> str | None:
    """The ``COPY`` text that ``record_contradictions`` sends for ``rows`` on ``dialect``, or
    None where it sends none (built ahead while the server is busy, ``ledger/inline_fold.py``)."""
    if len(rows) >= COPY_CONTRADICTIONS_MIN and dialect == "postgresql":
        return copy_lines(rows)
    return None


def record_contradictions(
    conn: Connection, rows: Sequence[ContradictionRow], lines: str | None = None
) -> None:
    """Insert ``rows`` into ``grove_proj_contradictions`` on the connection's transaction
    (``lines``: their ``contradiction_lines``, when built already)."""
    lines = lines or contradiction_lines(rows, conn.dialect.name)
    if lines is not None:
        copy_block(conn, PROJ_CONTRADICTIONS.name, CONTRADICTION_COLUMNS, lines)
    elif rows:
        conn.execute(
            insert(PROJ_CONTRADICTIONS),
            [dict(zip(CONTRADICTION_COLUMNS, row, strict=True)) for row in rows],
        )
