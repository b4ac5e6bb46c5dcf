"""Shared fixtures: every ledger contract test runs on SQLite and PostgreSQL.

The summary at the end of the run says how many tests ran on each database (and each blob
backend), so a run that silently skipped PostgreSQL is visible.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.fixtures.postgres", "tests.fixtures.s3"]

DATABASES = ["sqlite", "postgresql"]


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """An empty ledger database: a SQLite file, or a fresh PostgreSQL database."""
    request.node.user_properties.append(("database", request.param))
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ledger.db'}"
    else:
        yield request.getfixturevalue("postgres_url")


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Print how many tests ran (passed, failed, skipped) per database and blob backend."""
    counts: Counter[tuple[str, str, str]] = Counter()
    for outcome in ("passed", "failed", "error", "skipped"):
        for report in terminalreporter.stats.get(outcome, []):
            if getattr(report, "when", "call") not in ("call", "setup"):
                continue
            if report.when == "setup" and outcome == "passed":
                continue
            for key, value in getattr(report, "user_properties", []):
                if key in ("database", "blob_backend"):
                    counts[(key, value, outcome)] += 1
    if not counts:
        return
    terminalreporter.section("tests per backend")
    for key in ("database", "blob_backend"):
        for value in sorted({v for (k, v, _) in counts if k == key}):
            parts = [
                f"{counts[(key, value, o)]} {o}"
                for o in ("passed", "failed", "error", "skipped")
                if counts[(key, value, o)]
            ]
            terminalreporter.write_line(f"{key} {value}: {', '.join(parts)}")
