"""``grove lineage``: the call tree of a demo attempt, read with SQL, marked call by call."""

from __future__ import annotations

import pytest

from grove.ledger.attempt import CallStatus

from .grove_cli import run_grove
from .ledgers import DemoLedger, run_json

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


def _lineage(demo: DemoLedger, key: str, database_url: str) -> dict:
    outcome = run_grove(
        "lineage", key, "--json", "--database-url", database_url,
        "--blob-url", demo.workspace.blob_url,
    )  # fmt: skip
    assert outcome.code == 0, outcome.stderr
    return run_json(outcome.stdout)


def test_lineage_marks_each_call_as_the_ledger_recorded_it(demo: DemoLedger, ledger_url: str):
    key = demo.showcase_key
    state = demo.state(key)
    (attempt,) = _lineage(demo, key, ledger_url)["attempts"]
    selection, finalized = state.selection, state.finalized
    assert attempt["capture_key"] == key
    assert [c["call_id"] for c in attempt["calls"]] == list(state.calls)
    assert attempt["paths"] == [list(p) for p in finalized.paths]
    for call in attempt["calls"]:
        recorded = state.calls[call["call_id"]]
        assert call["parent_call_id"] == recorded.parent_call_id
        assert call["decision"] == recorded.intended.decision
        assert call["root_reason"] == recorded.intended.root_reason
        assert call["status"] == recorded.status.value
        in_selection = recorded.call_id in selection.call_ids
        assert call["selection_index"] == (
            selection.call_ids.index(recorded.call_id) if in_selection else None
        )
        assert call["rows"] == [i for i, p in enumerate(finalized.paths) if call["call_id"] in p]
        assert call["endpoint"] == any(p[-1] == call["call_id"] for p in finalized.paths)
        assert call["cum_len"] == recorded.committed.cum_len
        assert call["masked_reason"] is None  # the showcase is trainable


def test_lineage_shows_the_rejected_call_unselected_and_the_rewrite_as_its_own_row(
    demo: DemoLedger,
):
    (attempt,) = _lineage(demo, demo.showcase_key, demo.workspace.database_url)["attempts"]
    calls = {c["call_id"]: c for c in attempt["calls"]}
    rejected = [c for c in calls.values() if c["failure_reason"] == "rejected_by_harness"]
    rewrites = [
        c
        for c in calls.values()
        if c["root_reason"] == "history_rewritten" and c["failure_reason"] is None
    ]  # a rejected rewrite is an unselected call like any other rejected one
    assert rejected and rewrites
    for call in rejected:
        assert (call["status"], call["selection_index"], call["rows"]) == (
            CallStatus.COMMITTED.value,
            None,
            [],
        )
    for call in rewrites:
        assert call["decision"] == "root" and call["depth"] == 0
        assert call["root_call_id"] == call["call_id"]
        (row,) = [i for i, path in enumerate(attempt["paths"]) if path[0] == call["call_id"]]
        assert call["owner_row"] == row
    assert attempt["rollout"]["status"] == "trainable"
    assert attempt["rollout"]["rows"] == len(attempt["paths"]) >= 2
    assert attempt["rollout"]["step"] == 0
    assert sum(c["terminal"] for c in calls.values()) == 1


def test_lineage_of_a_continuation_names_its_root_and_depth(demo: DemoLedger):
    (attempt,) = _lineage(demo, demo.showcase_key, demo.workspace.database_url)["attempts"]
    calls = {c["call_id"]: c for c in attempt["calls"]}
    for call in calls.values():
        depth, root = 0, call
        while root["parent_call_id"] is not None:
            depth, root = depth + 1, calls[root["parent_call_id"]]
        assert (call["root_call_id"], call["depth"]) == (root["call_id"], depth)


def test_lineage_by_rollout_id_lists_the_rollouts_attempts(demo: DemoLedger):
    rollout_id = demo.state(demo.showcase_key).opened.rollout_id
    lineage = _lineage(demo, rollout_id, demo.workspace.database_url)
    assert lineage["key"] == rollout_id
    assert [a["capture_key"] for a in lineage["attempts"]] == [demo.showcase_key]


def test_lineage_tree_marks_status_selection_endpoints_and_rows(demo: DemoLedger):
    rows = len(demo.state(demo.showcase_key).finalized.paths)
    outcome = run_grove("lineage", demo.showcase_key, "--workdir", str(demo.workspace.workdir))
    assert outcome.code == 0, outcome.stderr
    text = " ".join(outcome.stdout.split())
    for mark in (
        f"attempt {demo.showcase_key}",
        "root (first_call)",
        "root (history_rewritten)",
        "committed (rejected_by_harness) not selected",
        "selected #0",
        "endpoint",
        "terminal",
        f"loss in row {rows - 1}",
        f"trainable, {rows} rows, trained at step 0",
    ):
        assert mark in text, mark


def test_lineage_of_an_unknown_key_fails_with_a_clear_error(demo: DemoLedger):
    outcome = run_grove("lineage", "no-such-attempt", "--workdir", str(demo.workspace.workdir))
    assert outcome.code == 1
    assert "no attempt has this capture key or rollout id (key 'no-such-attempt')" in " ".join(
        outcome.stderr.split()
    )
    assert outcome.stdout == ""
