"""Folding events into the projection tables, inside the transaction that appends them.

``AppendFold`` runs in ``EventStore.append``'s transaction, so the lineage views are current when
an append returns (``docs/sql.md``). Each stream's last folded version is kept in
``grove_proj_streams``; an append moves it by compare-and-set from the version just before its
first event and folds its events with one small indexed statement each
(``ledger/event_appliers.py``). When the stream's earlier events were never folded (a ledger
upgraded from before inline projection, imported events, a rebuild under way), the missing ones
are read from the event table and folded first: a stream is always folded whole and in order, by
whichever transaction gets there first.

The rows follow the attempt fold's rules (``grove.ledger.lifecycle.lifecycle_violation``): the first
open, intent, commit, selection and finalization stand, and an event the rules leave out is
recorded in ``grove_proj_contradictions`` with the fold's own words, never raised. Each
statement applies an event only when the rows allow it; when it changes nothing, the rows are
read into ``LifecycleFacts`` and the fold's rule says why (``ledger/contradictions.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel
from sqlalchemy import Connection, bindparam, select, update
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import Insert

from grove.ledger.append_batch import AppendBatch, Landed
from grove.ledger.compiled import CompiledStatement
from grove.ledger.contradictions import (
    ContradictionRow,
    contradiction_lines,
    contradiction_row,
    lifecycle_facts,
    record_contradictions,
)
from grove.ledger.event_appliers import APPLIERS, DialectInsert, Folded, dialect_insert
from grove.ledger.events import AttemptOpened, Event
from grove.ledger.lifecycle import ATTEMPT_EVENTS, NEVER_OPENED, lifecycle_violation
from grove.ledger.schema import EVENTS, PROJ_ATTEMPTS, PROJ_STREAMS
from grove.ledger.upcasting import decode_payload

__all__ = ["AppendFold", "fold_stream"]


# -- folding --------------------------------------------------------------------------------------


def _nul_free(value: object) -> object:
    """``value`` with U+0000 in its strings replaced by U+FFFD, in tuples and nested records
    too (a fork's ``fork_from``); ``value`` itself when it holds none."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd") if "\x00" in value else value
    if isinstance(value, tuple):
        safe = tuple(_nul_free(v) for v in value)
        return value if all(s is v for s, v in zip(safe, value, strict=True)) else safe
    if isinstance(value, BaseModel):
        changed = {name: _nul_free(v) for name, v in value}
        changed = {name: v for name, v in changed.items() if v is not getattr(value, name)}
        return value.model_copy(update=changed) if changed else value
    return value


def _text_safe(item: Folded) -> Folded:
    """``item`` with U+0000 in its event's strings replaced by U+FFFD: PostgreSQL's text columns
    cannot hold it (the event table keeps the exact string, escaped in JSONB)."""
    if item.nul_free:
        return item
    event = _nul_free(item.event)
    if event is item.event:
        return item
    assert isinstance(event, Event)
    return Folded(item.stream_id, item.stream_version, item.position, event)


def _fold(conn: Connection, items: Sequence[Folded], opened: bool | None = None) -> None:
    """Apply one stream's events in order; record those the rules leave out, in one insert.

    Once the stream is known not to be an opened attempt (``opened`` False: the caller read it
    already), its attempt events are contradictions without another statement (a stream of
    other events costs at most one read, not one per event).
    """
    contradictions: list[ContradictionRow] = []
    never_opened = opened is False
    if conn.dialect.name == "postgresql" and not all(item.nul_free for item in items):
        items = [_text_safe(item) for item in items]
    for item in items:
        event = item.event
        if never_opened and isinstance(event, ATTEMPT_EVENTS):
            contradictions.append(contradiction_row(item, NEVER_OPENED))
            continue
        apply = APPLIERS.get(event.type)
        if apply is None or apply(conn, item):
            never_opened = never_opened and not isinstance(event, AttemptOpened)
            continue
        facts = lifecycle_facts(conn, item)
        never_opened = not facts.opened
        contradictions.append(contradiction_row(item, lifecycle_violation(facts, event)))
    record_contradictions(conn, contradictions)


# -- streams -------------------------------------------------------------------------------------


def fold_stream(conn: Connection, stream_id: str, known: Sequence[Folded] = ()) -> None:
    """Fold the stream's events not folded yet, up to its last event visible in ``conn``'s
    transaction, taking ``known`` (read already, in version order) instead of reading them."""
    conn.execute(
        dialect_insert(conn)(PROJ_STREAMS)
        .values(stream_id=stream_id, version=0)
        .on_conflict_do_nothing()
    )
    mark = select(PROJ_STREAMS.c.version).where(PROJ_STREAMS.c.stream_id == stream_id)
    if conn.dialect.name == "postgresql":
        mark = mark.with_for_update()
    folded = conn.execute(mark).scalar_one()
    pending = [item for item in known if item.stream_version > folded]
    if known and not pending:
        return  # another transaction folded them first
    first_known = pending[0].stream_version if pending else None
    query = (
        select(EVENTS)
        .where(EVENTS.c.stream_id == stream_id, EVENTS.c.stream_version > folded)
        .order_by(EVENTS.c.stream_version)
    )
    if first_known is not None:
        query = query.where(EVENTS.c.stream_version < first_known)
    read = [
        Folded(
            stream_id,
            row.stream_version,
            row.position,
            decode_payload(row.event_type, row.schema_version, row.payload),
        )
        for row in conn.execute(query)
    ]
    items = read + pending
    if not items:
        return
    _fold(conn, items)
    conn.execute(
        update(PROJ_STREAMS)
        .where(PROJ_STREAMS.c.stream_id == stream_id)
        .values(version=items[-1].stream_version)
    )


def _claim_new(dialect_insert: DialectInsert) -> Insert:
    return (
        dialect_insert(PROJ_STREAMS)
        .values(stream_id=bindparam("p_stream"), version=bindparam("p_last"))
        .on_conflict_do_nothing()
        .returning(PROJ_STREAMS.c.stream_id)
    )


# A stream's first append claims it by inserting its mark (no attempt of it can be open yet);
# a later one by moving the mark on from the version just before its first event, reading in
# the same statement whether its attempt is open.
_CLAIM_NEW = {
    "postgresql": CompiledStatement(_claim_new(postgres_insert)),
    "sqlite": CompiledStatement(_claim_new(sqlite_insert)),
}
_CLAIM_NEXT = CompiledStatement(
    update(PROJ_STREAMS)
    .where(
        PROJ_STREAMS.c.stream_id == bindparam("p_stream"),
        PROJ_STREAMS.c.version == bindparam("p_first"),
    )
    .values(version=bindparam("p_last"))
    .returning(
        select(PROJ_ATTEMPTS.c.capture_key)
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_stream"))
        .exists()
        .label("opened")
    )
)


def _claim(conn: Connection, stream_id: str, first: int, last: int) -> tuple[bool, bool]:
    """Claim the fold of the stream's versions ``first`` to ``last``: whether it was claimed (the
    stream was folded up to ``first - 1``), and whether its attempt is open."""
    parameters = {"p_stream": stream_id, "p_first": first - 1, "p_last": last}
    if first == 1:
        return _CLAIM_NEW[conn.dialect.name].execute(conn, parameters).first() is not None, False
    row = _CLAIM_NEXT.execute(conn, parameters).first()
    return row is not None, row is not None and bool(row.opened)


class AppendFold:
    """The inline fold of one append (one stream's events, in version order), in the append's
    transaction. A ``COPY`` append calls ``stage`` while the server still writes its rows: it
    pairs each event with where it landed and, when the events are all an attempt's and open
    none, builds their contradiction rows as if the stream were never opened (the usual case of
    such an append), with no statement. ``apply`` then claims the stream and records those rows
    when the claim confirms it; otherwise it folds the events one by one, as without staging."""

    def __init__(self, batch: AppendBatch, dialect: str) -> None:
        self.batch, self.stream_id, self.dialect = batch, batch.stream_id, dialect
        self.items: list[Folded] = []
        self.unopened: list[ContradictionRow] | None = None
        self.unopened_lines: str | None = None

    def _pair(self, landed: Sequence[Landed]) -> None:
        self.items = [
            Folded(
                self.stream_id,
                slot.stream_version,
                slot.position,
                row.event,
                nul_free="\\u0000" not in row.payload,  # json writes U+0000 as this escape
            )
            for row, slot in zip(self.batch.rows(), landed, strict=True)
        ]

    def stage(self, landed: Sequence[Landed]) -> None:
        """Build what needs no statement (``landed``: where each event landed, in order)."""
        self._pair(landed)
        if all(isinstance(item.event, ATTEMPT_EVENTS) for item in self.items):
            safe = self.items if self.dialect != "postgresql" else map(_text_safe, self.items)
            self.unopened = [contradiction_row(item, NEVER_OPENED) for item in safe]
            self.unopened_lines = contradiction_lines(self.unopened, self.dialect)

    def apply(self, conn: Connection, landed: Sequence[Landed]) -> None:
        """Fold the events (``landed`` as for ``stage``, when it was not called)."""
        if not self.items:
            self._pair(landed)
        items = self.items
        claimed, opened = _claim(
            conn, self.stream_id, items[0].stream_version, items[-1].stream_version
        )
        if not claimed:
            fold_stream(conn, self.stream_id, items)
        elif not opened and self.unopened is not None:
            record_contradictions(conn, self.unopened, self.unopened_lines)
        else:
            _fold(conn, items, opened)
