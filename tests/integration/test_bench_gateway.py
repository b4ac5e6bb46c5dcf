"""Smoke test of ``bench/gateway.py``: its core runs end to end on SQLite with a few calls and
reports every figure. Values are not checked: tests never assert timings."""

from __future__ import annotations

import importlib

import pytest


@pytest.mark.slow
def test_gateway_bench_reports_every_figure_for_sqlite_at_each_concurrency() -> None:
    """Every figure, the cost figures of the top level and the slower engine's included."""
    bench = importlib.import_module("bench.gateway")  # bench/ is a directory of scripts
    workload = bench.Workload(
        calls=2,
        attempts={1: 1, 2: 1},
        rounds=1,
        profile_attempts={1: 1},
        warmup_attempts=1,
        backends=("sqlite+local",),
    )

    report = bench.run_benchmark(workload)

    assert report["headline_backend"] == "sqlite+local"
    for name in bench.AIMS:
        assert name in report
        for clients in ("1", "2"):
            figures = report["backends"]["sqlite+local"][clients]
            assert name in figures and name in figures["aims_met"]
    for name in bench.COST_AIMS:
        assert report[name] is not None
    assert set(report["engine_delays"]["50ms"]) == {"1", "2"}
    stages = report["stages_per_call"]["sqlite+local"]["1"]
    for stage in ("server request", "intent append", "commit append", "blob put"):
        assert stage in stages["wall_ms"]
    for thread in ("grove-gateway", "AnyIO worker thread", "grove-intent"):
        assert stages["cpu_ms"][f"thread: {thread}"] > 0
    assert "server request" in report["stages_per_call"]["plain"]["1"]["wall_ms"]
