"""``grove train examples/fork.yaml``: per-state groups with the demo's agent (``docs/fork.md``).

The shipped configuration runs with the overrides of ``tests/e2e/fast_config.py`` (no warm start,
two prompt groups of two rollouts, a compaction after every question but the last), so that three
steps take well under a minute on two cores. From step 1 on, one of
the two groups of each step is a fork group: two forks of one turn of the previous step.
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
from tests.e2e.fast_config import fast_config

GROVE = str(Path(sys.executable).parent / "grove")
GROUPS, ROLLOUTS, STEPS = 2, 2, 3

pytestmark = pytest.mark.xdist_group("grove-fork-train")


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, list[AttemptState]]:
    """Three steps with forks: the workdir, the run's summary and every fork attempt."""
    workdir = tmp_path_factory.mktemp("fork-train")
    config = str(fast_config("fork.yaml", workdir, groups=GROUPS, rollouts=ROLLOUTS))
    result = subprocess.run(
        [GROVE, "train", config, "--steps", str(STEPS), "--json", "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    store = EventStore.open(Workspace.resolve(workdir).database_url, pool=False)
    try:
        log = AttemptLog(store)
        run = summary["run_id"]
        forks = [log.load(f"{run}-s{s}-f0-r{r}") for s in range(1, STEPS) for r in range(ROLLOUTS)]
    finally:
        store.close()
    return workdir, summary, forks


def test_every_step_trains_its_groups_and_steps_after_the_first_fork_one(trained) -> None:
    workdir, summary, forks = trained
    assert summary["logical_rollouts"] == STEPS * GROUPS * ROLLOUTS
    assert all(f.opened is not None and f.opened.fork_from is not None for f in forks)
    lines = (workdir / "runs" / summary["run_id"] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["metrics"]["forks/groups"] for line in lines] == [0.0, 1.0, 1.0]


def test_each_fork_continues_a_turn_of_the_previous_step(trained) -> None:
    _, summary, forks = trained
    for fork in forks:
        source = fork.opened.fork_from
        step = int(fork.capture_key.split("-s")[-1].split("-")[0])
        assert source.source_capture_key.startswith(f"{summary['run_id']}-s{step - 1}-g")
        first = next(iter(fork.calls.values()))
        # the fork's first call continues the source call, unless that call wrote a summary
        # (then the agent starts a new context from its notes: a rewrite)
        if first.intended.decision == "continuation":
            assert first.parent_call_id == source.source_call_id
            assert first.intended.source_capture_key == source.source_capture_key
        else:
            assert first.intended.root_reason == "history_rewritten"


def test_the_forks_of_one_state_are_one_group_and_each_is_selected(trained) -> None:
    _, _, forks = trained
    by_group = {}
    for fork in forks:
        assert fork.selection is not None, fork.capture_key
        by_group.setdefault(fork.opened.prompt_group, set()).add(
            (fork.opened.fork_from.source_capture_key, fork.opened.fork_from.source_call_id)
        )
    assert all(len(sources) == 1 for sources in by_group.values())


def test_grove_replay_verify_holds_on_the_forks(trained) -> None:
    workdir, _, forks = trained
    space = Workspace.resolve(workdir)
    store = EventStore.open(space.database_url, pool=False)
    try:
        blobs = open_blob_store(space.blob_url)
        for fork in forks:
            checks = replay(store, fork.capture_key, blobs=blobs).checks
            assert checks is not None
            assert {c.outcome.value for c in checks} == {"same"}, fork.capture_key
    finally:
        store.close()
