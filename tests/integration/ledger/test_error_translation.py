"""Database errors become ledger errors in one place (``ledger/database.py``,
``translate_errors``): a rule it knows gets its own class, any other database error a
``DatabaseError``; an ``IntegrityError`` stays the store's to decide; a URL of a database Grove
does not run on is ``UnsupportedDatabaseURL``, a usage error (exit status 2), not "try again"."""

from __future__ import annotations

import pytest
from sqlalchemy import exc

from grove.errors import exit_status
from grove.ledger.database import (
    DatabaseError,
    UnsupportedDatabaseURL,
    open_engine,
    translate,
    translate_errors,
)
from grove.ledger.errors import LedgerError
from tests.integration.tools.grove_cli import run_grove

UNKNOWN_TO_THE_RULES = [
    exc.DataError,
    exc.OperationalError,
    exc.ProgrammingError,
    exc.InternalError,
    exc.NotSupportedError,
    exc.DatabaseError,
    exc.InterfaceError,
    exc.DBAPIError,
]


def test_a_failing_statement_on_a_real_database_is_a_database_error(database_url: str):
    engine = open_engine(database_url, pool=False)
    try:
        with (
            pytest.raises(DatabaseError) as raised,
            translate_errors(database_url),
            engine.connect() as conn,
        ):
            conn.exec_driver_sql("SELEC 1")  # a syntax error: no rule names it
    finally:
        engine.dispose()
    assert raised.value.kind in {"OperationalError", "ProgrammingError"}  # SQLite, PostgreSQL
    assert str(raised.value).startswith(f"A ledger database statement failed ({raised.value.kind})")
    assert "SELEC" in raised.value.detail
    assert isinstance(raised.value.__cause__, exc.DBAPIError)


@pytest.mark.parametrize("kind", UNKNOWN_TO_THE_RULES, ids=lambda cls: cls.__name__)
def test_every_database_error_class_becomes_a_ledger_error(kind: type[exc.DBAPIError]):
    error = kind("SELECT 1", {"secret": "parameter"}, Exception("boom"))
    translated = translate(error, "postgresql+psycopg://grove:pw@db/grove")
    assert isinstance(translated, DatabaseError)
    assert (translated.kind, translated.detail) == (kind.__name__, "boom")
    assert "parameter" not in str(translated) and "pw" not in str(translated)


def test_an_integrity_error_is_left_to_the_store_to_decide():
    error = exc.IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))
    assert translate(error, "sqlite:///ledger.db") is error


@pytest.mark.parametrize(
    "url", ["mysql://grove:pw@db/grove", "oracle://db/grove", "not a url"], ids=str
)
def test_an_unsupported_database_url_is_a_usage_error(url: str):
    with pytest.raises(UnsupportedDatabaseURL, match="Unsupported ledger database URL") as raised:
        open_engine(url)
    assert isinstance(raised.value, LedgerError)
    assert exit_status(raised.value) == 2
    assert "pw" not in str(raised.value)


def test_the_command_line_reports_an_unsupported_database_url_in_one_line_with_status_2():
    outcome = run_grove("db", "status", "--database-url", "mysql://grove:secret@db/grove")
    assert (outcome.code, outcome.stdout) == (2, "")
    assert outcome.stderr.startswith("error: Unsupported ledger database URL mysql://grove:***@db")
    assert "secret" not in outcome.stderr
    assert "Traceback" not in outcome.stderr
