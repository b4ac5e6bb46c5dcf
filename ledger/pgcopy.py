"""PostgreSQL's ``COPY … FROM STDIN``: rows in its text format, and sending them while the server
writes the rows before.

The server keeps the rows of a ``COPY`` in a buffer and writes them into the table and its
indexes only when the buffer fills (64 KB of rows, or 1,000 rows) and at the end of the ``COPY``:
after the client's last row the server still has most of an append to write. So a ``COPY`` here
sends its end first, then does the caller's ``meanwhile`` work (preparing the next rows, staging
the inline fold) while the server writes, and only then reads the result. ``copy_parts`` sends
blocks of rows, each by a ``COPY`` of its own, building the next block while the server writes
the one before (``bench/ledger_append.py``, ``docs/benchmarks.md``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence

import psycopg
from psycopg import generators, pq
from psycopg.abc import PQGen
from psycopg.copy import LibpqWriter
from psycopg.waiting import Wait
from sqlalchemy import Connection, exc

__all__ = [
    "as_sqlalchemy_errors",
    "copy_block",
    "copy_lines",
    "copy_parts",
    "copy_text",
    "driver_connection",
]


def driver_connection(conn: Connection) -> psycopg.Connection:
    """The psycopg connection under ``conn``, for what goes past SQLAlchemy (``COPY``, pipelines);
    raises SQLAlchemy's ``ResourceClosedError`` where ``conn`` has none (closed or invalidated)."""
    driver = conn.connection.driver_connection
    if driver is None:
        raise exc.ResourceClosedError(
            "the connection has no psycopg connection: closed or invalidated"
        )
    return driver


def copy_text(value: str) -> str:
    """``value`` as a field of ``COPY``'s text format (backslash, tab and line ends escaped)."""
    if "\\" in value:
        value = value.replace("\\", "\\\\")
    if "\t" in value or "\n" in value or "\r" in value:
        value = value.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")
    return value


def _copy_line(row: Sequence[object]) -> str:
    """One row of ``COPY``'s text format: text escaped, None as ``\\N``, numbers and booleans
    as Python writes them (PostgreSQL reads True and False)."""
    fields = [
        copy_text(value) if isinstance(value, str) else "\\N" if value is None else str(value)
        for value in row
    ]
    return "\t".join(fields) + "\n"


def copy_lines(rows: Sequence[Sequence[object]]) -> str:
    """``rows`` in ``COPY``'s text format. The fields are first written as they are, and kept
    when the block holds no backslash, tab or line end besides its NULLs and separators (text
    without them needs no escaping: one check of the whole block instead of one per field)."""
    block = "".join(
        [
            "\t".join(["\\N" if value is None else str(value) for value in row]) + "\n"
            for row in rows
        ]
    )
    nulls = sum(row.count(None) for row in rows)
    separators = sum(len(row) for row in rows) - len(rows)
    if (
        block.count("\\") == nulls
        and block.count("\t") == separators
        and block.count("\n") == len(rows)
        and "\r" not in block
    ):
        return block
    return "".join([_copy_line(row) for row in rows])


@contextlib.contextmanager
def as_sqlalchemy_errors(conn: Connection, statement: str) -> Iterator[None]:
    """Raise the driver's errors of statements sent past SQLAlchemy (``COPY``) as SQLAlchemy
    raises them, so the store's retry and ``translate_errors`` treat both paths alike."""
    try:
        yield
    except psycopg.Error as error:
        driver = conn.connection.driver_connection
        broken = driver is None or driver.broken  # none: SQLAlchemy has invalidated it
        raise exc.DBAPIError.instance(
            statement, None, error, psycopg.Error, connection_invalidated=broken
        ) from error


def _send_end(pgconn: pq.abc.PGconn) -> PQGen[None]:
    """Send the end of the ``COPY`` without waiting for its result."""
    while pgconn.put_copy_end(None) == 0:
        while not (yield Wait.W):
            continue
    while True:
        while not (yield Wait.W):
            continue
        if pgconn.flush() == 0:
            return


class _EndFirst(LibpqWriter):
    """A ``COPY`` writer that, at the end, sends the end, runs ``meanwhile`` while the server
    writes the rows it buffered, then reads the result (raising the server's error, if any, or
    else ``meanwhile``'s).

    psycopg's documented way to change how a ``COPY`` is sent is a ``Writer``; this one ends the
    ``COPY`` as ``LibpqWriter.finish`` does (its connection, libpq handle and generators), split
    in two. ``tests/integration/ledger/test_pgcopy.py`` holds it to that on each psycopg release.
    """

    def __init__(self, cursor: psycopg.Cursor, meanwhile: Callable[[], object]) -> None:
        super().__init__(cursor)
        self.meanwhile = meanwhile

    def finish(self, exc: BaseException | None = None) -> None:
        if exc is not None:
            super().finish(exc)  # cancels the COPY: the server writes nothing
            return
        self.connection.wait(_send_end(self._pgconn))
        try:
            self.meanwhile()
        finally:
            (result,) = self.connection.wait(generators.fetch_many(self._pgconn))
            if result.status != pq.ExecStatus.COMMAND_OK:
                encoding = self.connection.info.encoding
                raise psycopg.errors.error_from_result(result, encoding=encoding)


def copy_block(
    conn: Connection,
    table: str,
    columns: Sequence[str],
    block: str,
    meanwhile: Callable[[], object] | None = None,
) -> None:
    """Write ``block``, rows in ``COPY``'s text format, into ``table`` on the connection's
    transaction, running ``meanwhile`` (no statements) while the server writes them."""
    statement = f"COPY {table} ({', '.join(columns)}) FROM STDIN"  # Grove's own names
    driver = driver_connection(conn)
    with as_sqlalchemy_errors(conn, statement), driver.cursor() as cursor:
        writer = _EndFirst(cursor, meanwhile) if meanwhile is not None else None
        with cursor.copy(statement, writer=writer) as copy:
            copy.write(block)


def copy_parts(conn: Connection, table: str, columns: Sequence[str], blocks: Iterator[str]) -> None:
    """Write each of ``blocks`` into ``table`` by a ``COPY`` of its own, drawing the next block
    from the iterator (building it) while the server writes the one before."""
    drawn = [next(blocks, None)]

    def draw() -> None:
        drawn[0] = next(blocks, None)

    while (block := drawn[0]) is not None:
        copy_block(conn, table, columns, block, draw)
