"""Rollouts captured with the embedded engine, selected, and projected, on both databases."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest

from capture.embedded import EmbeddedEngine, build_tokenizer
from capture.engine import SamplingParams
from capture.lifecycle import CaptureService, ModelCall
from capture.render import Renderer, RenderOptions
from ledger import migrate
from ledger.attempt import AttemptLog
from ledger.events import RolloutSelected
from ledger.store import EventStore
from storage import open_blob_store
from training.projector import Projector, ProjectorSettings, captured_calls
from training.selection import select_rollout

OPTIONS = RenderOptions(model="grove-tiny")
SAMPLING = SamplingParams(max_tokens=5)


@cache
def tokenizer():
    return build_tokenizer()


@dataclass
class Lab:
    """A capture service and the ledger and blobs it writes, to play rollouts against."""

    store: EventStore
    capture: CaptureService
    blob_url: str

    def projector(
        self, *, groups_per_step: int = 1, rollouts_per_group: int = 2, **settings: Any
    ) -> Projector:
        """A projector on this ledger; ``settings`` are further ``ProjectorSettings`` fields."""
        return Projector(
            self.store,
            open_blob_store(self.blob_url),
            ProjectorSettings(
                rollouts_per_group=rollouts_per_group, groups_per_step=groups_per_step, **settings
            ),
        )

    def project(self, projector: Projector | None = None, timeout_s: float = 30.0) -> Projector:
        """Poll until the projector has read the whole ledger (on PostgreSQL a transaction
        anywhere on the server, e.g. another test's, can hold the reader back for a moment)."""
        projector = projector or self.projector()
        deadline = time.monotonic() + timeout_s
        while True:
            projector.poll()
            if projector.events_read == self.store.count() or time.monotonic() > deadline:
                return projector
            time.sleep(0.05)

    def play(
        self,
        capture_key: str,
        *,
        group: str,
        index: int,
        reward: float,
        compact_after: int | None = 1,
        turns: int = 3,
        settle: bool = True,
    ) -> list[str]:
        """One rollout: ``turns`` calls; the context is rewritten after ``compact_after`` calls."""
        capture = self.capture
        capture.open_attempt(
            capture_key, rollout_id=f"{group}/r{index}", prompt_group=group, rollout_index=index
        )
        messages = [{"role": "user", "content": f"Task {group}."}]
        returned = list(messages)
        call_ids = []
        for turn in range(turns):
            if compact_after is not None and turn == compact_after:
                messages = [{"role": "user", "content": f"Summary of task {group} so far."}]
            outcome = capture.generate(
                capture_key, ModelCall(messages, OPTIONS, SAMPLING, f"c{turn}")
            )
            call_ids.append(outcome.call_id)
            observation = {"role": "tool", "content": f"obs {turn}"}
            messages = [*messages, outcome.message, observation]
            returned += [{**outcome.message, "response_id": outcome.response_id}, observation]
        if settle:
            self.finish(capture_key, {"output": returned, "reward": reward})
        return call_ids

    def finish(self, capture_key: str, result: dict) -> None:
        """Settle the attempt and record its returned-history selection."""
        state = self.capture.settle(capture_key, timeout_s=0.2)
        chosen = select_rollout("returned_history", captured_calls(state), result)
        self.capture.select(
            capture_key,
            RolloutSelected(
                policy=chosen.policy,
                call_ids=chosen.call_ids,
                terminal_response_id=chosen.terminal_response_id,
                reward=chosen.reward,
            ),
        )


@pytest.fixture
def lab(database_url: str, tmp_path) -> Iterator[Lab]:
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    blob_url = str(tmp_path / "blobs")
    capture = CaptureService(
        AttemptLog(store),
        open_blob_store(blob_url),
        Renderer(tokenizer()),
        EmbeddedEngine.build(tokenizer(), seed=3),
        model_fingerprint="grove-tiny",
    )
    try:
        yield Lab(store, capture, blob_url)
    finally:
        store.close()
