"""Alembic migrations on both databases, and the schema they leave behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from grove.ledger import migrate
from grove.ledger.database import open_engine
from grove.ledger.errors import AppendOnlyViolation, SchemaNotReady
from grove.ledger.store import EventStore

from .scenario import execute_raw, opened

REPO = Path(__file__).resolve().parents[3]
TABLES = {
    "grove_events",
    "grove_projection_checkpoints",
    "grove_proj_attempts",
    "grove_proj_calls",
    "grove_proj_rollouts",
    "grove_proj_streams",
    "grove_proj_contradictions",
}
VIEWS = {"grove_calls", "grove_call_lineage", "grove_rollouts", "grove_contradictions"}


def test_upgrade_head_on_an_empty_database_creates_tables_and_views(database_url: str):
    migrate.upgrade(database_url)
    inspector = inspect(create_engine(database_url))
    assert set(inspector.get_table_names()) >= TABLES
    assert set(inspector.get_view_names()) == VIEWS
    assert migrate.current_revision(database_url) == migrate.head_revision()


def test_alembic_check_reports_no_drift_after_upgrade(ledger_url: str):
    assert migrate.check_drift(ledger_url) is None


def test_downgrade_to_base_removes_every_ledger_object(ledger_url: str):
    migrate.downgrade(ledger_url, "base")
    inspector = inspect(create_engine(ledger_url))
    assert set(inspector.get_table_names()) <= {"alembic_version"}
    assert inspector.get_view_names() == []
    assert migrate.current_revision(ledger_url) is None


def test_store_on_a_database_without_schema_says_to_upgrade(database_url: str):
    store = EventStore.open(database_url)
    with pytest.raises(SchemaNotReady, match=r"Run `grove db upgrade`"):
        store.count()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_triggers_and_autoincrement_survive_the_batch_rebuild(database_url: str):
    migrate.upgrade(database_url, "0001")
    migrate.upgrade(database_url, "head")  # 0002 recreates grove_events in batch mode
    engine = create_engine(database_url)
    with engine.connect() as conn:
        triggers = conn.execute(
            text("SELECT name FROM sqlite_master WHERE type='trigger' AND tbl_name='grove_events'")
        ).scalars()
        assert set(triggers) == {"grove_events_no_update", "grove_events_no_delete"}
        ddl = conn.execute(
            text("SELECT sql FROM sqlite_master WHERE type='table' AND name='grove_events'")
        ).scalar_one()
        assert "AUTOINCREMENT" in ddl
        assert "stream_version >= 1" in ddl
    store = EventStore.open(database_url)
    store.append("att-1", [opened("att-1")])
    with pytest.raises(AppendOnlyViolation, match="UPDATE refused"):
        execute_raw(store, "UPDATE grove_events SET stream_id = 'x'")


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_alembic_command_line_upgrades_an_empty_sqlite_file(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    alembic = str(Path(sys.executable).parent / "alembic")
    result = _run(alembic, "-x", f"url={url}", "upgrade", "head")
    assert result.returncode == 0, result.stderr
    assert migrate.current_revision(url) == migrate.head_revision()


def test_grove_db_upgrade_then_status_reports_revision_events_and_projections(tmp_path: Path):
    grove = str(Path(sys.executable).parent / "grove")
    upgraded = _run(grove, "db", "upgrade", "--workdir", str(tmp_path / "wd"))
    assert upgraded.returncode == 0, upgraded.stderr
    assert (tmp_path / "wd" / "ledger.db").exists()
    status = _run(grove, "db", "status", "--json", "--workdir", str(tmp_path / "wd"))
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert report["head_revision"] == report["current_revision"] == migrate.head_revision()
    assert report["events"] == 0
    assert set(report["projections"]) == {"attempts", "calls", "rollouts", "contradictions"}


def test_grove_db_status_on_postgres_takes_the_database_url(ledger_url: str):
    grove = str(Path(sys.executable).parent / "grove")
    status = _run(grove, "db", "status", "--json", "--database-url", ledger_url)
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["current_revision"] == migrate.head_revision()


def _view_columns(url: str, view: str) -> list[str]:
    return [c["name"] for c in inspect(create_engine(url)).get_columns(view)]


def test_upgrade_from_0002_adds_the_policy_version_and_keeps_the_ledger(database_url: str):
    migrate.upgrade(database_url, "0002")
    assert "policy_version" not in _view_columns(database_url, "grove_calls")
    store = EventStore(open_engine(database_url), project_inline=False)  # a writer of 0002
    try:
        store.append("att-1", [opened("att-1")])
        migrate.upgrade(database_url, "head")
        assert "policy_version" in _view_columns(database_url, "grove_calls")
        assert set(inspect(create_engine(database_url)).get_view_names()) == VIEWS
        assert store.count() == 1
        assert migrate.check_drift(database_url) is None
        with pytest.raises(AppendOnlyViolation):
            execute_raw(store, "UPDATE grove_events SET stream_id = 'x'")
    finally:
        store.close()


def test_downgrade_to_0002_restores_its_views_and_drops_the_column(ledger_url: str):
    migrate.downgrade(ledger_url, "0002")
    inspector = inspect(create_engine(ledger_url))
    assert "policy_version" not in [c["name"] for c in inspector.get_columns("grove_proj_calls")]
    assert set(inspector.get_view_names()) == VIEWS - {"grove_contradictions"}
    assert "policy_version" not in _view_columns(ledger_url, "grove_calls")
    assert "policy_version" in _view_columns(ledger_url, "grove_rollouts")  # the attempt's
    store = EventStore(open_engine(ledger_url), project_inline=False)  # a writer of 0002
    try:
        store.append("att-1", [opened("att-1")])
        with pytest.raises(AppendOnlyViolation):
            execute_raw(store, "DELETE FROM grove_events")
    finally:
        store.close()
    migrate.upgrade(ledger_url, "head")
    assert migrate.check_drift(ledger_url) is None


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_sqlite_0003_adds_the_column_without_rebuilding_grove_events(database_url: str):
    migrate.upgrade(database_url, "0002")
    engine = create_engine(database_url)
    query = text("SELECT type, name, sql FROM sqlite_master WHERE tbl_name = 'grove_events'")
    with engine.connect() as conn:
        before = set(conn.execute(query).all())
    migrate.upgrade(database_url, "0003")
    with engine.connect() as conn:
        after = set(conn.execute(query).all())
    assert after == before  # table, indexes and both append-only triggers, untouched
    assert {name for kind, name, _ in after if kind == "trigger"} == {
        "grove_events_no_update",
        "grove_events_no_delete",
    }
