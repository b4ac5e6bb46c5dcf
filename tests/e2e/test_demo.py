"""The main job end to end: ``grove demo`` warm-starts the embedded model, trains the tool-using
compaction agent (``grove/demo/tool_agent.py``) on it so that its reward rises, and resumes
exactly; ``make demo`` closes with the reward curve (``grove/demo/curve.py``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from grove.demo.curve import edge_means, main, rewards, sparkline
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.store import EventStore
from grove.workspace import Workspace

GROVE = str(Path(sys.executable).parent / "grove")
SHORT_STEPS = 8  # the shortened demo: long enough for the reward to rise
GROUPS, ROLLOUTS = 2, 8  # prompt groups per step, rollouts per group (grove/demo/demo.yaml)

# One worker runs both tests, so the resumed demo reuses the first demo's warm start.
pytestmark = pytest.mark.xdist_group("grove-demo")


def demo(workdir: Path, *args: str) -> dict:
    result = subprocess.run(
        [GROVE, "demo", "--json", "--workdir", str(workdir), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, "--json prints exactly one line on stdout"
    return json.loads(lines[0])


def attempts(workdir: Path, run_id: str, steps: int) -> list[AttemptState]:
    """Every attempt of the demo's run: two prompt groups of eight rollouts per step."""
    store = EventStore.open(Workspace.resolve(workdir).database_url, pool=False)
    try:
        log = AttemptLog(store)
        return [
            log.load(f"{run_id}-s{s}-g{g}-r{r}")
            for s in range(steps)
            for g in range(GROUPS)
            for r in range(ROLLOUTS)
        ]
    finally:
        store.close()


@pytest.fixture(scope="module")
def short_demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A shortened demo from scratch (the warm start fitted in its workdir): workdir, summary."""
    workdir = tmp_path_factory.mktemp("demo")
    return workdir, demo(workdir, "--steps", str(SHORT_STEPS))


def test_a_short_demo_trains_a_tool_using_agent_on_forest_rows_with_exact_logprobs(
    short_demo: tuple[Path, dict],
):
    workdir, summary = short_demo
    assert summary["steps"] == SHORT_STEPS
    assert summary["logical_rollouts"] == SHORT_STEPS * GROUPS * ROLLOUTS
    assert summary["rows"] > summary["logical_rollouts"]  # compaction made more rows
    assert summary["reward_first"] > 0
    assert summary["max_tmpe"] < 1.001
    assert summary["max_gen_kl_error"] < 1e-6
    assert Path(summary["checkpoint"], "manifest.json").is_file()
    assert set(summary) == {
        "steps",
        "logical_rollouts",
        "rows",
        "max_tmpe",
        "max_gen_kl_error",
        "reward_first",
        "reward_last",
        "checkpoint",
        "run_id",
    }
    # The model was warm-started, and the fit is cached in the workdir.
    (entry,) = (workdir / "warm_start").iterdir()
    fit = json.loads((entry / "manifest.json").read_text())
    assert fit["final_loss"] < fit["first_loss"] / 10
    # The agent called its tool, and every accepted tool call was continued with its result.
    states = attempts(workdir, summary["run_id"], steps=SHORT_STEPS)
    calls = [(s.capture_key, c) for s in states for c in s.calls.values()]
    looked_up = [
        (key, c.call_id)
        for key, c in calls
        if c.committed is not None and c.committed.finish_reason == "tool_calls"
        if c.failure is None  # not rejected
    ]
    continued = {
        (key, c.parent_call_id) for key, c in calls if c.intended.decision == "continuation"
    }
    assert len(looked_up) >= summary["logical_rollouts"]  # at least one per rollout
    assert set(looked_up) <= continued
    # A compaction restarted the context: a new root, hence more rows than rollouts.
    assert any(c.intended.root_reason == "history_rewritten" for _, c in calls)


@pytest.mark.slow
def test_a_resumed_demo_reaches_the_state_of_an_uninterrupted_one(
    tmp_path: Path, short_demo: tuple[Path, dict]
):
    # The warm start is deterministic (tests/unit/jobs/test_warm_start.py): share its cache.
    for run in ("straight", "resumed"):
        shutil.copytree(short_demo[0] / "warm_start", tmp_path / run / "warm_start")
    straight = demo(tmp_path / "straight", "--steps", "3")
    demo(tmp_path / "resumed", "--steps", "2")
    resumed = demo(tmp_path / "resumed", "--steps", "3", "--resume")
    assert resumed["steps"] == straight["steps"] == 3
    a = load_file(Path(straight["checkpoint"], "model.safetensors"))
    b = load_file(Path(resumed["checkpoint"], "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(a[name].equal(b[name]) for name in a)  # bitwise
    assert resumed["reward_last"] == straight["reward_last"]


def test_the_reward_of_a_short_demo_rises(short_demo: tuple[Path, dict]):
    workdir, summary = short_demo
    run_dir = workdir / "runs" / summary["run_id"]

    first, last = edge_means(rewards(run_dir))

    assert len(rewards(run_dir)) == SHORT_STEPS
    assert last >= first + 0.1, rewards(run_dir)


def test_the_demo_closes_with_its_reward_curve_and_the_report_path(
    short_demo: tuple[Path, dict], capsys: pytest.CaptureFixture[str]
):
    workdir, summary = short_demo
    values = rewards(workdir / "runs" / summary["run_id"])
    first, last = edge_means(values)

    main([str(workdir / "report.html"), "--workdir", str(workdir)])

    lines = capsys.readouterr().out.splitlines()
    assert lines[-4] == f"reward per step ({SHORT_STEPS} steps, run {summary['run_id']}, 0 to 1):"
    assert lines[-3] == f"  {sparkline(values)}"
    assert lines[-2].startswith(f"  first 3 steps {first:.3f}  ->  last 3 steps {last:.3f}")
    assert lines[-1] == f"report: {(workdir / 'report.html').resolve()}"


def test_a_sparkline_draws_zero_as_the_lowest_bar_one_as_the_highest_and_gaps_as_spaces():
    assert sparkline([0.0, 0.5, 1.0, None, float("nan"), 1.7, -0.2]) == "▁▅█  █▁"


def test_the_edge_means_cover_the_first_and_the_last_three_finite_rewards():
    assert edge_means([0.1, None, 0.2, 0.3, 0.5, 0.7, 0.9]) == pytest.approx((0.2, 0.7))
