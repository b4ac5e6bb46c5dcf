"""The reliability figures: each test records its counts under its own section of one JSON file.

A test run writes them into the repository's ``tests/reliability/figures.json`` only on request
(``GROVE_RELIABILITY_FIGURES=1``); otherwise into a scratch file of the run, so that running the
tests changes no tracked file (:func:`figures_path`). Sections are merged under an exclusive file
lock, so parallel test processes (xdist) can report into the same file.
``python -m tests.reliability.figures [--write docs/reliability.md]`` sums the sections per suite
(the first part of a section's name) and prints the Markdown tables, or writes them between the
``<!-- figures -->`` markers of the document.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["DEFAULT", "REQUEST_ENV", "FiguresFile", "figures_path", "markdown", "totals"]

BEGIN, END = "<!-- figures -->", "<!-- /figures -->"
DEFAULT = Path(__file__).with_name("figures.json")
REQUEST_ENV = "GROVE_RELIABILITY_FIGURES"


def figures_path(environ: Mapping[str, str], scratch: Path) -> Path:
    """Where a test run records its figures: :data:`DEFAULT` when ``environ`` asks for them
    (``GROVE_RELIABILITY_FIGURES=1``), else ``figures.json`` in the run's ``scratch`` directory."""
    if environ.get(REQUEST_ENV) == "1":
        return DEFAULT
    return scratch / "figures.json"


class FiguresFile:
    """A JSON object of sections, each one test's figures, updated section by section."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, section: str, figures: Mapping[str, Any]) -> None:
        """Replace ``section`` with ``figures`` (JSON-able), keeping every other section."""
        lock = Path(tempfile.gettempdir()) / "grove-reliability-figures.lock"
        with lock.open("w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            sections = self.read()
            sections[section] = dict(figures)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(sections, indent=2, sort_keys=True) + "\n")
            temporary.replace(self.path)

    def read(self) -> dict[str, Any]:
        """Every section recorded so far ({} when there is no file yet)."""
        if not self.path.exists():
            return {}
        return json.loads(self.path.read_text())


def _add(total: dict[str, Any], figures: Mapping[str, Any]) -> None:
    for name, value in figures.items():
        if isinstance(value, Mapping):
            _add(total.setdefault(name, {}), value)
        elif isinstance(value, bool) or not isinstance(value, int | float):
            total[name] = value
        else:
            total[name] = total.get(name, 0) + value


def totals(sections: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """The figures summed per suite (``crash/sqlite-local`` counts towards ``crash``); nested
    counts (kills by point, outcomes) are summed key by key, text keeps the last value."""
    suites: dict[str, dict[str, Any]] = {}
    for section in sorted(sections):
        _add(suites.setdefault(section.split("/")[0], {}), sections[section])
    return suites


def _cell(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k} {_cell(v)}" for k, v in sorted(value.items()))
    return f"{value:.1f}" if isinstance(value, float) else str(value)


def markdown(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """One table per suite with its summed figures, then one row per section."""
    parts = []
    for suite, figures in totals(sections).items():
        rows = [f"| {name} | {_cell(value)} |" for name, value in sorted(figures.items())]
        parts.append("\n".join([f"**{suite}** (all runs summed)", "", "| figure | value |",
                                "|---|---|", *rows]))  # fmt: skip
    detail = [f"| `{s}` | {_cell(sections[s])} |" for s in sorted(sections)]
    parts.append("\n".join(["Per test:", "", "| section | figures |", "|---|---|", *detail]))
    return "\n\n".join(parts)


def main() -> None:
    """Print the tables, or write them into a document between the figures markers."""
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.figures")
    parser.add_argument("--figures", type=Path, default=DEFAULT)
    parser.add_argument("--write", type=Path, help="a document with the figures markers")
    args = parser.parse_args()
    tables = markdown(FiguresFile(args.figures).read())
    if args.write is None:
        print(tables)
        return
    text = args.write.read_text()
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    args.write.write_text(f"{head}{BEGIN}\n{tables}\n{END}{tail}")


if __name__ == "__main__":
    main()
