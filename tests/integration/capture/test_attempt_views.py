"""Calls of different attempts never wait for each other's ledger reads (on both databases)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import open_blob_store

from .conftest import OPTIONS, tokenizer

CALL = ModelCall([{"role": "user", "content": "Count the apples."}], OPTIONS, SamplingParams(4))


class HeldStore(EventStore):
    """The real store, except that reading stream ``held`` waits until ``release`` is set (a
    database that is slow to answer for one attempt)."""

    def __init__(self, store: EventStore, held: str) -> None:
        super().__init__(store.engine)
        self.held = held
        self.reading = threading.Event()
        self.release = threading.Event()

    def read_stream(self, stream_id: str, after_version: int = 0) -> list[StoredEvent]:
        if stream_id == self.held:
            self.reading.set()
            self.release.wait()
        return super().read_stream(stream_id, after_version)


@pytest.fixture
def held(database_url: str, tmp_path: Path) -> Iterator[tuple[CaptureService, HeldStore]]:
    """A capture service whose reads of attempt ``att-slow`` wait, with ``att-1`` opened."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    slow = HeldStore(store, "att-slow")
    service = CaptureService(
        AttemptLog(slow),
        open_blob_store(str(tmp_path / "blobs")),
        Renderer(tokenizer()),
        EmbeddedEngine.build(tokenizer(), seed=7),
        model_fingerprint="grove-tiny",
    )
    service.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
    try:
        yield service, slow
    finally:
        slow.release.set()
        store.close()


def test_a_call_is_recorded_while_another_attempts_ledger_read_is_still_in_flight(
    held: tuple[CaptureService, HeldStore],
):
    service, store = held
    reader = threading.Thread(target=service.state, args=("att-slow",), daemon=True)
    reader.start()
    assert store.reading.wait(60)
    outcomes = []
    caller = threading.Thread(
        target=lambda: outcomes.append(service.generate("att-1", CALL)), daemon=True
    )
    caller.start()
    caller.join(120)  # a deadlock guard, not a timing: the call never waits for the held read
    finished = not caller.is_alive()
    store.release.set()
    reader.join(60)
    assert finished, "the call waited for another attempt's ledger read"
    assert service.log.load("att-1").calls[outcomes[0].call_id].committed is not None
