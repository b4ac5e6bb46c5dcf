"""``make bench`` in miniature: every script of ``bench/`` is a module that runs from the
repository root without touching ``sys.path``, and the quick run of each one that no other smoke
test covers exits 0 with one JSON object of figures (``python -m bench.NAME --quick --json``),
except the three whose quick run takes minutes: their core runs on a smaller workload (the
learner's on short rows, without its two peak-memory processes, its bfloat16 demo run and its
larger-model smoke).

``bench/gateway.py``, ``bench/ledger_append.py`` and ``bench/scale.py`` have smoke tests of their
own (``test_bench_gateway.py``, ``test_bench_ledger_append.py``, ``test_bench_scale.py``) that run
their cores on smaller workloads than ``--quick``; ``test_bench_fork.py`` runs ``bench/fork.py``'s
quick run and checks its keys. Values are not checked: tests never assert
timings.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted(p.stem for p in (ROOT / "bench").glob("*.py"))
SMOKED_ELSEWHERE = frozenset({"fork", "gateway", "ledger_append", "scale"})
SMALLER_THAN_QUICK: dict[str, Callable[[ModuleType], dict[str, Any]]] = {
    "moe_replay": lambda bench: bench.run(rollouts=2, max_tokens=8, repeats=1),
    "tree": lambda bench: bench.run(rounds=1),
    "learner": lambda bench: {
        **bench.learner_over_plain(rows=4, length=64, rounds=1),
        **bench.packed_over_padded(rows=8, longest=64, rounds=1),
        **bench.fsdp_bytes_per_rank_over_single(),
    },
}
"""Benches whose quick run takes minutes on two cores: their core runs here on a smaller
workload, in this process."""
QUICK_TIMEOUT_S = 600


def test_bench_holds_only_scripts_and_helper_packages() -> None:
    entries = {p.name for p in (ROOT / "bench").iterdir() if p.name != "__pycache__"}

    assert entries - {f"{name}.py" for name in SCRIPTS} == {"servers", "support"}
    assert set(SCRIPTS) >= SMOKED_ELSEWHERE


@pytest.mark.parametrize("name", SCRIPTS)
def test_every_bench_script_imports_as_a_module_and_has_a_main(name: str) -> None:
    source = (ROOT / "bench" / f"{name}.py").read_text()

    module = importlib.import_module(f"bench.{name}")

    assert callable(module.main)
    assert "sys.path" not in source
    assert '"--quick"' in source and '"--json"' in source


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(SCRIPTS) - SMOKED_ELSEWHERE - set(SMALLER_THAN_QUICK)))
def test_the_quick_run_exits_0_with_one_json_object(name: str, tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", f"bench.{name}", "--quick", "--json"],
        cwd=ROOT,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=QUICK_TIMEOUT_S,
    )

    assert run.returncode == 0, run.stderr[-3000:]
    figures = json.loads(run.stdout.strip().splitlines()[-1])
    assert isinstance(figures, dict) and figures


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALLER_THAN_QUICK))
def test_the_core_runs_on_a_smaller_workload_and_reports_figures(name: str) -> None:
    figures = SMALLER_THAN_QUICK[name](importlib.import_module(f"bench.{name}"))

    assert json.loads(json.dumps(figures)) == figures and figures
