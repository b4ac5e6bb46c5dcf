"""PostgreSQL specifics: the gap-free reader over transaction ids, and appends by ``COPY``.

Positions come from a sequence, so a transaction can commit position 7 after another committed
position 8; a reader that kept only "last position 8" would skip 7 forever. Each row records its
writing transaction id (``pg_current_xact_id()``, the 64-bit xid8), and the reader only reads rows
whose transaction is older than the oldest still running (``pg_snapshot_xmin`` of the statement's
snapshot): that set can no longer change, and it is read in ``(transaction_id, position)`` order
with a ``(transaction_id, position)`` mark. Every transaction not yet finished has an id at or
above that horizon, so nothing can appear behind the mark later.

JSONB cannot hold the character U+0000 in a string, and a model can generate it (a harness then
returns it in its result). Payloads are therefore stored with a reversible escape on PostgreSQL:
U+FFFF (a Unicode noncharacter) is the escape character, written twice for itself and followed by
``0`` for U+0000, and only in payloads that hold either character. Reading undoes it
(``load_payload_json``, the engine's JSON deserializer), so every reader sees the payload that
was appended, on both databases.

An append of ``COPY_APPEND_MIN`` events or more goes by ``COPY`` (``bench/ledger_append.py``:
the server parses a tab-separated row faster than a row of ``jsonb_to_recordset``): one
statement reads the stream's version and draws the events' positions from the table's sequence,
the store's expected-version check runs on that version, and ``COPY`` writes the rows with their
versions and positions. The unique indexes keep the same guarantees as the one-statement insert
of smaller appends: a racing writer of the same versions, or an event id already recorded, fails
the ``COPY`` (IntegrityError), and the store decides from the committed rows. The client's work
overlaps the server's: the first events are validated while the server draws the positions, and
the rows go in parts, each prepared while the server writes the one before (``ledger/pgcopy.py``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    Row,
    Text,
    bindparam,
    cast,
    column,
    func,
    select,
    tuple_,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import ColumnElement

from grove.ledger.append_batch import AppendBatch, AppendedRow, Landed, Meanwhile
from grove.ledger.appending import append_statement
from grove.ledger.compiled import CompiledStatement
from grove.ledger.errors import ImportConflict
from grove.ledger.events import LedgerPosition
from grove.ledger.pgcopy import as_sqlalchemy_errors, copy_parts, copy_text, driver_connection
from grove.ledger.schema import EVENTS

__all__ = [
    "COPY_APPEND_MIN",
    "COPY_COLUMNS",
    "PostgresBackend",
]

COPY_APPEND_MIN = 16
"""Appends of at least this many events go by ``COPY``; smaller ones by one ``INSERT … SELECT``
(one round trip, where ``COPY`` takes three)."""

COPY_PART = 64
"""The first part of a ``COPY`` append: its events are prepared while the server waits; each
later part, twice the one before, is prepared while the server writes the one before (the client
prepares an event in about half the time the server takes to write it,
``bench/ledger_append.py``)."""

COPY_COLUMNS = (
    "event_id",
    "stream_id",
    "stream_version",
    "event_type",
    "schema_version",
    "payload",
)


def _oldest_running_transaction() -> ColumnElement[int]:
    return cast(cast(func.pg_snapshot_xmin(func.pg_current_snapshot()), Text), BigInteger)


_APPEND_TYPES = {
    "event_id": Text,
    "ordinal": Integer,
    "event_type": Text,
    "schema_version": Integer,
    "payload": JSONB,
}


def _append_insert() -> Insert:
    # The whole batch travels as one JSON document expanded by jsonb_to_recordset: one short
    # query and one parameter. insertmanyvalues renders six placeholders per row, and psycopg
    # spent most of an append parsing them (bench/ledger_append.py: 0.12 of COPY's rate).
    rows = (
        func.jsonb_to_recordset(bindparam("rows", type_=Text).cast(JSONB))
        .table_valued(*(column(name, type_) for name, type_ in _APPEND_TYPES.items()))
        .render_derived("rows", with_types=True)
    )
    return append_statement(rows)


_APPEND = CompiledStatement(_append_insert())


ESCAPE = "\uffff"
_ESCAPED = re.compile("\uffff(.)", re.DOTALL)


def _map_strings(value: Any, transform: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return transform(value)
    if isinstance(value, dict):
        return {transform(k): _map_strings(v, transform) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_map_strings(v, transform) for v in value]
    return value


def _escape(text: str) -> str:
    return text.replace(ESCAPE, ESCAPE + ESCAPE).replace("\x00", ESCAPE + "0")


def _unescape(text: str) -> str:
    return _ESCAPED.sub(lambda m: "\x00" if m.group(1) == "0" else m.group(1), text)


def dump_payload_json(value: Any) -> str:
    """JSON text of ``value`` that PostgreSQL's JSONB accepts (U+0000 escaped, see above)."""
    text = json.dumps(value, separators=(",", ":"))
    if "\\u0000" in text or "\\uffff" in text:  # json.dumps writes both as \u escapes
        text = json.dumps(_map_strings(value, _escape), separators=(",", ":"))
    return text


def load_payload_json(text: str | bytes) -> Any:
    """The value ``dump_payload_json`` wrote (the engine's JSON deserializer on PostgreSQL)."""
    if isinstance(text, bytes):
        text = text.decode()
    value = json.loads(text)
    return _map_strings(value, _unescape) if ESCAPE in text else value


def _jsonb_text(payload_json: str) -> str:
    """``payload_json`` (compact JSON of an event) as text JSONB accepts (see above)."""
    if "\\u0000" in payload_json or ESCAPE in payload_json or "\\uffff" in payload_json:
        return dump_payload_json(json.loads(payload_json))
    return payload_json


_SLOTS = (
    "SELECT (SELECT coalesce(max(stream_version), 0) FROM grove_events WHERE stream_id = %s), "
    "ARRAY(SELECT nextval((SELECT pg_get_serial_sequence('grove_events', 'position'))) "
    "FROM generate_series(1, %s))"
)
_APPEND_COPY_COLUMNS = ("position", *COPY_COLUMNS)


def _parts(count: int) -> Iterator[tuple[int, int]]:
    """The ``(start, stop)`` of each part of a ``COPY`` append of ``count`` events: the first
    ``COPY_PART`` events, then each part twice the one before, the last taking the rest once
    fewer than twice its size would follow it."""
    start, size = 0, COPY_PART
    while start < count:
        stop = start + size if count - start - size >= 2 * size else count
        yield start, stop
        start, size = stop, 2 * size


def _append_document(rows: Sequence[AppendedRow]) -> str:
    """The rows as one JSON array for ``jsonb_to_recordset`` (payloads as they are, in JSON)."""
    items = (
        f'{{"event_id":{json.dumps(event_id)},"ordinal":{ordinal:d},'
        f'"event_type":{json.dumps(event.type)},'
        f'"schema_version":{event.schema_version:d},"payload":{_jsonb_text(payload)}}}'
        for ordinal, (event_id, event, payload) in enumerate(rows, start=1)
    )
    return "[" + ",".join(items) + "]"


class PostgresBackend:
    """The PostgreSQL implementation of the store's backend operations."""

    name = "postgresql"

    def recorded(self, conn: Connection, event_ids: Sequence[str]) -> Sequence[Row]:
        """The rows already recorded under any of ``event_ids``, in position order."""
        # IN (SELECT unnest(...)), not = ANY(...): psycopg prepares repeated statements, and
        # a generic plan's ANY over a parameter array scans the table testing every element
        # (0.35 s per 500 ids at 50,000 events); the sub-select is probed through the index.
        ids = func.unnest(bindparam("ids", list(event_ids), type_=ARRAY(Text)))
        query = (
            select(EVENTS)
            .where(EVENTS.c.event_id.in_(select(ids).scalar_subquery()))
            .order_by(EVENTS.c.position)
        )
        return conn.execute(query).all()

    def prepares_while_writing(self, count: int) -> bool:
        """Whether an append of ``count`` events prepares its rows while the server writes
        (``COPY``, by parts); the store prepares the rows of any other append before its
        transaction begins."""
        return count >= COPY_APPEND_MIN

    def insert_rows(
        self,
        conn: Connection,
        batch: AppendBatch,
        expected_version: int | None,
        meanwhile: Meanwhile | None = None,
    ) -> Sequence[Row | Landed] | None:
        """Append the batch's rows when the stream's version is ``expected_version`` (None:
        whatever it is): their ``position``, ``event_id`` and ``stream_version``; None, with
        nothing written, when the version differs. A racing writer of the same version, or a
        recorded event id: IntegrityError. ``COPY_APPEND_MIN`` rows or more go by ``COPY``
        (see above), which calls ``meanwhile`` with where they land, in the batch's order,
        once every row is sent and while the server still writes them."""
        if len(batch) >= COPY_APPEND_MIN:
            return self._copy_append(conn, batch, expected_version, meanwhile)
        parameters = {
            "rows": _append_document(batch.rows()),
            "stream_id": batch.stream_id,
            "expected": expected_version,
        }
        return _APPEND.execute(conn, parameters).all() or None

    @staticmethod
    def _copy_append(
        conn: Connection,
        batch: AppendBatch,
        expected_version: int | None,
        meanwhile: Meanwhile | None,
    ) -> list[Landed] | None:
        """The ``COPY`` append: by parts (``_parts``), each prepared (validated and serialised)
        while the server writes the one before (``ledger/pgcopy.py``)."""
        stream_id, count = batch.stream_id, len(batch)
        driver = driver_connection(conn)
        with as_sqlalchemy_errors(conn, _SLOTS), driver.cursor() as cursor:
            with driver.pipeline():  # sent at once, its result read after the first part
                cursor.execute(_SLOTS, (stream_id, count))
                batch.rows(0, COPY_PART)  # prepared while the server draws the positions
            slots = cursor.fetchone()
        assert slots is not None  # a SELECT of values has one row
        current, positions = slots
        if expected_version is not None and current != expected_version:
            return None  # the drawn positions stay unused, as after any rolled-back insert
        positions.sort()
        landed = list(
            map(Landed, positions, batch.event_ids, range(current + 1, current + count + 1))
        )

        def blocks() -> Iterator[str]:
            for start, stop in _parts(count):
                rows = batch.rows(start, stop)
                # Stream ids and event types are plain names (validate_stream_id, the catalog).
                yield "".join(
                    f"{slot.position}\t{copy_text(event_id)}\t{stream_id}"
                    f"\t{slot.stream_version}\t{event.type}\t{event.schema_version:d}"
                    f"\t{copy_text(_jsonb_text(payload))}\n"
                    for slot, (event_id, event, payload) in zip(
                        landed[start:stop], rows, strict=True
                    )
                )
            if meanwhile is not None:
                meanwhile(landed)  # while the server writes the last part: no statements

        copy_parts(conn, "grove_events", _APPEND_COPY_COLUMNS, blocks())
        return landed

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

    def horizon_passed(self, conn: Connection) -> bool:
        """Whether every committed event is below the reader's horizon (readable now)."""
        newest = select(func.coalesce(func.max(EVENTS.c.transaction_id), -1)).scalar_subquery()
        return bool(conn.execute(select(newest < _oldest_running_transaction())).scalar_one())

    def mark_of(self, row: Row) -> LedgerPosition:
        """The reader mark after consuming ``row``."""
        return LedgerPosition(transaction_id=row.transaction_id, position=row.position)

    def bulk_insert(self, conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
        """Insert prepared rows with ``COPY … FROM STDIN`` on the connection's transaction."""
        statement = f"COPY grove_events ({', '.join(COPY_COLUMNS)}) FROM STDIN"  # constant names
        driver = driver_connection(conn)
        try:
            self._copy(driver, statement, rows)
        except psycopg.IntegrityError as error:  # raw driver errors: COPY bypasses SQLAlchemy
            raise ImportConflict(str(error).splitlines()[0]) from error

    @staticmethod
    def _copy(driver: psycopg.Connection, statement: str, rows: Sequence[dict[str, Any]]) -> None:
        with driver.cursor() as cursor, cursor.copy(statement) as copy:
            for row in rows:
                copy.write_row(
                    (
                        row["event_id"],
                        row["stream_id"],
                        row["stream_version"],
                        row["event_type"],
                        row["schema_version"],
                        dump_payload_json(row["payload"]),
                    )
                )
