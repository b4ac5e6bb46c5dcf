"""Every query in docs/sql.md runs verbatim on both databases and finds the recorded rollout
(and its published training step), and forks of its call c5: fork-1 (f1 continues c5; trainable,
reward 1), fork-2 (masked, reward 0) and fork-3 (still playing, nothing selected)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from grove.ledger.attempt import AttemptLog
from grove.ledger.catch_up import catch_up
from grove.ledger.events import BatchPublished, LedgerPosition
from grove.ledger.store import EventStore

from .forks import call, finish, open_fork
from .scenario import compaction_rollout

COOKBOOK = Path(__file__).resolve().parents[3] / "docs" / "sql.md"
QUERIES = re.findall(r"```sql\n(.*?)```", COOKBOOK.read_text(), flags=re.S)


def test_cookbook_has_queries():
    assert len(QUERIES) >= 8


RUN_ROLLOUT = "run1-s0-g0-r0"  # a rollout as grove train names it, in run run1


def _query(fragment: str) -> str:
    """The one cookbook query that holds ``fragment``."""
    [query] = [q for q in QUERIES if fragment in q]
    return query


def _record(store: EventStore) -> None:
    """The recorded rollout, a run's rollout, its published step and the forks of att-1/c5."""
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
    log = AttemptLog(store)
    for key, reward in (("fork-1", 1.0), ("fork-2", 0.0), ("fork-3", None)):
        open_fork(log, key, "att-1", "c5")
        call(log, key, "f1", parent="c5", source="att-1", prev=16)
        if reward is not None:
            finish(log, key, ("f1",), reward)
    catch_up(store)


@pytest.mark.parametrize("query", QUERIES, ids=[f"q{i}" for i in range(len(QUERIES))])
def test_cookbook_query_runs_verbatim_and_returns_rows(store: EventStore, query: str):
    _record(store)
    with store.engine.connect() as conn:
        rows = conn.execute(text(query)).all()
    assert rows, query


def test_the_forks_of_a_call_query_lists_each_fork_with_its_reward_and_decision(
    store: EventStore,
):
    _record(store)
    with store.engine.connect() as conn:
        rows = conn.execute(text(_query("a.fork_source_call_id = 'c5'"))).all()
    # capture_key, rollout_id, prompt_group, reward, status, masked_reason, step
    assert [tuple(row) for row in rows] == [
        ("fork-1", "r-fork-1", "g-f", 1.0, "trainable", None, None),
        ("fork-2", "r-fork-2", "g-f", 0.0, "masked", "blob_invalid", None),
        ("fork-3", "r-fork-3", "g-f", None, None, None, None),
    ]


def test_the_fork_ancestry_query_reaches_the_source_root(store: EventStore):
    _record(store)
    with store.engine.connect() as conn:
        rows = conn.execute(text(_query("capture_key = 'fork-1' AND call_id = 'f1'"))).all()
    # f1 continues c5 of att-1, whose parent is the root c3
    assert [tuple(row) for row in rows] == [
        ("fork-1", "f1", 0),
        ("att-1", "c5", 1),
        ("att-1", "c3", 2),
    ]
