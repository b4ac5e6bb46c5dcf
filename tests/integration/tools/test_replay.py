"""``grove replay``: a demo attempt folded event by event, its decisions re-run with today's code.

The "changed decision" tests swap one decision function in this process, as a code change would,
and show that ``--verify`` reports the difference and exits non-zero.
"""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

import pytest

from grove.ledger import admission
from grove.ledger.admission import DecisionKind, RootReason
from grove.ledger.events import BatchPublished
from grove.ledger.store import EventStore
from grove.training import finalization
from grove.training.selection import BUILTIN_POLICIES, returned_history

from .grove_cli import Outcome, run_grove
from .ledgers import DemoLedger, copy_ledger, run_json

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


def _replay(demo: DemoLedger, key: str, *args: str, database_url: str | None = None) -> Outcome:
    return run_grove(
        "replay", key, "--json", *args,
        "--database-url", database_url or demo.workspace.database_url,
        "--blob-url", demo.workspace.blob_url,
    )  # fmt: skip


def _checks(outcome: Outcome, decision: str) -> list[dict]:
    return [c for c in run_json(outcome.stdout)["checks"] if c["decision"] == decision]


@pytest.fixture
def sqlite_copy(demo: DemoLedger, tmp_path: Path) -> str:
    """A SQLite copy of the demo ledger that a test may append to."""
    url = f"sqlite:///{tmp_path / 'copy.db'}"
    copy_ledger(demo, url)
    return url


def test_replay_prints_the_state_after_each_event(demo: DemoLedger):
    key = demo.showcase_key
    state = demo.state(key)
    outcome = _replay(demo, key)
    assert outcome.code == 0, outcome.stderr
    replay = run_json(outcome.stdout)
    steps = replay["steps"]
    assert replay["checks"] is None
    assert len(steps) == state.version
    assert [s["stream_version"] for s in steps] == list(range(1, state.version + 1))
    for before, step in pairwise(steps):
        call = step["detail"].split(":")[0]
        if step["event_type"] == "call.intended":
            assert call in step["state"]["pending"] and call not in before["state"]["pending"]
        if step["event_type"] == "call.committed":
            assert call in step["state"]["committed"] and call not in step["state"]["pending"]
    final = steps[-1]["state"]
    assert final["admissions_closed"] and final["settled"]
    assert final["selection"] == list(state.selection.call_ids)
    assert final["finalization"] == "trainable"
    assert final["paths"] == [list(p) for p in state.finalized.paths]
    assert final["failures"] == {
        c.call_id: c.failure.reason for c in state.calls.values() if c.failure is not None
    }


def test_replay_until_stops_after_that_position(demo: DemoLedger):
    store = EventStore.open(demo.workspace.database_url, pool=False)
    events = store.read_stream(demo.showcase_key)
    store.close()
    selected = next(e for e in events if e.event_type == "rollout.selected")
    outcome = _replay(demo, demo.showcase_key, "--until", str(selected.position), "--verify")
    assert outcome.code == 0, outcome.stderr
    replay = run_json(outcome.stdout)
    assert replay["steps"][-1]["position"] == selected.position
    assert replay["steps"][-1]["state"]["finalization"] is None
    assert {c["decision"] for c in replay["checks"]} == {"admission", "selection"}


def test_verify_finds_every_recorded_decision_reproduced(demo: DemoLedger, ledger_url: str):
    state = demo.state(demo.showcase_key)
    outcome = _replay(demo, demo.showcase_key, "--verify", database_url=ledger_url)
    assert outcome.code == 0, outcome.stderr
    checks = run_json(outcome.stdout)["checks"]
    assert [(c["decision"], c["subject"]) for c in checks] == [
        *(("admission", call_id) for call_id in state.calls),
        ("selection", demo.showcase_key),
        ("finalization", state.opened.rollout_id),
        ("publication", f"step 0 of {demo.training_stream}"),
    ]
    assert {c["outcome"] for c in checks} == {"same"}


def test_verify_reports_a_changed_admission_decision_and_exits_non_zero(
    demo: DemoLedger, monkeypatch: pytest.MonkeyPatch
):
    decide = admission.decide

    def roots_every_call(boundary, **kwargs):
        decision = decide(boundary, **kwargs)
        if decision.kind is DecisionKind.CONTINUATION:
            return decision.rooted(RootReason.HISTORY_REWRITTEN)
        return decision

    monkeypatch.setattr(admission, "decide", roots_every_call)
    outcome = _replay(demo, demo.showcase_key, "--verify")
    assert outcome.code == 1
    state = demo.state(demo.showcase_key)
    checks = {c["subject"]: c for c in _checks(outcome, "admission")}
    for call in state.calls.values():
        check = checks[call.call_id]
        if call.intended.decision == "continuation":
            assert check["outcome"] == "differs"
            assert check["differences"] == [
                "kind: recorded 'continuation', today 'root'",
                f"parent_call_id: recorded {call.parent_call_id!r}, today None",
                "reason: recorded None, today 'history_rewritten'",
            ]
        else:
            assert check["outcome"] == "same"


def test_verify_reports_a_changed_selection_policy_and_exits_non_zero(
    demo: DemoLedger, monkeypatch: pytest.MonkeyPatch
):
    def terminal_only(records, result):
        chosen, terminal = returned_history(records, result)
        return [r for r in chosen if r.response_id == terminal], terminal

    monkeypatch.setitem(BUILTIN_POLICIES, "returned_history", terminal_only)
    outcome = _replay(demo, demo.showcase_key, "--verify")
    assert outcome.code == 1
    selection = demo.state(demo.showcase_key).selection
    terminal = next(
        c.call_id
        for c in demo.state(demo.showcase_key).calls.values()
        if c.committed and c.committed.response_id == selection.terminal_response_id
    )
    (check,) = _checks(outcome, "selection")
    assert check["outcome"] == "differs"
    assert check["differences"] == [
        f"call_ids: recorded {list(selection.call_ids)!r}, today {[terminal]!r}"
    ]


def test_verify_reports_a_changed_forest_and_exits_non_zero(
    demo: DemoLedger, monkeypatch: pytest.MonkeyPatch
):
    build_forest = finalization.build_forest

    def reversed_paths(records, selected, terminal=None, **options):
        return build_forest(records, list(reversed(selected)), terminal=terminal, **options)

    monkeypatch.setattr(finalization, "build_forest", reversed_paths)
    outcome = _replay(demo, demo.showcase_key, "--verify")
    assert outcome.code == 1
    finalized = demo.state(demo.showcase_key).finalized
    (check,) = _checks(outcome, "finalization")
    assert check["outcome"] == "differs"
    assert [line.split(":")[0] for line in check["differences"]] == ["paths", "owned"]
    assert f"recorded {[list(p) for p in finalized.paths]!r}" in check["differences"][0]


def test_verify_reports_a_rollout_published_in_two_steps(demo: DemoLedger, sqlite_copy: str):
    store = EventStore.open(sqlite_copy, pool=False)
    (first,) = store.read_stream(demo.training_stream)
    again = first.decode().model_copy(update={"step": 1})
    assert isinstance(again, BatchPublished)
    store.append(demo.training_stream, [again], expected_version=1)
    store.close()
    outcome = _replay(demo, demo.showcase_key, "--verify", database_url=sqlite_copy)
    assert outcome.code == 1
    rollout_id = demo.state(demo.showcase_key).opened.rollout_id
    steps = _checks(outcome, "publication")
    assert [c["subject"] for c in steps] == [
        f"step 0 of {demo.training_stream}",
        f"step 1 of {demo.training_stream}",
    ]
    for check in steps:
        assert check["outcome"] == "differs"
        assert check["differences"][:2] == [
            f"rollout {rollout_id} is published in 2 steps",
            f"rollout {first.decode().rollout_ids[0]} is published 2 times",
        ]


def test_verify_in_the_terminal_tallies_the_decisions(demo: DemoLedger):
    outcome = run_grove(
        "replay", demo.showcase_key, "--verify", "--workdir", str(demo.workspace.workdir)
    )
    assert outcome.code == 0, outcome.stderr
    calls = len(demo.state(demo.showcase_key).calls)
    assert f"{calls + 3} decisions re-run: {calls + 3} same, 0 differ, 0 skipped" in outcome.stdout


def test_replay_of_an_unknown_key_fails_with_a_clear_error(demo: DemoLedger):
    outcome = run_grove("replay", "no-such-attempt", "--workdir", str(demo.workspace.workdir))
    assert outcome.code == 1
    assert "no attempt has this capture key or rollout id (key 'no-such-attempt')" in " ".join(
        outcome.stderr.split()
    )


def test_replay_of_a_training_stream_fails_with_a_clear_error(demo: DemoLedger):
    outcome = run_grove("replay", demo.training_stream, "--workdir", str(demo.workspace.workdir))
    assert outcome.code == 1
    assert (
        "the stream is not an attempt: it starts with batch.published, not attempt.opened"
        in " ".join(outcome.stderr.split())
    )


def test_replay_shows_an_event_that_breaks_the_lifecycle_as_left_out(
    demo: DemoLedger, sqlite_copy: str
):
    key = demo.showcase_key
    store = EventStore.open(sqlite_copy, pool=False)
    first_call = next(iter(demo.state(key).calls.values()))
    store.append(key, [first_call.committed])  # a second commit, appended around AttemptLog
    store.close()
    outcome = _replay(demo, key, database_url=sqlite_copy)
    assert outcome.code == 0, outcome.stderr
    last = run_json(outcome.stdout)["steps"][-1]
    why = f"call.committed of call {first_call.call_id}: the call is already committed"
    assert last["detail"] == f"left out, it breaks the lifecycle: {why}"
    assert last["state"]["contradictions"] == [why]
