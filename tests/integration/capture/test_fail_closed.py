"""A call that fails after its intent is recorded failed at once, whatever stage failed.

A real capture service on a SQLite ledger and a local blob directory, with one component that
raises at one stage: the engine (inference, and a generation that cannot be made a delta), the
blob store (the delta blob), the output parse and fingerprint (building the commit), the log
(appending the commit). Each time the original error surfaces, ``call.failed`` holds the stage's
reason and the error's text, nothing is left pending, and settling the attempt returns at once
instead of waiting out its timeout. When the failure cannot be recorded either, the original
error still surfaces and the call stays pending until the settle timeout.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import grove.capture.call_events
from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import EngineError
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog, AttemptState, CallStatus
from grove.ledger.errors import DatabaseUnavailable
from grove.ledger.events import CallCommitted, CallFailed
from grove.ledger.store import EventStore
from grove.storage import StorageUnavailableError, open_blob_store

from .conftest import OPTIONS, tokenizer

SETTLE_TIMEOUT_S = 300.0  # the default: a call left pending would hold settle this long
AT_ONCE_S = 5.0  # far below it: settling found nothing to wait for
USER = [{"role": "user", "content": "Count the apples."}]


class FailingEngine:
    """The embedded engine, raising ``EngineError`` on every generation."""

    def __init__(self, engine: EmbeddedEngine) -> None:
        self.engine = engine

    def check(self, prompt_token_ids, sampling) -> None:  # the Engine protocol
        self.engine.check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids, sampling) -> Generation:
        raise EngineError("the inference server went away")


class ShortRoutesEngine(FailingEngine):
    """The embedded engine, reporting routes for the generated tokens only: too few for the
    call's delta (its new prompt tokens too), so the generation cannot be made a delta."""

    def generate(self, prompt_token_ids, sampling) -> Generation:
        generation = self.engine.generate(prompt_token_ids, sampling)
        routes = torch.zeros((len(generation.token_ids), 1, 2), dtype=torch.int64)
        return dataclasses.replace(generation, routes=routes)


class CommitRefusingLog(AttemptLog):
    """An attempt log whose commits fail as an unreachable database's do; ``fail_too`` makes
    its failure records fail the same way."""

    fail_too = False

    def commit(self, capture_key: str, committed: CallCommitted) -> int | None:
        raise DatabaseUnavailable("sqlite:///ledger.db", "disk I/O error on commit")

    def fail(self, capture_key: str, failed: CallFailed) -> None:
        if self.fail_too:
            raise DatabaseUnavailable("sqlite:///ledger.db", "disk I/O error on failure")
        super().fail(capture_key, failed)


@pytest.fixture
def build(tmp_path: Path) -> Iterator:
    """``build(engine=..., log=...)``: a capture service on a SQLite ledger and a local blob
    directory (``tmp_path / "blobs"``), its parts replaced by the classes given, attempt
    ``att-1`` opened."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    stores: list[EventStore] = []

    def start(engine=None, log=AttemptLog) -> CaptureService:
        store = EventStore.open(url)
        stores.append(store)
        embedded = EmbeddedEngine.build(tokenizer(), seed=7)
        service = CaptureService(
            log(store),
            open_blob_store(str(tmp_path / "blobs")),
            Renderer(tokenizer()),
            embedded if engine is None else engine(embedded),
            model_fingerprint="grove-tiny",
        )
        service.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
        return service

    yield start
    for store in stores:
        store.close()


def call(service: CaptureService, call_id: str = "c1"):
    return service.generate("att-1", ModelCall(USER, OPTIONS, SamplingParams(4), call_id=call_id))


def recorded(service: CaptureService) -> AttemptState:
    """The attempt folded straight from the ledger (a fresh log, nothing cached)."""
    return AttemptLog(service.log.store).load("att-1")


def settle_timed(service: CaptureService) -> tuple[AttemptState, float]:
    """The service's settle under the default timeout, and how long it took."""
    started = time.monotonic()
    state = service.settle("att-1", SETTLE_TIMEOUT_S)
    return state, time.monotonic() - started


def assert_failed_and_settles_at_once(service: CaptureService, reason: str, text: str) -> None:
    failure = recorded(service).calls["c1"].failure
    assert (recorded(service).calls["c1"].status, failure.reason) == (CallStatus.FAILED, reason)
    assert text in failure.detail
    state, waited = settle_timed(service)
    assert (state.pending_call_ids, state.settled.timed_out) == ((), False)
    assert waited < AT_ONCE_S


def test_an_engine_failure_is_recorded_as_engine_error(build):
    service = build(engine=FailingEngine)

    with pytest.raises(EngineError, match="went away"):
        call(service)

    assert_failed_and_settles_at_once(service, "engine_error", "EngineError: the inference server")


def test_a_generation_that_cannot_be_made_a_delta_is_recorded_as_engine_error(build):
    service = build(engine=ShortRoutesEngine)

    with pytest.raises(Exception, match="rows"):
        call(service)

    assert_failed_and_settles_at_once(service, "engine_error", "InvalidGenerationError")


def test_a_blob_store_failure_is_recorded_as_storage_error(build, tmp_path: Path):
    service = build()
    # A file where the attempt's staging directory goes: the delta cannot be written.
    (tmp_path / "blobs" / "staging").mkdir(parents=True, exist_ok=True)
    (tmp_path / "blobs" / "staging" / "att-1").write_bytes(b"in the way")

    with pytest.raises(StorageUnavailableError, match="staging/att-1/c1"):
        call(service)

    assert_failed_and_settles_at_once(service, "storage_error", "StorageUnavailableError")


def test_a_failure_parsing_the_output_is_recorded_as_internal_error(build, monkeypatch):
    service = build()

    def unparsable(text: str, *, tools: bool = False) -> dict:
        raise ValueError("the output parser broke")

    monkeypatch.setattr(grove.capture.call_events, "output_message", unparsable)
    with pytest.raises(ValueError, match="parser broke"):
        call(service)

    assert_failed_and_settles_at_once(service, "internal_error", "ValueError: the output parser")


def test_a_failure_building_the_commit_event_is_recorded_as_internal_error(build, monkeypatch):
    service = build()

    def broken(messages) -> str:
        raise RuntimeError("fingerprinting failed")

    monkeypatch.setattr(grove.capture.call_events, "fingerprint_output", broken)
    with pytest.raises(RuntimeError, match="fingerprinting failed"):
        call(service)

    assert_failed_and_settles_at_once(service, "internal_error", "fingerprinting failed")
    assert len(service.blobs.list_keys()) == 1  # the blob stands until the attempt's teardown


def test_a_refused_commit_append_is_recorded_as_internal_error(build):
    service = build(log=CommitRefusingLog)

    with pytest.raises(DatabaseUnavailable, match="on commit"):
        call(service)

    assert_failed_and_settles_at_once(service, "internal_error", "DatabaseUnavailable")


def test_when_the_failure_cannot_be_recorded_the_original_error_surfaces_and_the_call_stays_pending(
    build,
):
    service = build(log=CommitRefusingLog)
    service.log.fail_too = True

    with pytest.raises(DatabaseUnavailable, match="on commit") as raised:
        call(service)

    (note,) = raised.value.__notes__
    assert "could not record call.failed (internal_error) for call 'c1'" in note
    assert "disk I/O error on failure" in note
    assert recorded(service).pending_call_ids == ("c1",)
    state = service.settle("att-1", timeout_s=0.2)
    assert (state.settled.pending_call_ids, state.settled.timed_out) == (("c1",), True)


def test_a_failure_after_the_commit_records_nothing(build, monkeypatch):
    service = build()

    def broken(*args, **kwargs) -> None:
        raise RuntimeError("the view cache broke")

    monkeypatch.setattr(service.views, "remember", broken)
    with pytest.raises(RuntimeError, match="view cache broke"):
        call(service)

    committed = recorded(service).calls["c1"]
    assert (committed.status, committed.failure) == (CallStatus.COMMITTED, None)


def test_the_next_call_after_a_recorded_failure_commits(build, monkeypatch):
    service = build()

    def broken(messages) -> str:
        raise RuntimeError("fingerprinting failed once")

    monkeypatch.setattr(grove.capture.call_events, "fingerprint_output", broken)
    with pytest.raises(RuntimeError, match="failed once"):
        call(service, "c1")
    monkeypatch.undo()

    outcome = call(service, "c2")

    calls = recorded(service).calls
    assert (calls["c1"].status, calls["c2"].status) == (CallStatus.FAILED, CallStatus.COMMITTED)
    assert outcome.decision.parent_call_id is None  # a failed call is never a parent
