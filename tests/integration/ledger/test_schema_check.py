"""Only ``grove db upgrade`` changes a ledger schema: serving, training and the debugging tools
check its revision and refuse, with the upgrade command, one that is absent, behind or ahead
(``grove.ledger.migrate.require_current``). The embedded default's first use creates a SQLite
ledger; a PostgreSQL schema is never created or changed on open. Reading commands create nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import make_url

from grove.demo import DEMO_CONFIG
from grove.ledger import migrate
from grove.ledger.errors import SchemaNotReady, SchemaOutOfDate
from grove.services.serve import build_gateway
from grove.workspace import Workspace
from tests.integration.tools.grove_cli import run_grove

HEAD = migrate.head_revision()
DEMO = DEMO_CONFIG


def _safe(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _upgrade_command(url: str) -> str:
    return f"run `grove db upgrade --database-url {_safe(url)}` as the schema's owner"


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_a_schema_at_head_passes(ledger_url: str):
    assert migrate.require_current(ledger_url) == HEAD


def test_a_schema_behind_is_refused_with_the_upgrade_command_and_left_as_it_is(database_url):
    migrate.upgrade(database_url, "0003")
    with pytest.raises(SchemaOutOfDate) as refused:
        migrate.require_current(database_url, create_embedded=True)
    assert str(refused.value) == (
        f"The ledger schema at {_safe(database_url)} is at revision 0003; this Grove needs "
        f"{HEAD}. Grove changes a schema only when told to: {_upgrade_command(database_url)}, "
        "then start again"
    )
    assert isinstance(refused.value, SchemaNotReady)
    assert migrate.current_revision(database_url) == "0003"


def test_a_schema_a_newer_grove_wrote_is_refused_with_upgrade_grove(ledger_url: str):
    engine = create_engine(ledger_url)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    with pytest.raises(SchemaOutOfDate) as refused:
        migrate.require_current(ledger_url)
    assert str(refused.value) == (
        f"The ledger schema at {_safe(ledger_url)} is at revision 9999, which this Grove does "
        f"not know (its newest is {HEAD}): a newer Grove upgraded it; upgrade Grove"
    )


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_postgres_database_without_schema_is_refused_and_never_created(database_url: str):
    with pytest.raises(SchemaOutOfDate) as refused:
        migrate.require_current(database_url, create_embedded=True)
    assert str(refused.value) == (
        f"There is no ledger schema at {_safe(database_url)} (this Grove needs revision {HEAD}): "
        f"{_upgrade_command(database_url)}, then start again"
    )
    assert _tables(database_url) == set()


def test_the_embedded_ledger_is_created_on_first_use(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'work' / 'ledger.db'}"
    assert migrate.require_current(url, create_embedded=True) == HEAD
    assert migrate.current_revision(url) == HEAD


def test_a_missing_sqlite_ledger_is_refused_and_not_created_unless_first_use_is_asked(
    tmp_path: Path,
):
    url = f"sqlite:///{tmp_path / 'work' / 'ledger.db'}"
    with pytest.raises(SchemaOutOfDate, match="There is no ledger schema at"):
        migrate.require_current(url)
    assert not (tmp_path / "work").exists()


def test_db_status_on_an_empty_workdir_creates_nothing(tmp_path: Path):
    outcome = run_grove("db", "status", "--json", "--workdir", str(tmp_path / "work"))
    assert outcome.code == 0, outcome.stderr
    assert json.loads(outcome.stdout)["current_revision"] is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_grove_serve_refuses_a_postgres_schema_behind_and_changes_nothing(
    database_url: str, tmp_path: Path
):
    migrate.upgrade(database_url, "0003")
    workspace = Workspace.resolve(tmp_path / "work", database_url=database_url)
    with pytest.raises(SchemaOutOfDate, match="is at revision 0003"):
        build_gateway(workspace)
    assert migrate.current_revision(database_url) == "0003"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_grove_train_refuses_a_postgres_database_without_schema_before_starting_a_run(
    database_url: str, tmp_path: Path
):
    outcome = run_grove(
        "train", str(DEMO), "--workdir", str(tmp_path / "work"), "--database-url", database_url
    )
    assert outcome.code == 1
    assert "There is no ledger schema at" in outcome.stderr
    assert "grove db upgrade --database-url" in outcome.stderr
    assert _tables(database_url) == set()
    assert not (tmp_path / "work" / "runs").exists()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_the_debugging_tools_refuse_a_schema_behind(database_url: str, tmp_path: Path):
    migrate.upgrade(database_url, "0003")
    outcome = run_grove("lineage", "att-1", "--database-url", database_url)
    assert outcome.code == 1
    assert "is at revision 0003; this Grove needs" in outcome.stderr
    assert migrate.current_revision(database_url) == "0003"
