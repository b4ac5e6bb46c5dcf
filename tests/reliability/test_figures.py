"""The suites' figures reach the tracked ``tests/reliability/figures.json`` only on request: an
ordinary test run writes nothing into the repository."""

from __future__ import annotations

import os
from pathlib import Path

from .figures import DEFAULT, REQUEST_ENV, FiguresFile, figures_path


def test_without_the_request_figures_go_to_the_runs_scratch_directory(tmp_path: Path):
    assert figures_path({}, tmp_path) == tmp_path / "figures.json"
    assert figures_path({REQUEST_ENV: "0"}, tmp_path) == tmp_path / "figures.json"


def test_with_the_request_figures_go_to_the_tracked_file(tmp_path: Path):
    assert figures_path({REQUEST_ENV: "1"}, tmp_path) == DEFAULT


def test_the_suites_figures_file_is_the_tracked_one_only_when_the_run_asks(figures: FiguresFile):
    asked = os.environ.get(REQUEST_ENV) == "1"
    assert (figures.path == DEFAULT) == asked


def test_a_recorded_section_replaces_only_itself(tmp_path: Path):
    figures = FiguresFile(tmp_path / "figures.json")
    figures.record("crash/a", {"kills": 1})
    figures.record("crash/b", {"kills": 2})
    figures.record("crash/a", {"kills": 3})
    assert figures.read() == {"crash/a": {"kills": 3}, "crash/b": {"kills": 2}}
