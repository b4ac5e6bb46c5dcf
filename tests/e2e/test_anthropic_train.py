"""``grove train examples/anthropic.yaml``: a harness on the official ``anthropic`` client trains
like the demo, through ``POST /v1/messages``, and ``grove replay --verify`` holds on its attempts.

The shipped configuration runs with the overrides of ``tests/e2e/fast_config.py`` (no warm start,
two prompt groups of two rollouts, a compaction after every question but the last), so that two
steps take well under a minute and a half on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.tools.replay import replay
from grove.workspace import Workspace
from tests.e2e.fast_config import EXAMPLES, fast_config

GROVE = str(Path(sys.executable).parent / "grove")
GROUPS, ROLLOUTS, STEPS = 2, 2, 2

pytestmark = pytest.mark.xdist_group("grove-anthropic-train")


def grove(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``grove ARGS --json --workdir WORKDIR`` from the examples directory, so the configuration's
    harness (``anthropic_agent:play``) is imported from where it is shipped."""
    return subprocess.run(
        [GROVE, *args, "--json", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=EXAMPLES,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[AttemptState]]:
    """Two steps of the Messages agent: the workdir, the run's summary and its attempts."""
    workdir = tmp_path_factory.mktemp("anthropic")
    config = fast_config("anthropic.yaml", workdir, groups=GROUPS, rollouts=ROLLOUTS)
    result = grove(workdir, "train", str(config), "--steps", str(STEPS))
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    store = EventStore.open(Workspace.resolve(workdir).database_url, pool=False)
    try:
        log = AttemptLog(store)
        states = [
            log.load(f"{summary['run_id']}-s{s}-g{g}-r{r}")
            for s in range(STEPS)
            for g in range(GROUPS)
            for r in range(ROLLOUTS)
        ]
    finally:
        store.close()
    return workdir, summary, states


def test_two_steps_train_every_rollout_on_more_rows_than_rollouts(
    trained: tuple[Path, dict, list[AttemptState]],
) -> None:
    _, summary, _ = trained
    assert summary["steps"] == STEPS
    assert summary["logical_rollouts"] == STEPS * GROUPS * ROLLOUTS  # 8
    assert summary["rows"] > summary["logical_rollouts"]  # compaction made more rows
    assert summary["max_tmpe"] < 1.001
    assert summary["max_gen_kl_error"] < 1e-6


def test_each_answer_continues_its_context_and_each_compaction_starts_a_new_root(
    trained: tuple[Path, dict, list[AttemptState]],
) -> None:
    _, _, states = trained
    for state in states:
        reasons = [c.intended.root_reason for c in state.calls.values()]
        decisions = [c.intended.decision for c in state.calls.values()]
        assert reasons.count("history_rewritten") >= 1, state.capture_key
        assert "continuation" in decisions, state.capture_key


def test_the_returned_messages_history_selects_the_calls_it_accepted(
    trained: tuple[Path, dict, list[AttemptState]],
) -> None:
    _, _, states = trained
    for state in states:
        assert state.selection is not None
        accepted = [c.call_id for c in state.calls.values() if c.failure is None]
        assert list(state.selection.call_ids) == accepted, state.capture_key


def test_grove_replay_verify_holds_on_the_attempts(
    trained: tuple[Path, dict, list[AttemptState]],
) -> None:
    workdir, _, states = trained
    result = grove(workdir, "replay", states[0].capture_key, "--verify")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    checks = json.loads(result.stdout)["checks"]
    assert {c["decision"] for c in checks} == {
        "admission",
        "selection",
        "finalization",
        "publication",
    }
    assert {c["outcome"] for c in checks} == {"same"}
    # The rest through the function the command calls, in this process.
    space = Workspace.resolve(workdir)
    store = EventStore.open(space.database_url, pool=False)
    try:
        blobs = open_blob_store(space.blob_url)
        for state in states[1:]:
            verified = replay(store, state.capture_key, blobs=blobs).checks
            assert verified is not None
            assert {c.outcome.value for c in verified} == {"same"}, state.capture_key
    finally:
        store.close()
