"""The capture lifecycle records the policy version the engine served at admission on the intent,
and the generation's on the commit (SQLite and PostgreSQL ledgers, local blobs)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import Generation, SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store

from .conftest import OPTIONS, RecordingEngine, tokenizer

ASK = ModelCall(
    [{"role": "user", "content": "Count the apples."}], OPTIONS, SamplingParams(max_tokens=4)
)


class UpdatedBeforeGenerating(RecordingEngine):
    """An embedded engine whose weights move to the next version after admission, just before
    it generates (as if an optimizer step landed between the two)."""

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def generate(self, prompt_token_ids, sampling) -> Generation:
        with self.engine.updating():
            self.engine.policy_version += 1
        return super().generate(prompt_token_ids, sampling)


def service_on(
    database_url: str, tmp_path: Path, engine: RecordingEngine
) -> Iterator[CaptureService]:
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    capture = CaptureService(
        AttemptLog(store),
        open_blob_store(str(tmp_path / "blobs")),
        Renderer(tokenizer()),
        engine,
        model_fingerprint="grove-tiny",
    )
    capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
    try:
        yield capture
    finally:
        store.close()


@pytest.fixture
def updated(database_url: str, tmp_path: Path) -> Iterator[CaptureService]:
    engine = EmbeddedEngine.build(tokenizer(), seed=7)
    engine.policy_version = 2
    yield from service_on(database_url, tmp_path, UpdatedBeforeGenerating(engine))


@pytest.fixture
def unversioned(database_url: str, tmp_path: Path) -> Iterator[CaptureService]:
    # RecordingEngine has no policy_version attribute, and its generations come from the
    # embedded engine, which always reports one.
    yield from service_on(
        database_url, tmp_path, RecordingEngine(EmbeddedEngine.build(tokenizer()))
    )


def test_intent_records_the_served_version_and_commit_the_generations(updated: CaptureService):
    outcome = updated.generate("att-1", ASK)
    call = updated.log.load("att-1").calls[outcome.call_id]
    assert call.intended.policy_version == 2
    assert call.committed is not None and call.committed.policy_version == 3
    assert outcome.generation.policy_version == 3


def test_an_engine_without_a_version_intends_with_none(unversioned: CaptureService):
    outcome = unversioned.generate("att-1", ASK)
    call = unversioned.log.load("att-1").calls[outcome.call_id]
    assert call.intended.policy_version is None
    assert call.committed is not None and call.committed.policy_version == 0
