"""Opening a ledger database, and the one place where database errors become ledger errors.

SQLite (the embedded default) runs in WAL mode with a busy timeout, and write transactions start
with ``BEGIN IMMEDIATE``: a deferred transaction that reads the stream version and then writes
can fail with SQLITE_BUSY without waiting once another writer committed in between
(https://www.sqlite.org/lang_transaction.html). Read-only work opts out with
``read_only(connection)`` so tailing readers never queue behind writers.
PostgreSQL runs through psycopg 3 with pre-ping on pooled connections.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from ledger.ddl import APPEND_ONLY_MESSAGE
from ledger.errors import AppendOnlyViolation, DatabaseUnavailable, LedgerError, SchemaNotReady
from ledger.postgres import dump_payload_json, load_payload_json

__all__ = ["READ_ONLY", "dialect_of", "open_engine", "read_only", "translate_errors"]

READ_ONLY = "grove_read_only"
SQLITE_BUSY_TIMEOUT_S = 60.0


def open_engine(url: str, *, pool: bool = True) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://…``) for Grove."""
    parsed = make_url(url)
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S},
            poolclass=None if pool else NullPool,
        )
        _configure_sqlite(engine)
        return engine
    if backend == "postgresql":
        if parsed.drivername == "postgresql":
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(
            parsed,
            pool_pre_ping=True,
            poolclass=None if pool else NullPool,
            json_serializer=dump_payload_json,
            json_deserializer=load_payload_json,
        )
    raise DatabaseUnavailable(
        url, f"unsupported database {backend!r}: use sqlite:///PATH or postgresql+psycopg://…"
    )


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = "BEGIN" if connection.get_execution_options().get(READ_ONLY) else "BEGIN IMMEDIATE"
        connection.exec_driver_sql(mode)


def read_only(connection: Connection) -> Connection:
    """Mark ``connection`` read-only before its transaction begins (SQLite: a deferred BEGIN)."""
    return connection.execution_options(**{READ_ONLY: True})


def dialect_of(engine: Engine | Connection) -> str:
    """``sqlite`` or ``postgresql``."""
    return engine.dialect.name


@contextlib.contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn SQLAlchemy/driver errors into the ledger's error tree (the one translation point)."""
    try:
        yield
    except LedgerError:
        raise
    except exc.DBAPIError as error:
        translated = translate(error, url)
        if translated is error:
            raise
        raise translated from error


def translate(error: exc.DBAPIError, url: str) -> LedgerError | exc.DBAPIError:
    """The ledger error for a database error; unknown errors are returned unchanged."""
    text = str(error.orig)
    if APPEND_ONLY_MESSAGE in text:
        operation = next((op for op in ("UPDATE", "DELETE", "TRUNCATE") if op in text), "change")
        return AppendOnlyViolation(operation, text.splitlines()[0])
    lowered = text.lower()
    if "no such table" in lowered or ("relation" in lowered and "does not exist" in lowered):
        return SchemaNotReady(_safe(url), text.splitlines()[0])
    if (
        isinstance(error, exc.OperationalError | exc.InterfaceError)
        and error.connection_invalidated
    ):
        return DatabaseUnavailable(_safe(url), text.splitlines()[0])
    if isinstance(error, exc.OperationalError) and (
        "connection" in lowered or "unable to open" in lowered
    ):
        return DatabaseUnavailable(_safe(url), text.splitlines()[0])
    return error


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
