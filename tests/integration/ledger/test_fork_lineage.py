"""The projections and lineage views follow a fork's cross-attempt parent, on both databases.

``src`` holds c1 -> c2 -> c3; ``fork-1`` forks src/c2 (f1 continues c2, f2 continues f1, f0 is a
root of its own); ``fork-2`` forks fork-1/f2 (g1 continues f2). A call's ancestors are named by
the attempt that owns them (``ancestor_capture_key``), with depth 1 for the parent.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import text

from grove.ledger.attempt import AttemptLog
from grove.ledger.catch_up import rebuild
from grove.ledger.events import AttemptOpened
from grove.ledger.fold_drift import fold_drift
from grove.ledger.store import EventStore

from .forks import FORK, FORK_OF_FORK, SOURCE, fork_columns, source_and_forks
from .scenario import compaction_rollout, opened


@pytest.fixture
def forked(store: EventStore) -> Iterator[EventStore]:
    """The store with src, fork-1 and fork-2 recorded."""
    source_and_forks(AttemptLog(store))
    yield store


def lineage(store: EventStore, capture_key: str, call_id: str) -> list[tuple[str, str, int]]:
    """(ancestor_capture_key, ancestor_call_id, depth) of one call, by depth."""
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT ancestor_capture_key, ancestor_call_id, depth FROM grove_call_lineage "
                "WHERE capture_key = :k AND call_id = :c ORDER BY depth"
            ),
            {"k": capture_key, "c": call_id},
        )
        return [tuple(row) for row in rows]


def test_a_forks_first_call_reaches_the_source_call_and_its_root(forked: EventStore):
    assert lineage(forked, FORK, "f1") == [(FORK, "f1", 0), (SOURCE, "c2", 1), (SOURCE, "c1", 2)]


def test_a_forks_later_call_reaches_the_source_through_its_own_parent(forked: EventStore):
    assert lineage(forked, FORK, "f2") == [
        (FORK, "f2", 0),
        (FORK, "f1", 1),
        (SOURCE, "c2", 2),
        (SOURCE, "c1", 3),
    ]


def test_a_fork_of_a_fork_reaches_the_original_root(forked: EventStore):
    assert lineage(forked, FORK_OF_FORK, "g1") == [
        (FORK_OF_FORK, "g1", 0),
        (FORK, "f2", 1),
        (FORK, "f1", 2),
        (SOURCE, "c2", 3),
        (SOURCE, "c1", 4),
    ]


def test_a_forks_own_root_has_no_ancestor(forked: EventStore):
    assert lineage(forked, FORK, "f0") == [(FORK, "f0", 0)]


def test_the_source_calls_lineage_stays_in_the_source(forked: EventStore):
    assert lineage(forked, SOURCE, "c3") == [
        (SOURCE, "c3", 0),
        (SOURCE, "c2", 1),
        (SOURCE, "c1", 2),
    ]


def test_a_non_fork_attempts_lineage_is_unchanged(store: EventStore):
    store.append("att-1", compaction_rollout("att-1"))
    with store.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT call_id, ancestor_call_id, depth, ancestor_capture_key "
                "FROM grove_call_lineage WHERE capture_key = 'att-1' "
                "ORDER BY call_id, depth"
            )
        ).all()
    # c1 -> c2, c3 -> c4, c3 -> c5 -> c6, c5 -> c7: each call, then its ancestors
    expected = [
        ("c1", "c1", 0),
        ("c2", "c2", 0),
        ("c2", "c1", 1),
        ("c3", "c3", 0),
        ("c4", "c4", 0),
        ("c4", "c3", 1),
        ("c5", "c5", 0),
        ("c5", "c3", 1),
        ("c6", "c6", 0),
        ("c6", "c5", 1),
        ("c6", "c3", 2),
        ("c7", "c7", 0),
        ("c7", "c5", 1),
        ("c7", "c3", 2),
    ]
    assert [tuple(row) for row in rows] == [(*row, "att-1") for row in expected]


def test_grove_calls_shows_the_source_only_on_a_call_whose_parent_is_in_it(forked: EventStore):
    with forked.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT capture_key, call_id, parent_call_id, source_capture_key "
                "FROM grove_calls WHERE source_capture_key IS NOT NULL OR capture_key = :k "
                "ORDER BY intended_position"
            ),
            {"k": FORK},
        ).all()
    assert [tuple(row) for row in rows] == [
        (FORK, "f1", "c2", SOURCE),
        (FORK, "f2", "f1", None),
        (FORK, "f0", None, None),
        (FORK_OF_FORK, "g1", "f2", FORK),
    ]


def test_the_attempts_projection_records_each_forks_source(forked: EventStore):
    attempts, _ = fork_columns(forked)
    assert attempts == [(FORK, SOURCE, "c2"), (FORK_OF_FORK, FORK, "f2"), (SOURCE, None, None)]


def test_rebuilt_projections_hold_the_fork_columns_the_appends_folded(forked: EventStore):
    folded = fork_columns(forked)
    rebuild(forked)
    assert fork_columns(forked) == folded
    assert lineage(forked, FORK_OF_FORK, "g1")[-1] == (SOURCE, "c1", 4)


def test_fold_drift_finds_none_in_a_ledger_of_forks(forked: EventStore):
    assert fold_drift(forked) == []


def test_fold_drift_reports_a_fork_source_changed_by_hand(forked: EventStore):
    with forked.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE grove_proj_attempts SET fork_source_call_id = 'c3' WHERE capture_key = :k"
            ),
            {"k": FORK},
        )
    [drift] = fold_drift(forked)
    assert (drift.capture_key, drift.table) == (FORK, "grove_proj_attempts")
    assert (drift.expected[-2:], drift.found[-2:]) == ((SOURCE, "c2"), (SOURCE, "c3"))


def test_a_fork_source_name_holding_nul_is_folded_as_the_fold_reads_it(forked: EventStore):
    # PostgreSQL's text columns cannot hold U+0000: the fold shows it as U+FFFD there, as
    # fold_drift expects; SQLite keeps it.
    source = AttemptLog(forked).load(FORK).opened
    assert isinstance(source, AttemptOpened) and source.fork_from is not None
    odd = source.fork_from.model_copy(update={"source_call_id": "c\x002"})
    forked.append("fork-nul", [opened("fork-nul", rollout_id="r-nul", fork_from=odd)])
    with forked.engine.connect() as conn:
        shown = conn.execute(
            text(
                "SELECT fork_source_call_id FROM grove_proj_attempts WHERE capture_key = 'fork-nul'"
            )
        ).scalar_one()
    postgres = forked.engine.dialect.name == "postgresql"
    assert shown == ("c\ufffd2" if postgres else "c\x002")
    assert fold_drift(forked) == []
