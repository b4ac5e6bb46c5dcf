"""Statements compiled once and run on the driver's cursor (``ledger/compiled.py``): listeners
see them, driver errors arrive as SQLAlchemy's, and a statement whose SQL depends on its values
is refused."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Boolean, Engine, Integer, String, bindparam, event, exc, insert, select

from grove.ledger import migrate
from grove.ledger.compiled import CompiledStatement
from grove.ledger.database import open_engine
from grove.ledger.schema import PROJ_ATTEMPTS, PROJ_STREAMS

_MARK = CompiledStatement(
    insert(PROJ_STREAMS)
    .values(stream_id=bindparam("p_stream", type_=String), version=bindparam("p_v", type_=Integer))
    .returning(PROJ_STREAMS.c.stream_id, PROJ_STREAMS.c.version)
)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on a migrated test database."""
    migrate.upgrade(database_url)
    opened = open_engine(database_url)
    try:
        yield opened
    finally:
        opened.dispose()


def test_rows_come_back_named_by_their_columns(engine: Engine) -> None:
    with engine.begin() as conn:
        result = _MARK.execute(conn, {"p_stream": "s-1", "p_v": 3})

    assert [(row.stream_id, row.version) for row in result.all()] == [("s-1", 3)]


def test_listeners_see_each_statement_with_its_values(engine: Engine) -> None:
    seen: list[tuple[str, object]] = []
    event.listen(
        engine, "before_cursor_execute", lambda _c, _k, sql, values, *_: seen.append((sql, values))
    )
    with engine.begin() as conn:
        _MARK.execute(conn, {"p_stream": "s-1", "p_v": 3})

    [(sql, values)] = [(sql, values) for sql, values in seen if not sql.startswith("BEGIN")]
    assert sql.startswith("INSERT INTO grove_proj_streams")
    assert "s-1" in (values.values() if isinstance(values, dict) else values)


def test_a_unique_violation_is_sqlalchemys_integrity_error(engine: Engine) -> None:
    with engine.begin() as conn:
        _MARK.execute(conn, {"p_stream": "s-1", "p_v": 3})

    with pytest.raises(exc.IntegrityError), engine.begin() as conn:
        _MARK.execute(conn, {"p_stream": "s-1", "p_v": 4})
    with engine.connect() as conn:
        assert conn.execute(select(PROJ_STREAMS.c.version)).scalars().all() == [3]


def test_a_boolean_parameter_is_converted_as_sqlalchemy_converts_it(engine: Engine) -> None:
    closes = CompiledStatement(
        PROJ_ATTEMPTS.update()
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_key", type_=String))
        .values(admissions_closed=bindparam("p_closed", type_=Boolean))
    )
    with engine.begin() as conn:
        changed = closes.execute(conn, {"p_key": "none", "p_closed": True}).rowcount

    assert changed == 0


def test_an_expanding_parameter_is_refused(engine: Engine) -> None:
    keys = select(PROJ_STREAMS.c.version).where(
        PROJ_STREAMS.c.stream_id.in_(bindparam("p_keys", expanding=True, type_=String))
    )
    with engine.begin() as conn, pytest.raises(TypeError, match="p_keys"):
        CompiledStatement(keys).execute(conn, {"p_keys": ["a"]})
