"""Smoke test of ``bench/fork.py``: the quick run plays forks and replays through the gateway and
reports both keys, with the forks' rows equal to the reference; and the two pieces that decide
its keys, the replay ratio and the batch read back into rows, against values worked out by hand.
Timings and the ratio's aim are not checked: tests never assert them. The ratio is above 1 by
construction (a fork generates only the turns after the fork turn, a replay all of them)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.forest import CallRecord, build_forest
from grove.training.rows import rollout_rows
from tests.fixtures.fork_reference import ReferenceRow

ROOT = Path(__file__).resolve().parents[2]
bench = importlib.import_module("bench.fork")  # bench/ is a directory of scripts
fork_rows = importlib.import_module("bench.support.fork_rows")


@pytest.fixture(scope="module")
def quick_report() -> dict[str, Any]:
    """``python -m bench.fork --quick --json``'s one JSON object."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.fork", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_quick_run_reports_both_keys_with_the_fork_rows_exact(
    quick_report: dict[str, Any],
) -> None:
    assert quick_report["fork_rows_exact"] == 1
    assert quick_report["replay_over_fork_generated_tokens"] > 1
    assert quick_report["replay_ratio_basis"] in ("obtained", "at_least_one_more_replay")
    # one source, four forks that each obtain a continuation, four replays
    assert (quick_report["fork_rollouts"], quick_report["fork_continuations"]) == (4, 4)
    assert quick_report["replay_rollouts"] == 4
    assert quick_report["fork_generated_tokens"] > 0 < quick_report["replay_generated_tokens"]


@pytest.mark.slow
def test_the_table_prints_both_keys(
    quick_report: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    bench.print_report(quick_report)

    lines = capsys.readouterr().out.splitlines()
    ratio = quick_report["replay_over_fork_generated_tokens"]
    assert f"{'replay_over_fork_generated_tokens':32} {ratio}" in lines
    assert f"{'fork_rows_exact':32} 1" in lines


def test_the_ratio_counts_replay_tokens_over_the_continuations_they_obtained() -> None:
    fork = bench.Side(generated_tokens=128, rollouts=4, continuations=4)
    replay = bench.Side(generated_tokens=256, rollouts=4, continuations=1)

    # worked out: forks 128 / 4 = 32 per continuation; replays 256 / 1 = 256; 256 / 32 = 8
    assert bench.replay_ratio(fork, replay) == (8.0, "obtained")


def test_the_ratio_without_a_reaching_replay_counts_one_more_replay_and_says_so() -> None:
    fork = bench.Side(generated_tokens=128, rollouts=4, continuations=4)
    replay = bench.Side(generated_tokens=256, rollouts=4, continuations=0)

    # worked out: had a fifth replay (256 / 4 = 64 tokens) reached the state, replays would have
    # spent 256 + 64 = 320 tokens on one continuation; forks 32 per continuation: 320 / 32 = 10
    assert bench.replay_ratio(fork, replay) == (10.0, "at_least_one_more_replay")


def test_batch_rows_reads_each_rollouts_rows_without_the_padding() -> None:
    # one fork: source call src/s0 (prompt 1 2, generated 3) as context, own call f0 (prompt 4,
    # generated 5 6, logprobs -0.5 -0.25); padded to 4 rows of the longest row's length
    calls = [
        CallRecord("src/s0", None, [1, 2], [3], [-1.0]),
        CallRecord("f0", "src/s0", [4], [5, 6], [-0.5, -0.25]),
    ]
    forest = build_forest(calls, ["src/s0", "f0"], context=["src/s0"])
    rollout = LogicalRollout("fork-0-0", "fork-0", tuple(rollout_rows(forest)))

    batch = assemble_batch([rollout], row_multiple=4, pad_token_id=9)

    assert fork_rows.batch_rows(batch) == {
        "fork-0-0": [
            ReferenceRow([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 1, 1], [0.0, 0.0, 0.0, 0.0, -0.5, -0.25])
        ]
    }
