"""Revision 0006 on both databases: a 0005 ledger with forks in its events upgrades to views
that follow them, and downgrading gives 0005's tables and 0004's views back.

The ledgers are those of ``forks.source_and_forks``: src (c1 -> c2 -> c3), fork-1 of src/c2 (f1
continues c2) and fork-2 of fork-1/f2 (g1 continues f2).
"""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.catch_up import catch_up
from grove.ledger.database import open_engine
from grove.ledger.fold_drift import fold_drift
from grove.ledger.store import EventStore

from .forks import FORK, FORK_OF_FORK, SOURCE, fork_columns, source_and_forks
from .scenario import opened

FORK_COLUMNS = {"fork_source_capture_key", "fork_source_call_id"}
VIEWS = {"grove_calls", "grove_call_lineage", "grove_rollouts", "grove_contradictions"}


def _columns(url: str, table: str) -> list[str]:
    return [c["name"] for c in inspect(create_engine(url)).get_columns(table)]


def _ancestors(store: EventStore, capture_key: str, call_id: str) -> list[str]:
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                text(
                    "SELECT ancestor_call_id FROM grove_call_lineage "
                    "WHERE capture_key = :k AND call_id = :c ORDER BY depth"
                ),
                {"k": capture_key, "c": call_id},
            ).scalars()
        )


def test_upgrade_fills_the_fork_columns_of_rows_a_0005_ledger_folded(ledger_url: str):
    store = EventStore.open(ledger_url)
    try:
        source_and_forks(AttemptLog(store))
        migrate.downgrade(ledger_url, "0005")  # the rows stay, folded without the columns
        assert FORK_COLUMNS.isdisjoint(_columns(ledger_url, "grove_proj_attempts"))
        assert _ancestors(store, FORK, "f1") == ["f1", "c2"]  # 0004's view: in fork-1 only

        migrate.upgrade(ledger_url, "head")

        assert fork_columns(store) == (
            [(FORK, SOURCE, "c2"), (FORK_OF_FORK, FORK, "f2"), (SOURCE, None, None)],
            [(FORK, "f1", SOURCE), (FORK_OF_FORK, "g1", FORK)],
        )
        assert _ancestors(store, FORK_OF_FORK, "g1") == ["g1", "f2", "f1", "c2", "c1"]
        assert fold_drift(store) == []
    finally:
        store.close()


def test_upgrade_of_a_0005_ledger_whose_forks_were_never_folded_folds_them(database_url: str):
    migrate.upgrade(database_url, "0005")
    writer = EventStore(open_engine(database_url), project_inline=False)  # folds nothing
    try:
        source_and_forks(AttemptLog(writer))
        migrate.upgrade(database_url, "head")
        catch_up(writer)
        assert _ancestors(writer, FORK, "f1") == ["f1", "c2", "c1"]
        assert fold_drift(writer) == []
    finally:
        writer.close()


def test_downgrade_to_0005_drops_the_fork_columns_and_restores_the_views_of_0004(
    ledger_url: str,
):
    migrate.downgrade(ledger_url, "0005")
    inspector = inspect(create_engine(ledger_url))
    assert FORK_COLUMNS.isdisjoint(_columns(ledger_url, "grove_proj_attempts"))
    assert "source_capture_key" not in _columns(ledger_url, "grove_proj_calls")
    assert {ix["name"] for ix in inspector.get_indexes("grove_proj_attempts")} == {
        "ix_grove_proj_attempts_prompt_group",
        "ix_grove_proj_attempts_rollout_id",
    }
    assert set(inspector.get_view_names()) == VIEWS
    assert _columns(ledger_url, "grove_call_lineage") == [
        "capture_key",
        "call_id",
        "ancestor_call_id",
        "depth",
    ]
    assert _columns(ledger_url, "grove_calls")[-1] == "policy_version"
    writer = EventStore(open_engine(ledger_url), project_inline=False)  # a writer of 0005
    try:
        writer.append("att-1", [opened("att-1")])
    finally:
        writer.close()
    migrate.upgrade(ledger_url, "head")
    assert migrate.check_drift(ledger_url) is None
