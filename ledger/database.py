"""Opening a ledger database, and the one place where database errors become ledger errors.

SQLite (the embedded default) runs in WAL mode with a busy timeout, and write transactions start
with ``BEGIN IMMEDIATE``: a deferred transaction that reads the stream version and then writes
can fail with SQLITE_BUSY without waiting once another writer committed in between
(https://www.sqlite.org/lang_transaction.html). It runs with ``synchronous=FULL``: each commit
syncs the write-ahead log before it returns, so an acknowledged call survives a power loss or an
operating-system crash; ``NORMAL`` in WAL mode keeps commits across a process kill only, and may
roll the last ones back after a power loss (https://www.sqlite.org/pragma.html#pragma_synchronous;
the cost: ``docs/benchmarks.md``, "durability"). PostgreSQL runs through psycopg 3; its commits
are durable with the server's default ``synchronous_commit=on`` (``docs/reliability.md``).

``autocommit(connection)`` marks a connection whose statements each commit on their own, for
one-statement reads: a read then costs one round trip to the server, without ``BEGIN`` and
``ROLLBACK`` around it (PostgreSQL: the driver's autocommit; SQLite: no ``BEGIN``), and tailing
readers never queue behind writers. Appends keep their transaction (``ledger/store.py``).

Pooled connections are not pinged on every checkout (a round trip more for each of a captured
call's reads and appends; ``docs/benchmarks.md``, "gateway"): only a connection that sat unused
in the pool for ``IDLE_PING_S`` or more is pinged first, and replaced when the server no longer
answers (a server restart, or an idle timeout while it was unused). A connection that fails in
use is caught by SQLAlchemy's disconnect handling, which invalidates the whole pool: the failure
is translated to ``DatabaseUnavailable``, and the next checkout connects afresh.

``translate_errors`` is the one place database errors become ledger errors: the rules it knows
(append-only triggers, privileges, a missing schema, an unreachable server) get their own
classes, and every other database error becomes ``DatabaseError``, which names the driver's
error class and the first line of its message (never the statement's parameters, nor the URL:
the gateway answers it as 500 ``ledger_error``). The one exception is ``IntegrityError`` (a
unique index): it is the store's to decide from the committed rows, which it turns into
``WrongExpectedVersion``, ``EventIdConflict`` or ``ImportConflict`` (``ledger/store.py``). A URL
of a database Grove does not run on is ``UnsupportedDatabaseURL``, a usage error (exit status
2), never ``DatabaseUnavailable`` (75: "try again").

A PostgreSQL engine keeps up to ``POSTGRES_POOL_SIZE`` connections open between uses, opened as
concurrency first needs them, and opens at most ``POSTGRES_POOL_OVERFLOW`` more for a burst. A new
connection starts a server process, which cost PostgreSQL about 8 ms of CPU per captured call
when 16 clients shared SQLAlchemy's default pool of 5 kept connections: the ten beyond them were
closed after every use and opened again for the next (``docs/benchmarks.md``, "gateway"). Kept
and overflow together match the gateway's worker threads (AnyIO's default of 40).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, exc
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from grove.ledger.ddl import APPEND_ONLY_MESSAGE
from grove.ledger.errors import (
    AppendOnlyViolation,
    DatabaseUnavailable,
    LedgerError,
    PrivilegeRefused,
    SchemaNotReady,
)
from grove.ledger.postgres import dump_payload_json, load_payload_json

__all__ = [
    "AUTOCOMMIT",
    "IDLE_PING_S",
    "POSTGRES_POOL_OVERFLOW",
    "POSTGRES_POOL_SIZE",
    "SQLITE_SYNCHRONOUS",
    "DatabaseError",
    "UnsupportedDatabaseURL",
    "autocommit",
    "dialect_of",
    "open_engine",
    "translate_errors",
]

AUTOCOMMIT = "grove_autocommit"
IDLE_PING_S = 10.0
POSTGRES_POOL_SIZE = 16
"""Connections a PostgreSQL engine keeps open between uses (opened only as they are needed)."""
POSTGRES_POOL_OVERFLOW = 24
"""Connections a PostgreSQL engine opens beyond ``POSTGRES_POOL_SIZE`` for a burst, and closes
after it."""
SQLITE_BUSY_TIMEOUT_S = 60.0
SQLITE_SYNCHRONOUS = "FULL"
"""SQLite's ``synchronous`` setting: every commit is on disk when it returns (module docstring)."""
_CHECKED_IN_AT = "grove_checked_in_at"
INSUFFICIENT_PRIVILEGE = "42501"  # PostgreSQL's SQLSTATE for "permission denied"
SUPPORTED_URLS = "sqlite:///PATH or postgresql+psycopg://USER@HOST/DB"


class UnsupportedDatabaseURL(LedgerError, ValueError):
    """A ledger URL that names no database Grove runs on (or is no URL): fix the URL."""

    def __init__(self, url: str, detail: str) -> None:
        self.url = url
        super().__init__(f"Unsupported ledger database URL {url}: {detail}; use {SUPPORTED_URLS}")


class DatabaseError(LedgerError):
    """A database error no other ledger error describes; ``kind`` is the driver's error class
    (``ProgrammingError``, ``DataError``, ...), the message its first line."""

    def __init__(self, url: str, kind: str, detail: str) -> None:
        self.url = url
        self.kind = kind
        self.detail = detail
        # The URL is an attribute only: the gateway answers this message to clients.
        super().__init__(f"A ledger database statement failed ({kind}): {detail}")


def open_engine(url: str, *, pool: bool = True) -> Engine:
    """An engine for ``url`` (``sqlite:///PATH`` or ``postgresql+psycopg://…``) for Grove;
    ``UnsupportedDatabaseURL`` for any other."""
    try:
        parsed = make_url(url)
    except exc.ArgumentError as error:
        scheme = url.split("://", 1)[0] if "://" in url else "?"
        raise UnsupportedDatabaseURL(
            f"{scheme}://…", "it is not a database URL (scheme://…)"
        ) from error
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
        sizes = {"pool_size": POSTGRES_POOL_SIZE, "max_overflow": POSTGRES_POOL_OVERFLOW}
        engine = create_engine(
            parsed,
            poolclass=None if pool else NullPool,
            json_serializer=dump_payload_json,
            json_deserializer=load_payload_json,
            **(sizes if pool else {}),
        )
        _ping_when_idle(engine)
        return engine
    raise UnsupportedDatabaseURL(_safe(url), f"Grove does not run on {backend!r}")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: object) -> None:  # sqlite3's connection
        dbapi_connection.isolation_level = None  # we issue BEGIN ourselves
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA synchronous={SQLITE_SYNCHRONOUS}")
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        if not connection.get_execution_options().get(AUTOCOMMIT):
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection at checkout only when it sat unused for ``IDLE_PING_S``."""

    @event.listens_for(engine.pool, "checkin")
    def _on_checkin(_dbapi_connection: Any, record: Any) -> None:
        record.info[_CHECKED_IN_AT] = time.monotonic()

    @event.listens_for(engine.pool, "checkout")
    def _on_checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        checked_in = record.info.pop(_CHECKED_IN_AT, None)
        if checked_in is None or time.monotonic() - checked_in < IDLE_PING_S:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as error:
            # The pool discards this connection and checks out another (a fresh one).
            raise exc.DisconnectionError(f"an idle pooled connection died: {error}") from error


def autocommit(connection: Connection) -> Connection:
    """Mark ``connection``, before its first statement, as committing each statement on its own
    (one round trip for a one-statement read; see the module docstring)."""
    connection = connection.execution_options(**{AUTOCOMMIT: True})
    if dialect_of(connection) == "postgresql":
        connection = connection.execution_options(isolation_level="AUTOCOMMIT")
    return connection


def dialect_of(engine: Engine | Connection) -> str:
    """``sqlite`` or ``postgresql``."""
    return engine.dialect.name


@contextlib.contextmanager
def translate_errors(url: str) -> Iterator[None]:
    """Turn SQLAlchemy/driver errors into the ledger's error tree (the one translation point;
    the module docstring says how)."""
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
    """The ledger error for a database error (``DatabaseError`` for one no rule names); an
    ``IntegrityError`` is returned unchanged, for the store to decide."""
    text = str(error.orig)
    if APPEND_ONLY_MESSAGE in text:
        operation = next((op for op in ("UPDATE", "DELETE", "TRUNCATE") if op in text), "change")
        return AppendOnlyViolation(operation, text.splitlines()[0])
    if getattr(error.orig, "sqlstate", None) == INSUFFICIENT_PRIVILEGE:
        return PrivilegeRefused(_safe(url), text.splitlines()[0])
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
    if isinstance(error, exc.IntegrityError):
        return error
    first = text.splitlines()[0] if text else type(error.orig).__name__
    return DatabaseError(_safe(url), type(error).__name__, first)


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)
