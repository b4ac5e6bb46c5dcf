"""The main job end to end: ``grove demo`` trains the recency agent, and resumes exactly."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

GROVE = str(Path(sys.executable).parent / "grove")


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


def test_a_two_step_demo_trains_forest_rows_with_exact_logprobs(tmp_path: Path):
    summary = demo(tmp_path, "--steps", "2")
    assert summary["steps"] == 2
    assert summary["logical_rollouts"] == 16
    assert summary["rows"] > summary["logical_rollouts"]  # compaction made more rows
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


@pytest.mark.slow
def test_a_resumed_demo_reaches_the_state_of_an_uninterrupted_one(tmp_path: Path):
    straight = demo(tmp_path / "straight", "--steps", "3")
    demo(tmp_path / "resumed", "--steps", "2")
    resumed = demo(tmp_path / "resumed", "--steps", "3", "--resume")
    assert resumed["steps"] == straight["steps"] == 3
    a = load_file(Path(straight["checkpoint"], "model.safetensors"))
    b = load_file(Path(resumed["checkpoint"], "model.safetensors"))
    assert a.keys() == b.keys()
    assert all(a[name].equal(b[name]) for name in a)  # bitwise
    assert resumed["reward_last"] == straight["reward_last"]
