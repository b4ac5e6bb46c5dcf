"""docs/forest.md is executable: its Python blocks run, in order, in one namespace."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[3] / "docs" / "forest.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL)


def test_forest_doc_has_the_compaction_walkthrough_blocks() -> None:
    blocks = python_blocks(DOC.read_text())

    assert len(blocks) == 6
    assert 'build_forest(calls, ["c1", "c2", "c3", "c5"], terminal="c5")' in blocks[0]


def test_forest_doc_examples_run_and_their_assertions_hold() -> None:
    namespace: dict[str, object] = {}
    for block in python_blocks(DOC.read_text()):
        exec(compile(block, str(DOC), "exec"), namespace)
