"""Smoke test of ``bench/scale.py``: a ledger of a few hundred calls is built through the import
path, every figure is reported, and the projection rows it writes in bulk are the fold's, row for
row (``grove.ledger.catch_up.rebuild`` of the same ledger). Values are not checked: tests never
assert timings."""

from __future__ import annotations

import importlib

import pytest

from tests.fixtures.postgres import _pg_bin

bench = importlib.import_module("bench.scale")  # bench/ is a directory of scripts


@pytest.mark.slow
def test_scale_bench_reports_every_figure_and_its_bulk_rows_are_the_folds() -> None:
    if _pg_bin("initdb") is None or _pg_bin("pg_ctl") is None:
        pytest.skip("the scale bench starts a PostgreSQL cluster of its own: install initdb")

    report = bench.run((200,), rounds=2)

    figures = report["sizes"]["200"]
    assert figures["calls"] >= 200
    assert figures["attempts"] % (bench.ROLLOUTS_PER_GROUP * bench.GROUPS_PER_STEP) == 0
    assert figures["projection_rows_checked"] > figures["calls"]
    for name in bench.FIGURES:
        assert figures[name] > 0, name
    assert figures["postgres_bytes_per_call"] > 0 and figures["blob_bytes_per_call"] > 0
    assert report["lineage_ms_p99"] == {"200": figures["lineage_ms_p99"]}
    assert report["replay_ms"] == {"200": figures["replay_ms"]}
    assert report["growth_largest_over_smallest"] == 1.0
