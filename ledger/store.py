"""The append-only event store: optimistic appends, idempotent retries, gap-free reading.

A stream's versions start at 1. ``append`` takes the version the writer last saw (0 for a new
stream, ``ANY_VERSION`` to skip the check); a racing writer loses on the unique
``(stream_id, stream_version)`` index and gets ``WrongExpectedVersion``. An event id is an
idempotency key: retrying an append whose events are all recorded with identical stream, type and
payload returns the recorded positions; reusing an id for anything else is ``EventIdConflict``.
Every event is validated against the catalog before anything is written
(``ledger/append_batch.py``).

An append is one statement in its transaction (``ledger/appending.py``: the stream's version, the
check and the insert together), or on PostgreSQL, for many events, a version read and ``COPY``
by parts (``ledger/postgres.py``). Only when it writes nothing, or fails on a unique index, does
the store read why: the events already recorded (an idempotent retry, or a conflict), or the
stream's actual version (``WrongExpectedVersion``). Reads are single statements on autocommit
connections (``ledger/database.py``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, cast

from sqlalchemy import Engine, Row, bindparam, exc, func, select

from grove.ledger.append_batch import AppendBatch, AppendedRow, Landed, new_event_id
from grove.ledger.database import autocommit, dialect_of, open_engine, translate_errors
from grove.ledger.errors import (
    EventIdConflict,
    ImportConflict,
    StreamIdError,
    WrongExpectedVersion,
)
from grove.ledger.events import Event, LedgerPosition
from grove.ledger.inline_fold import AppendFold
from grove.ledger.postgres import PostgresBackend
from grove.ledger.schema import EVENTS
from grove.ledger.sqlite import SqliteBackend
from grove.ledger.upcasting import E, decode_as, decode_payload, upcast

__all__ = [
    "ANY_VERSION",
    "STREAM_ID_PATTERN",
    "AppendResult",
    "EventStore",
    "ImportEvent",
    "NewEvent",
    "ReadBatch",
    "StoredEvent",
    "validate_stream_id",
]

ANY_VERSION: Final = -1
STREAM_ID_PATTERN = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}\Z")  # \Z: "$" passes "k\n"
_RETRIES = 5


def validate_stream_id(stream_id: object) -> str:
    """``stream_id`` if it is 1-200 of ``A-Z a-z 0-9 . _ : @ -``, alphanumeric first, no ``..``."""
    if not isinstance(stream_id, str):
        raise StreamIdError(stream_id, "a stream id is a string")
    if not STREAM_ID_PATTERN.fullmatch(stream_id) or ".." in stream_id:
        raise StreamIdError(
            stream_id,
            "use 1-200 characters from A-Z a-z 0-9 . _ : @ -, starting with a letter or digit, "
            "without '..' (a capture key also names a blob-store partition)",
        )
    return stream_id


@dataclass(frozen=True)
class NewEvent:
    """An event to append with its idempotency key (a fresh UUID unless the caller names one)."""

    event: Event
    event_id: str = field(default_factory=new_event_id)


@dataclass(frozen=True)
class ImportEvent:
    """A row for bulk import: an event with its explicit stream version (replays, migrations)."""

    stream_id: str
    stream_version: int
    event_type: str
    schema_version: int
    payload: dict[str, Any]
    event_id: str = field(default_factory=new_event_id)


@dataclass(frozen=True)
class StoredEvent:
    """A recorded event as read back; ``payload`` is as stored (possibly an old version)."""

    position: int
    event_id: str
    stream_id: str
    stream_version: int
    event_type: str
    schema_version: int
    payload: dict[str, Any]
    recorded_at: datetime
    transaction_id: int | None

    def decode(self) -> Event:
        """The payload as the current event model (upcast when it is an older version)."""
        return decode_payload(self.event_type, self.schema_version, self.payload)

    def decode_as(self, kind: type[E]) -> E:
        """The payload as the event model ``kind``, or ``InvalidEventPayload`` if it is another."""
        return decode_as(kind, self.event_type, self.schema_version, self.payload)


@dataclass(frozen=True)
class AppendResult:
    """Where an append landed; ``duplicate`` when it was an idempotent retry."""

    stream_id: str
    positions: tuple[int, ...]
    stream_version: int
    duplicate: bool = False


@dataclass(frozen=True)
class ReadBatch:
    """Events read after a mark, and the mark to read after next time."""

    events: tuple[StoredEvent, ...]
    mark: LedgerPosition


def _stored(row: Row) -> StoredEvent:
    return StoredEvent(
        position=row.position,
        event_id=row.event_id,
        stream_id=row.stream_id,
        stream_version=row.stream_version,
        event_type=row.event_type,
        schema_version=row.schema_version,
        payload=row.payload,
        recorded_at=row.recorded_at,
        transaction_id=row.transaction_id,
    )


# A stream's version, ``:p_stream`` bound at each execution (built once, as the read below).
_STREAM_VERSION: Final = select(func.coalesce(func.max(EVENTS.c.stream_version), 0)).where(
    EVENTS.c.stream_id == bindparam("p_stream", type_=EVENTS.c.stream_id.type)
)


# Built once: a statement built per call costs more CPU than the read (its cache key is
# generated anew each time); this one is compiled once per dialect and reused.
_READ_STREAM: Final = (
    select(EVENTS)
    .where(
        EVENTS.c.stream_id == bindparam("p_stream", type_=EVENTS.c.stream_id.type),
        EVENTS.c.stream_version > bindparam("p_after", type_=EVENTS.c.stream_version.type),
    )
    .order_by(EVENTS.c.stream_version)
)


class EventStore:
    """The ledger's event store over one SQLAlchemy engine (SQLite or PostgreSQL)."""

    def __init__(self, engine: Engine, *, project_inline: bool = True) -> None:
        self.engine = engine
        # Fold each append into the projection tables in its own transaction (docs/sql.md);
        # off only to measure what that costs (bench/ledger_append.py).
        self.project_inline = project_inline
        self.url = engine.url.render_as_string(hide_password=True)
        self.backend = PostgresBackend() if dialect_of(engine) == "postgresql" else SqliteBackend()

    @classmethod
    def open(cls, url: str, *, pool: bool = True) -> EventStore:
        """A store on the database at ``url`` (its schema made by ``grove db upgrade``)."""
        return cls(open_engine(url, pool=pool))

    def close(self) -> None:
        """Release the engine's connections."""
        self.engine.dispose()

    # -- writing -----------------------------------------------------------------------------

    def append(
        self,
        stream_id: str,
        events: Sequence[Event | NewEvent],
        expected_version: int = ANY_VERSION,
    ) -> AppendResult:
        """Append ``events`` to ``stream_id`` in one transaction, if its version is as expected."""
        validate_stream_id(stream_id)
        if not events:
            raise ValueError(f"append to {stream_id} needs at least one event")
        batch = AppendBatch(
            stream_id,
            [
                (item.event, item.event_id) if isinstance(item, NewEvent) else item
                for item in events
            ],
        )
        batch.check_ids()
        if not self.backend.prepares_while_writing(len(batch)):
            batch.rows()  # an invalid event fails here, before the transaction takes a lock
        expected = None if expected_version == ANY_VERSION else expected_version
        with translate_errors(self.url):
            for attempt in range(_RETRIES):
                try:
                    fold = AppendFold(batch, self.backend.name) if self.project_inline else None
                    with self.engine.begin() as conn:
                        landed = self.backend.insert_rows(
                            conn, batch, expected, fold.stage if fold is not None else None
                        )
                        if landed is not None:
                            by_id = {row.event_id: row for row in landed}
                            placed = [by_id[event_id] for event_id in batch.event_ids]
                            if fold is not None:
                                # rows of position, event_id, stream_version: as Landed
                                fold.apply(conn, cast("list[Landed]", placed))
                except exc.IntegrityError:
                    # A racing writer took our version or an event id is recorded: decide
                    # from the committed state (the next round succeeds or raises precisely).
                    if attempt == _RETRIES - 1:
                        raise
                    landed = None
                if landed is not None:
                    return AppendResult(
                        stream_id,
                        tuple(row.position for row in placed),
                        placed[-1].stream_version,  # versions follow the events' order
                    )
                recorded = self._recorded_or_raise(batch, expected_version)
                if recorded is not None:
                    return recorded
        raise AssertionError("unreachable")

    def _recorded_or_raise(self, batch: AppendBatch, expected_version: int) -> AppendResult | None:
        """Why an append wrote nothing: its events are recorded (an idempotent retry, or
        ``EventIdConflict``), or the stream's version is not the expected one
        (``WrongExpectedVersion``); None when neither holds any more (append again). Every
        event is validated first: an invalid one is reported before either."""
        stream_id, prepared = batch.stream_id, batch.rows()
        with autocommit(self.engine.connect()) as conn:
            existing = self.backend.recorded(conn, batch.event_ids)
            if existing:
                return self._idempotent(stream_id, prepared, existing)
            actual = conn.execute(_STREAM_VERSION, {"p_stream": stream_id}).scalar_one()
        if expected_version != ANY_VERSION and actual != expected_version:
            raise WrongExpectedVersion(stream_id, expected_version, actual)
        return None

    def _idempotent(
        self, stream_id: str, prepared: list[AppendedRow], existing: Sequence[Row]
    ) -> AppendResult:
        recorded = {row.event_id: row for row in existing}
        for event_id, event, payload in prepared:
            row = recorded.get(event_id)
            if row is None:
                raise EventIdConflict(
                    next(iter(recorded)),
                    "batch (part of this append is already recorded, part is not)",
                )
            if row.stream_id != stream_id:
                raise EventIdConflict(event_id, f"stream ({row.stream_id!r}, not {stream_id!r})")
            if row.event_type != event.type:
                raise EventIdConflict(event_id, f"type ({row.event_type!r}, not {event.type!r})")
            stored = upcast(row.event_type, row.schema_version, row.payload)
            if stored != json.loads(payload):
                raise EventIdConflict(event_id, "payload")
        return AppendResult(
            stream_id,
            tuple(recorded[event_id].position for event_id, _, _ in prepared),
            max(row.stream_version for row in existing),
            duplicate=True,
        )

    def import_events(self, events: Iterable[ImportEvent]) -> int:
        """Bulk-insert events with explicit stream versions in one transaction (``COPY`` on
        PostgreSQL); every payload is validated first, and on any error nothing is written."""
        rows = []
        for item in events:
            validate_stream_id(item.stream_id)
            decode_payload(item.event_type, item.schema_version, item.payload)
            rows.append(
                {
                    "event_id": item.event_id,
                    "stream_id": item.stream_id,
                    "stream_version": item.stream_version,
                    "event_type": item.event_type,
                    "schema_version": item.schema_version,
                    "payload": item.payload,
                }
            )
        if not rows:
            return 0
        try:
            with translate_errors(self.url), self.engine.begin() as conn:
                self.backend.bulk_insert(conn, rows)
        except exc.IntegrityError as error:
            raise ImportConflict(str(error.orig).splitlines()[0]) from error
        return len(rows)

    # -- reading -----------------------------------------------------------------------------

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version (0 when it has no events)."""
        parameters = {"p_stream": validate_stream_id(stream_id)}
        with translate_errors(self.url), autocommit(self.engine.connect()) as conn:
            return conn.execute(_STREAM_VERSION, parameters).scalar_one()

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
        """The stream's events after ``after_version``, in version order."""
        parameters = {"p_stream": validate_stream_id(stream_id), "p_after": after_version}
        with translate_errors(self.url), autocommit(self.engine.connect()) as conn:
            return [_stored(row) for row in conn.execute(_READ_STREAM, parameters)]

    def read_after(self, mark: LedgerPosition, limit: int = 1000) -> ReadBatch:
        """Up to ``limit`` committed events after ``mark``, never skipping one that commits late."""
        with translate_errors(self.url), autocommit(self.engine.connect()) as conn:
            rows = self.backend.read_after(conn, mark, limit)
        events = tuple(_stored(row) for row in rows)
        return ReadBatch(events, self.backend.mark_of(rows[-1]) if rows else mark)

    def wait_for_horizon(self, timeout_s: float = 10.0, poll_s: float = 0.02) -> bool:
        """Wait until every event committed so far can be read by ``read_after``; False on timeout.

        On PostgreSQL the reader's horizon is the oldest transaction still running anywhere on
        the server, so a short transaction elsewhere can hold back an event that already
        committed; readers never skip it, they only see it later. Interactive tools and tests
        wait here before reading "everything so far". SQLite returns at once.
        """
        deadline = time.monotonic() + timeout_s
        with translate_errors(self.url):
            while True:
                with autocommit(self.engine.connect()) as conn:
                    if self.backend.horizon_passed(conn):
                        return True
                if time.monotonic() >= deadline:
                    return False
                time.sleep(poll_s)

    def count(self) -> int:
        """How many events the ledger holds."""
        with translate_errors(self.url), autocommit(self.engine.connect()) as conn:
            return conn.execute(select(func.count()).select_from(EVENTS)).scalar_one()
