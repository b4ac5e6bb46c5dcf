"""The reliability figures: each test records its counts under its own section of one JSON file.

Sections are merged under an exclusive file lock, so parallel test processes (xdist) can report
into the same file; ``python -m tests.reliability.figures`` prints the totals as the Markdown
table of ``docs/reliability.md``.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = ["FiguresFile", "markdown_table"]


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


def markdown_table(sections: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per section: its figures as ``name: value`` pairs (nested objects flattened)."""
    lines = ["| suite | figures |", "|---|---|"]
    for section in sorted(sections):
        pairs = ", ".join(f"{k}: {_render(v)}" for k, v in sorted(sections[section].items()))
        lines.append(f"| `{section}` | {pairs} |")
    return "\n".join(lines)


def _render(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} {_render(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


if __name__ == "__main__":
    print(
        markdown_table(
            FiguresFile(
                Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("figures.json")
            ).read()
        )
    )
