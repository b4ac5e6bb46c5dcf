"""``COPY`` that sends its end first and works while the server writes (``ledger/pgcopy.py``).

The work done meanwhile must never change what a ``COPY`` means: its rows land when both succeed,
an error of the server or of the work is raised, and the connection stays usable either way.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from psycopg import pq
from sqlalchemy import Connection, create_engine, exc, text

from grove.ledger.pgcopy import copy_block, copy_parts


@pytest.fixture
def conn(postgres_url: str) -> Iterator[Connection]:
    engine = create_engine(postgres_url)
    with engine.connect() as connection:
        connection.execute(text("CREATE TABLE t (id integer PRIMARY KEY, note text)"))
        connection.commit()
        yield connection
    engine.dispose()


def _rows(conn: Connection) -> list[tuple[int, str]]:
    """The committed rows of ``t`` (read in a transaction of its own)."""
    with conn.begin():
        return [tuple(r) for r in conn.execute(text("SELECT id, note FROM t ORDER BY id"))]


def test_the_work_runs_once_and_the_rows_land(conn: Connection):
    calls: list[str] = []
    with conn.begin():
        copy_block(conn, "t", ("id", "note"), "1\ta\n2\tb\n", lambda: calls.append("meanwhile"))
    assert calls == ["meanwhile"]
    assert _rows(conn) == [(1, "a"), (2, "b")]


def test_an_error_of_the_work_is_raised_and_the_connection_stays_usable(conn: Connection):
    def fail() -> None:
        raise RuntimeError("the work failed")

    with pytest.raises(RuntimeError, match="the work failed"), conn.begin():
        copy_block(conn, "t", ("id", "note"), "1\ta\n", fail)
    assert _rows(conn) == []
    with conn.begin():
        copy_block(conn, "t", ("id", "note"), "3\tc\n", lambda: None)
    assert _rows(conn) == [(3, "c")]


def test_an_error_of_the_server_is_raised_after_the_work(conn: Connection):
    calls: list[str] = []
    with pytest.raises(exc.IntegrityError, match="duplicate key"), conn.begin():
        copy_block(conn, "t", ("id", "note"), "1\ta\n1\tb\n", lambda: calls.append("meanwhile"))
    assert calls == ["meanwhile"]
    assert _rows(conn) == []


def test_each_block_is_drawn_while_the_copy_of_the_one_before_is_under_way(conn: Connection):
    driver = conn.connection.driver_connection
    states: list[pq.TransactionStatus] = []

    def blocks() -> Iterator[str]:
        for i in range(3):
            states.append(driver.pgconn.transaction_status)
            yield f"{i}\tpart {i}\n"
        states.append(driver.pgconn.transaction_status)

    with conn.begin():
        copy_parts(conn, "t", ("id", "note"), blocks())
    active = pq.TransactionStatus.ACTIVE  # a command (the COPY before) is in progress
    assert states[1:] == [active, active, active]
    assert states[0] != active
    assert _rows(conn) == [(0, "part 0"), (1, "part 1"), (2, "part 2")]
