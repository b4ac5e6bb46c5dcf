"""``grove db check`` and ``grove db rebuild-projections`` over the real command line, on the demo
ledger copied into SQLite and PostgreSQL.

The copy imports the events in bulk, so no append folds them: ``grove db check`` finds every
attempt missing from the projection tables until ``grove db rebuild-projections`` folds the
ledger again; a row changed by hand afterwards is found again, by attempt and table.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from grove.ledger.database import open_engine
from grove.ledger.fold_drift import fold_drift
from grove.ledger.store import EventStore

from .grove_cli import run_grove
from .ledgers import DemoLedger

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


def _rebuilt(ledger_url: str) -> None:
    outcome = run_grove("db", "rebuild-projections", "--database-url", ledger_url)
    assert outcome.code == 0, outcome.stderr


def test_the_demo_ledger_folded_by_its_appends_has_no_fold_drift(demo: DemoLedger) -> None:
    store = EventStore.open(demo.workspace.database_url, pool=False)
    try:
        assert fold_drift(store) == []
    finally:
        store.close()


def test_check_finds_every_attempt_an_import_left_unfolded(
    demo: DemoLedger, ledger_url: str
) -> None:
    outcome = run_grove("db", "check", "--json", "--database-url", ledger_url)

    assert outcome.code == 1
    report = json.loads(outcome.stdout)
    assert report["schema_drift"] is None
    missing = {
        d["capture_key"] for d in report["fold_drift"] if d["table"] == "grove_proj_attempts"
    }
    assert demo.showcase_key in missing


def test_rebuild_projections_folds_every_event_and_check_then_passes(
    demo: DemoLedger, ledger_url: str
) -> None:
    rebuilt = run_grove("db", "rebuild-projections", "--json", "--database-url", ledger_url)
    checked = run_grove("db", "check", "--database-url", ledger_url)

    assert rebuilt.code == 0, rebuilt.stderr
    report = json.loads(rebuilt.stdout)
    store = EventStore.open(ledger_url, pool=False)
    try:
        assert report["events"] == store.count()
    finally:
        store.close()
    assert {mark["position"] for mark in report["projections"].values()} == {report["events"]}
    assert checked.code == 0, checked.stderr
    assert "schema and projections match" in checked.stdout


def test_check_names_the_attempt_and_table_of_a_row_changed_by_hand(
    demo: DemoLedger, ledger_url: str
) -> None:
    _rebuilt(ledger_url)
    engine = open_engine(ledger_url, pool=False)
    with engine.begin() as conn:
        conn.execute(
            text("UPDATE grove_proj_rollouts SET reward = reward + 1 WHERE capture_key = :k"),
            {"k": demo.showcase_key},
        )
    engine.dispose()

    outcome = run_grove("db", "check", "--database-url", ledger_url)

    assert outcome.code == 1
    assert f"fold drift: {demo.showcase_key}: grove_proj_rollouts holds" in outcome.stderr
    assert "1 projection rows differ from the fold of the events" in outcome.stderr
    assert "grove db rebuild-projections" in outcome.stderr


def test_rebuild_projections_mends_a_row_changed_by_hand(demo: DemoLedger, ledger_url: str) -> None:
    _rebuilt(ledger_url)
    engine = open_engine(ledger_url, pool=False)
    with engine.begin() as conn:
        conn.execute(
            text("DELETE FROM grove_proj_calls WHERE capture_key = :k"), {"k": demo.showcase_key}
        )
    engine.dispose()

    _rebuilt(ledger_url)

    assert run_grove("db", "check", "--database-url", ledger_url).code == 0


def test_check_refuses_a_ledger_that_does_not_exist_and_creates_none(tmp_path) -> None:
    path = tmp_path / "absent.db"

    outcome = run_grove("db", "check", "--database-url", f"sqlite:///{path}")

    assert outcome.code == 1
    assert f"No ledger at {path}" in outcome.stderr
    assert not path.exists()
