"""Statements compiled once and run on the driver's cursor: the append path's statements.

Every model call appends two events (its intent and its commit), each in one transaction of
three small statements (the insert, the fold's claim and the event's applier). SQLAlchemy's
per-execution work (the cache key lookup, the parameters built from the compiled form, the
execution context and the result object) cost more CPU than the driver's own work for these
statements (``docs/benchmarks.md``, "Capture that costs little"). A ``CompiledStatement`` does that
work once per dialect: it compiles a Core statement to its SQL text, the order of its
parameters, the constants it binds and the conversions its parameters' types need (a boolean on
SQLite), and then executes it on the cursor of the connection's driver (psycopg or sqlite3),
inside the transaction SQLAlchemy manages.

It keeps what callers rely on: the engine's ``before_cursor_execute`` listeners see every
statement (with no execution context), the driver's errors are raised as SQLAlchemy raises them
(``IntegrityError`` and the rest, so ``translate_errors`` and the store's retry treat both paths
alike), and a connection the driver reports lost is invalidated, as SQLAlchemy does. A
statement with an expanding ``IN`` (its SQL depends on the parameters) does not qualify:
compiling one raises ``TypeError``.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from sqlalchemy import Connection, exc
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ClauseElement

__all__ = ["CompiledStatement", "DriverResult"]

_CURSOR = "grove_cursor"  # the driver cursor kept in a pooled connection's info


class DriverResult:
    """The outcome of one execution: its rows (named tuples, when the statement returns rows)
    and ``rowcount`` (the rows an ``UPDATE`` or ``INSERT`` changed)."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, rows: list[Any], rowcount: int) -> None:
        self.rows = rows
        self.rowcount = rowcount

    def first(self) -> Any:
        """The first row, or None."""
        return self.rows[0] if self.rows else None

    def all(self) -> list[Any]:
        """Every row."""
        return self.rows


class _Form:
    """A statement compiled for one dialect: SQL text, parameter order (None: by name), the
    constants it binds, and the type of its rows (known after its first execution)."""

    def __init__(self, statement: ClauseElement, dialect: Dialect) -> None:
        compiled = cast(SQLCompiler, statement.compile(dialect=dialect))
        self.processors: dict[str, Callable[[Any], Any]] = {}
        for bind, name in compiled.bind_names.items():
            if bind.expanding or bind.literal_execute:
                raise TypeError(f"parameter {name!r} expands: run the statement through SQLAlchemy")
            processor = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if processor is not None:
                self.processors[name] = processor
        self.sql = compiled.string
        self.order: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positional and compiled.positiontup else None
        )
        self.constants = {
            name: bind.effective_value
            for bind, name in compiled.bind_names.items()
            if not bind.required
        }
        self.returns_rows = bool(compiled.effective_returning)
        self.row_type: Any = None

    def parameters(self, given: Mapping[str, Any]) -> Sequence[Any] | dict[str, Any]:
        values = {**self.constants, **given}
        for name, processor in self.processors.items():
            values[name] = processor(values[name])
        if self.order is None:
            return values
        return tuple(values[name] for name in self.order)


class CompiledStatement:
    """A Core statement executed on the driver's cursor, compiled once per dialect (above)."""

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._forms: dict[str, _Form] = {}

    def execute(self, conn: Connection, parameters: Mapping[str, Any]) -> DriverResult:
        """Run the statement with ``parameters`` in ``conn``'s transaction."""
        form = self._form(conn)
        values = form.parameters(parameters)
        cursor = self._run(conn, form, values, lambda cursor: cursor.execute(form.sql, values))
        rows = cursor.fetchall() if form.returns_rows else []
        if rows:
            if form.row_type is None:
                names = [column[0] for column in cursor.description]
                form.row_type = namedtuple("Row", names, rename=True)  # type: ignore[misc]
            rows = [form.row_type._make(row) for row in rows]
        return DriverResult(rows, cursor.rowcount)

    def execute_many(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> None:
        """Run the statement once per parameter set of ``rows`` (one batch: the driver sends
        them together), in ``conn``'s transaction."""
        form = self._form(conn)
        values = [form.parameters(row) for row in rows]
        self._run(conn, form, values, lambda cursor: cursor.executemany(form.sql, values))

    def _form(self, conn: Connection) -> _Form:
        form = self._forms.get(conn.dialect.name)
        if form is None:
            form = self._forms[conn.dialect.name] = _Form(self.statement, conn.dialect)
        return form

    @staticmethod
    def _run(conn: Connection, form: _Form, values: Any, run: Callable[[Any], object]) -> Any:
        """``run(cursor)`` on the connection's kept driver cursor (listeners told first), its
        driver errors raised as SQLAlchemy's; the cursor."""
        record = conn.connection
        driver = record.driver_connection
        kept = record.info.get(_CURSOR)
        if kept is None or kept[0] is not driver:
            kept = record.info[_CURSOR] = (driver, driver.cursor())  # type: ignore[union-attr]
        cursor = kept[1]
        for listener in conn.dispatch.before_cursor_execute:
            listener(conn, cursor, form.sql, values, None, not isinstance(values, dict | tuple))
        try:
            run(cursor)
        except conn.dialect.loaded_dbapi.Error as error:
            record.info.pop(_CURSOR, None)
            lost = conn.dialect.is_disconnect(error, driver, cursor)
            wrapped = exc.DBAPIError.instance(
                form.sql,
                values,
                error,
                conn.dialect.loaded_dbapi.Error,
                connection_invalidated=lost,
                dialect=conn.dialect,
            )
            if lost:
                conn.invalidate(error)
            raise wrapped from error
        return cursor
