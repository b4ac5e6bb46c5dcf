"""Where a training run keeps its files: ``WORKDIR/runs/RUN/`` and its checkpoint directory.

A run directory holds ``run.json`` (run id, configuration source, the gateway's URL once
serving), ``config.json`` (the whole resolved configuration), ``metrics.jsonl``,
``tensorboard/`` (``grove/train/run_log.py``) and ``attempt.secret`` (owner-only: the secret the
attempt tokens of the run's in-process rollouts derive from, so a resumed run can still open
forks of the attempts it played before, ``grove/train/harness.py``). ``WORKDIR/runs/latest``
names the newest run, which ``grove train --resume`` continues unless told another. The run's
checkpoints live under ``checkpointing.checkpoint_dir/RUN`` (relative to the workdir unless
absolute), with a copy of ``config.json`` beside them so ``grove export`` can rebuild the model
from a checkpoint alone.
"""

from __future__ import annotations

import json
import os
import secrets
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.config import GroveConfig
from grove.errors import JobError
from grove.workspace import Workspace

__all__ = [
    "CONFIG_FILE",
    "LATEST",
    "RUNS_DIR",
    "RunDirectory",
    "RunExists",
    "RunNotFound",
    "find_run",
    "new_run",
    "run_path",
]

CONFIG_FILE = "config.json"
RUN_FILE = "run.json"
SECRET_FILE = "attempt.secret"
RUNS_DIR = "runs"
LATEST = "latest"


class RunNotFound(JobError, LookupError):
    """No such run in the workdir; the message lists the runs that exist."""


class RunExists(JobError, FileExistsError):
    """A new run was named like a run the workdir already holds."""


@dataclass(frozen=True)
class RunDirectory:
    """One run's id and directories."""

    run_id: str
    path: Path
    checkpoints: Path

    def info(self) -> dict[str, Any]:
        """The contents of ``run.json``."""
        return dict(json.loads((self.path / RUN_FILE).read_text()))

    def attempt_secret(self) -> str:
        """The run's attempt secret (``attempt.secret``), made on first use."""
        path = self.path / SECRET_FILE
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            pass
        secret = secrets.token_urlsafe(32)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(secret + "\n")
        return secret

    def record(self, **values: Any) -> None:
        """Add ``values`` to ``run.json`` (written whole through a temporary file)."""
        _write_json(self.path / RUN_FILE, {**self.info(), **values})


def _write_json(path: Path, value: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(value, indent=2, sort_keys=True) + "\n")
    os.replace(temporary, path)


def _checkpoints(workspace: Workspace, config: GroveConfig, run_id: str) -> Path:
    root = Path(config.checkpointing.checkpoint_dir).expanduser()
    return (root if root.is_absolute() else workspace.workdir / root) / run_id


def new_run(
    workspace: Workspace, config: GroveConfig, source: str, run_id: str | None = None
) -> RunDirectory:
    """Create the directories of a new run (``run_id`` or a fresh one) and make it the latest."""
    run_id = run_id or f"run{time.strftime('%Y%m%d')}{uuid.uuid4().hex[:6]}"
    runs = workspace.workdir / RUNS_DIR
    path = runs / run_id
    if path.exists():
        raise RunExists(
            f"run {run_id!r} already exists in {runs}: resume it with --resume, or pick another "
            "--run name"
        )
    path.mkdir(parents=True)
    run = RunDirectory(run_id, path, _checkpoints(workspace, config, run_id))
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    resolved = config.model_dump(mode="json")
    _write_json(path / CONFIG_FILE, resolved)
    _write_json(run.checkpoints / CONFIG_FILE, resolved)
    _write_json(path / RUN_FILE, {"run_id": run_id, "config_source": source})
    (runs / LATEST).write_text(run_id + "\n")
    return run


def run_path(workdir: Path, run_id: str | None = None) -> Path:
    """``WORKDIR/runs/RUN`` of ``run_id`` (None or ``latest``: the newest run); ``RunNotFound``
    lists the runs there are."""
    runs = workdir / RUNS_DIR
    if run_id is None or run_id == LATEST:
        latest = runs / LATEST
        if not latest.is_file():
            raise RunNotFound(f"there are no runs in {runs} yet (each `grove train` writes one)")
        run_id = latest.read_text().strip()
    path = runs / run_id
    if not (path / RUN_FILE).is_file():
        existing = sorted(p.parent.name for p in runs.glob(f"*/{RUN_FILE}"))
        raise RunNotFound(
            f"no run {run_id!r} in {runs}; runs there: {', '.join(existing) or 'none'}"
        )
    return path


def find_run(workspace: Workspace, config: GroveConfig, run_id: str | None = None) -> RunDirectory:
    """The run ``run_id`` of the workdir (default: the latest one), to resume."""
    path = run_path(workspace.workdir, run_id)
    return RunDirectory(path.name, path, _checkpoints(workspace, config, path.name))
