"""Every query in docs/sql.md runs verbatim on both databases and finds the recorded rollout
(and its published training step)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from grove.ledger.catch_up import catch_up
from grove.ledger.events import BatchPublished, LedgerPosition
from grove.ledger.store import EventStore

from .scenario import compaction_rollout

COOKBOOK = Path(__file__).resolve().parents[3] / "docs" / "sql.md"
QUERIES = re.findall(r"```sql\n(.*?)```", COOKBOOK.read_text(), flags=re.S)


def test_cookbook_has_queries():
    assert len(QUERIES) >= 8


RUN_ROLLOUT = "run1-s0-g0-r0"  # a rollout as grove train names it, in run run1


@pytest.mark.parametrize("query", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_cookbook_query_runs_verbatim_and_returns_rows(store: EventStore, query: str):
    for index, event in enumerate(compaction_rollout("att-1")):
        store.append("att-1", [event], expected_version=index)
    run_events = compaction_rollout(
        RUN_ROLLOUT, rollout_id=RUN_ROLLOUT, group="run1-s0-g0", policy_version=0
    )
    store.append(RUN_ROLLOUT, run_events, expected_version=0)
    published = BatchPublished(
        step=0,
        rollout_ids=("r0",),
        row_ids=("r0/0", "r0/1"),
        ledger_position=LedgerPosition(position=store.count()),
    )
    store.append("training", [published], expected_version=0)
    catch_up(store)
    with store.engine.connect() as conn:
        rows = conn.execute(text(query)).all()
    assert rows, query
