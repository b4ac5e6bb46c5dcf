"""The ledger a short real ``grove demo`` leaves, built once per test process, and copies of it.

``demo_ledger`` runs one demo step in this process (8 rollouts of the tool agent through the
in-process gateway, projected and trained) and picks a *showcase* attempt: one with a call the
harness rejected and a context rewrite that started a new root, finalized trainable — the shape
of ``docs/forest.md``'s "Walkthrough: a compaction example". ``copy_ledger`` imports its events into
another database (SQLite or PostgreSQL) with their stream versions and event ids.

PostgreSQL's JSONB cannot hold the NUL character, which the demo's untrained model sometimes
writes and the harness returns in its result (a known ledger limitation, reported): the copy to
PostgreSQL replaces NUL with U+FFFD in those payloads, and the showcase is an attempt without one,
so its stream is copied exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grove.config import load_config
from grove.demo import DEMO_CONFIG
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.events import LedgerPosition
from grove.ledger.store import EventStore, ImportEvent
from grove.train.job import run_training
from grove.workspace import Workspace

from .grove_cli import run_grove

_BUILT: dict[Path, DemoLedger] = {}


@dataclass(frozen=True)
class DemoLedger:
    """A demo workdir: its ledger and blobs, the run id and the showcase attempt."""

    workspace: Workspace
    run_id: str
    showcase_key: str

    @property
    def training_stream(self) -> str:
        """The stream the run published its batches on."""
        return f"training-{self.run_id}"

    def state(self, capture_key: str) -> AttemptState:
        """The attempt's state folded from the demo ledger."""
        store = EventStore.open(self.workspace.database_url, pool=False)
        try:
            return AttemptLog(store).load(capture_key)
        finally:
            store.close()


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, list):
        return [_without_nul(v) for v in value]
    if isinstance(value, dict):
        return {k: _without_nul(v) for k, v in value.items()}
    return value


def _has_nul(store: EventStore, capture_key: str) -> bool:
    return any("\\u0000" in json.dumps(e.payload) for e in store.read_stream(capture_key))


def _is_showcase(state: AttemptState) -> bool:
    rejected = any(
        c.failure is not None and c.failure.reason == "rejected_by_harness"
        for c in state.calls.values()
    )
    rewritten = any(c.intended.root_reason == "history_rewritten" for c in state.calls.values())
    trainable = state.finalized is not None and state.finalized.trainable
    return rejected and rewritten and trainable


def demo_ledger(workdir: Path) -> DemoLedger:
    """The ledger of ``grove demo --steps 1`` in ``workdir`` (run once per process)."""
    if workdir not in _BUILT:
        workspace = Workspace.resolve(workdir)
        summary = run_training(load_config(DEMO_CONFIG), workspace, steps=1)
        store = EventStore.open(workspace.database_url, pool=False)
        try:
            log = AttemptLog(store)
            keys = [f"{summary.run_id}-s0-g{g}-r{r}" for g in range(2) for r in range(4)]
            showcase = next(
                (k for k in keys if _is_showcase(log.load(k)) and not _has_nul(store, k)), None
            )
        finally:
            store.close()
        assert showcase is not None, (
            f"no demo attempt of {keys} has a rejected call, a rewrite and trainable rows; "
            "the demo agent changed: pick another showcase"
        )
        _BUILT[workdir] = DemoLedger(workspace, summary.run_id, showcase)
    return _BUILT[workdir]


def copy_ledger(demo: DemoLedger, database_url: str) -> None:
    """Migrate ``database_url`` and import every event of the demo ledger, in position order."""
    migrate.upgrade(database_url)
    source = EventStore.open(demo.workspace.database_url, pool=False)
    target = EventStore.open(database_url, pool=False)
    try:
        events = source.read_after(LedgerPosition(position=0), limit=1_000_000).events
        postgres = database_url.startswith("postgresql")
        target.import_events(
            ImportEvent(
                e.stream_id,
                e.stream_version,
                e.event_type,
                e.schema_version,
                _without_nul(e.payload) if postgres else e.payload,
                e.event_id,
            )
            for e in events
        )
    finally:
        source.close()
        target.close()


def written_page(demo: DemoLedger, path: Path) -> Path:
    """``path``, written by ``grove show`` for the showcase attempt."""
    outcome = run_grove(
        "show", demo.showcase_key, "--html", str(path), "--workdir", str(demo.workspace.workdir)
    )
    assert outcome.code == 0, outcome.stderr
    return path


def run_json(text: str) -> dict:
    """The one JSON object a ``--json`` command printed."""
    lines = text.strip().splitlines()
    assert len(lines) == 1, text[-2000:]
    return json.loads(lines[0])
