"""Rollouts captured with the embedded engine, selected, and projected, on both databases."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
import torch

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import CallCommitted, CallIntended, ReplaySummary, RolloutSelected
from grove.ledger.store import EventStore
from grove.storage import CallDelta, chain_digest, open_blob_store, staging_key
from grove.training.projector import Projector, ProjectorSettings, captured_calls
from grove.training.selection import select_rollout

OPTIONS = RenderOptions(model="grove-tiny")
SAMPLING = SamplingParams(max_tokens=5)
HAND_SUMMARY = ReplaySummary(
    normalization_version=1,
    item_count=1,
    source_digest="0" * 64,
    canonical_source_digest="0" * 64,
    render_options_digest="1" * 64,
)


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

    def hand_call(
        self,
        capture_key: str,
        call_id: str,
        parent: str | None,
        prompt: list[int],
        generated: list[int],
        *,
        routes: torch.Tensor | None = None,
    ) -> None:
        """Intend and commit one call whose delta blob is written here rather than by the engine,
        for what the engine never writes: routed experts, or a generation with no token."""
        log = self.capture.log
        state = log.load(capture_key)
        above = state.calls[parent].committed if parent is not None else None
        log.intend(
            capture_key,
            CallIntended(
                call_id=call_id,
                decision="continuation" if parent else "root",
                parent_call_id=parent,
                root_reason=None if parent else "initial",
                replay_summary=HAND_SUMMARY,
                prompt_tokens=len(prompt) + (above.cum_len if above else 0),
            ),
        )
        delta = CallDelta.from_lists(prompt, generated, [-0.5] * len(generated), routes=routes)
        blob = self.capture.blobs.put_delta(staging_key(capture_key, call_id), delta)
        prev = above.cum_len if above else 0
        log.commit(
            capture_key,
            CallCommitted(
                call_id=call_id,
                parent_call_id=parent,
                prev_len=prev,
                delta_len=delta.delta_len,
                cum_len=prev + delta.delta_len,
                prompt_delta_len=len(prompt),
                generated_len=len(generated),
                blob_key=blob.key,
                blob_sha256=blob.sha256,
                blob_bytes=blob.size,
                chain_digest=chain_digest(
                    above.chain_digest if above else None, delta.prompt_delta, delta.generated
                ),
                finish_reason="stop",
                response_id=f"resp-{capture_key}-{call_id}",
                output_fingerprint=hashlib.sha256(f"{capture_key}/{call_id}".encode()).hexdigest(),
                replay_summary=HAND_SUMMARY,
            ),
        )

    def finish(self, capture_key: str, result: dict, policy: str = "returned_history") -> None:
        """Settle the attempt and record the selection ``policy`` makes of ``result``."""
        state = self.capture.settle(capture_key, timeout_s=0.2)
        chosen = select_rollout(policy, captured_calls(state), result)
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
