"""``harness.target: module:function`` is imported as ``python -m`` would from the current
directory, then from the configuration file's directory (``grove/train/harness.py``
``resolve_harness``; ``docs/train.md``, "Harnesses")."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from grove.config import load_config
from grove.train.harness import HarnessError, resolve_harness
from grove.train.preflight import preflight


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


def test_a_module_beside_the_configuration_file_resolves_from_another_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    (project / "my_beside_agent.py").write_text("def play(client, task, seed):\n    return {}\n")
    (project / "tasks.jsonl").write_text('{"prompt": "hi"}\n')
    (project / "run.yaml").write_text(
        "harness: {target: 'my_beside_agent:play'}\ndata: {path: tasks.jsonl}\n"
    )
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(project))])
    monkeypatch.delitem(sys.modules, "my_beside_agent", raising=False)
    config = load_config(project / "run.yaml")

    checked = preflight(config, str(project / "run.yaml"))

    assert checked.harness is not None
    assert checked.harness.__module__ == "my_beside_agent"
    assert sys.path.index(str(elsewhere)) < sys.path.index(str(project))  # the cwd comes first


def test_a_module_nowhere_is_refused_naming_the_configurations_directory_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir(), elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    with pytest.raises(HarnessError) as refused:
        resolve_harness("no_such_agent_module:play", project)
    assert f"or the configuration's directory {project}" in str(refused.value)
