"""Tiny ``grove train`` runs for the configuration tests, and what they leave behind.

``train`` runs ``grove.train.job.run_training`` — the main job's own function — on the embedded
model with a configuration that differs from ``tiny_configuration`` only by the given overrides:
four tasks, one prompt group of two rollouts per step, two steps, a harness from
``tests/unit/config/harnesses.py`` that makes one short call (``engine.default_max_tokens`` 4).
A run takes about a second. The run id is fixed (``keys``), so capture keys are
``keys-s{step}-g{group}-r{rollout}`` and a run samples the same tokens every time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.config import GroveConfig, load_config
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.store import EventStore
from grove.storage import BlobStore, open_blob_store
from grove.train.job import TrainSummary, run_training
from grove.workspace import Workspace

HARNESSES = "tests.unit.config.harnesses"
RUN_ID = "keys"
TASKS = ({"prompt": "red"}, {"prompt": "green"}, {"prompt": "blue"}, {"prompt": "gold"})


def merged(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it, section by section (mappings merge, values
    replace)."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def write_tasks(path: Path, tasks: tuple[dict, ...] = TASKS) -> Path:
    """``tasks`` as a JSONL task file at ``path``."""
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return path


def tiny_configuration(directory: Path, harness: str = "play") -> dict[str, Any]:
    """The configuration every run starts from; its harness logs to ``directory/harness.jsonl``."""
    return {
        "harness": {
            "target": f"{HARNESSES}:{harness}",
            "options": {"log": str(directory / "harness.jsonl")},
        },
        "data": {"path": str(write_tasks(directory / "tasks.jsonl"))},
        "engine": {"default_max_tokens": 4},
        "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": 2, "max_num_steps": 2},
        "policy": {
            "train_global_batch_size": 2,
            "train_micro_batch_size": 2,
            "logprob_micro_batch_size": 2,
        },
    }


@dataclass(frozen=True)
class Run:
    """A finished run: its configuration, workspace, summary and harness log."""

    config: GroveConfig
    workspace: Workspace
    summary: TrainSummary
    directory: Path

    @property
    def run_dir(self) -> Path:
        """``WORKDIR/runs/keys``."""
        return self.workspace.workdir / "runs" / RUN_ID

    def log(self) -> list[dict[str, Any]]:
        """Every record the harness wrote, in order."""
        path = self.directory / "harness.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()]

    def played(self) -> list[dict[str, Any]]:
        """One record per rollout played, in the order the rollouts ended."""
        return [record for record in self.log() if record["event"] == "end"]

    def tasks(self) -> list[str]:
        """The prompt of each rollout played, in order."""
        return [record["task"]["prompt"] for record in self.played()]

    def metrics(self) -> list[dict[str, float]]:
        """Each step's metrics, from ``metrics.jsonl``."""
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line)["metrics"] for line in lines]

    def info(self) -> dict[str, Any]:
        """``run.json``."""
        return dict(json.loads((self.run_dir / "run.json").read_text()))

    @contextmanager
    def ledger(self) -> Iterator[tuple[EventStore, BlobStore]]:
        """The run's ledger and blob store."""
        store = EventStore.open(self.workspace.database_url)
        try:
            yield store, open_blob_store(self.workspace.blob_url)
        finally:
            store.close()

    def attempt(self, capture_key: str) -> AttemptState:
        """One attempt of the run, folded from the ledger."""
        with self.ledger() as (store, _):
            return AttemptLog(store).load(capture_key)


def train(
    directory: Path, *overrides: Mapping[str, Any], harness: str = "play", steps: int | None = None
) -> Run:
    """Run ``grove train`` in ``directory`` on the tiny configuration with ``overrides``."""
    directory.mkdir(parents=True, exist_ok=True)
    data = tiny_configuration(directory, harness)
    for override in overrides:
        data = merged(data, override)
    config = load_config(data)
    workspace = Workspace.resolve(directory / "work")
    summary = run_training(config, workspace, steps=steps, run_id=RUN_ID, console=None)
    return Run(config, workspace, summary, directory)
