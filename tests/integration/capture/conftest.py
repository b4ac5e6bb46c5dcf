"""A capture service on every ledger database and blob backend, with the embedded engine."""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache

import pytest

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.lifecycle import CaptureService
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store

OPTIONS = RenderOptions(model="grove-tiny")


@cache
def tokenizer():
    return build_tokenizer()


class RecordingEngine:
    """The embedded engine, remembering the exact prompt of each call it served."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine = engine
        self.prompts: list[list[int]] = []

    def check(self, prompt_token_ids, sampling):  # the Engine protocol
        self.engine.check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids, sampling):
        self.prompts.append(list(prompt_token_ids))
        return self.engine.generate(prompt_token_ids, sampling)


@pytest.fixture
def service(database_url: str, blob_url: str) -> Iterator[CaptureService]:
    """A capture service with attempt ``att-1`` opened."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    engine = RecordingEngine(EmbeddedEngine.build(tokenizer(), seed=7))
    capture = CaptureService(
        AttemptLog(store),
        open_blob_store(blob_url),
        Renderer(tokenizer()),
        engine,
        model_fingerprint="grove-tiny",
    )
    capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
    try:
        yield capture
    finally:
        store.close()
