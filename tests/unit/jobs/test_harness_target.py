"""``harness.target: module:function`` is imported as ``python -m`` would from the current
directory (``grove/train/harness.py`` ``resolve_harness``; ``docs/train.md``, "Harnesses")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grove.train.harness import HarnessError, resolve_harness


def test_a_module_in_the_current_directory_resolves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    (tmp_path / "my_cwd_agent.py").write_text("def play(client, task, seed):\n    return {}\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_cwd_agent", raising=False)
    assert resolve_harness("my_cwd_agent:play").__module__ == "my_cwd_agent"


def test_a_module_nowhere_is_refused_naming_the_directory_searched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(HarnessError) as refused:
        resolve_harness("no_such_agent_module:play")
    assert f"from the current directory {tmp_path}" in str(refused.value)
