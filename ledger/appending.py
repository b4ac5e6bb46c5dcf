"""The append in one statement: the stream's current version, the version check and the insert.

``append_statement(rows)`` inserts the rows of ``rows`` (a selectable with columns ``event_id``,
``ordinal``, ``event_type``, ``schema_version`` and ``payload``) into stream ``:stream_id`` as
versions ``current + ordinal``, where ``current`` is the stream's version when the statement
runs, and only when ``current`` is ``:expected`` (a NULL ``:expected`` skips the check). It
returns each inserted row's ``position``, ``event_id`` and ``stream_version``; no row at all means
the version differed and nothing was written. A writer that inserts the same stream version
first, or an event id already recorded, makes it fail on a unique index (IntegrityError): the
store then decides from the committed rows (``ledger/store.py``).

One statement instead of a version query and an insert: a captured call appends twice, and each
statement is a round trip and the driver's work (``docs/benchmarks.md``, "gateway").
"""

from __future__ import annotations

from sqlalchemy import FromClause, Integer, String, bindparam, func, insert, or_, select, true
from sqlalchemy.sql.dml import Insert

from grove.ledger.schema import EVENTS

__all__ = ["append_statement"]


def append_statement(rows: FromClause) -> Insert:
    """``INSERT … SELECT`` of ``rows`` after the stream's current version (see above)."""
    stream_id = bindparam("stream_id", type_=String)
    expected = bindparam("expected", type_=Integer)
    current = (
        select(func.coalesce(func.max(EVENTS.c.stream_version), 0).label("version"))
        .where(EVENTS.c.stream_id == stream_id)
        .subquery("current")
    )
    source = (
        select(
            rows.c.event_id,
            stream_id,
            current.c.version + rows.c.ordinal,
            rows.c.event_type,
            rows.c.schema_version,
            rows.c.payload,
        )
        .select_from(rows.join(current, true()))
        .where(or_(expected.is_(None), current.c.version == expected))
    )
    columns = ["event_id", "stream_id", "stream_version", "event_type", "schema_version", "payload"]
    return (
        insert(EVENTS)
        .from_select(columns, source)
        .returning(EVENTS.c.position, EVENTS.c.event_id, EVENTS.c.stream_version)
    )
