"""Smoke test of ``bench/ledger_append.py`` on PostgreSQL: its quick run reports every figure, and
Grove's reader misses none of the events 8 writer processes append while it tails the ledger.
Rates are not checked: tests never assert timings."""

from __future__ import annotations

import importlib

import pytest

from tests.fixtures.postgres import PostgresServer

FIGURES = (
    "single_events_per_s",
    "batched_events_per_s",
    "batched_events_per_s_no_fold",
    "raw_copy_events_per_s",
    "raw_copy_folded_events_per_s",
    "batched_over_copy",
    "batched_over_copy_no_fold",
    "batched_over_events_copy",
    "capture_call_us_plain",
    "capture_call_us_inline",
    "applier_cpu_ms_per_append",
    "applier_cpu_ms_per_append_uncached",
    "applier_cpu_over_uncached",
)


@pytest.mark.slow
def test_the_quick_run_reports_every_figure_and_grove_misses_no_event(
    postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = importlib.import_module("bench.ledger_append")  # bench/ is a directory of scripts
    monkeypatch.setattr(bench, "PG_ADMIN", postgres_server.url)

    report = bench.bench_postgres(quick=True)

    assert all(report[name] > 0 for name in FIGURES)
    assert report["events_written_by_8_writers"] == 8 * 500
    assert report["missed_events_grove"] == 0
