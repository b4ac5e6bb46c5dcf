"""The intent's durable commit overlaps generation (docs/gateway.md, "Ordering: intent and
generation"): the engine starts while the intent's append is still waiting on PostgreSQL, the
answer waits for the intent, an intent that fails discards the generation and writes nothing
else, and an engine failure is recorded once the intent has landed.

The intent's append is held or refused inside PostgreSQL itself: a test connection holds an
``EXCLUSIVE`` lock on the events table (reads go on; every insert waits), or a trigger refuses
``call.intended`` rows.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import EngineError
from grove.capture.headers import CAPTURE_KEY_HEADER
from grove.ledger.store import EventStore

from .conftest import MODEL, Gateway, engine, serve

KEY = "att-1"
WAIT_S = 30.0


class WatchedEngine:
    """The embedded engine, noting at each generation which events of ``KEY`` the ledger
    held (read through a connection of its own) and then raising ``fail`` if one is set."""

    def __init__(self, ledger: EventStore, database_url: str) -> None:
        self.ledger = ledger
        self.database_url = database_url
        self.started = threading.Event()
        self.seen: list[list[str]] = []
        self.fail: Exception | None = None

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        engine().check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        self.seen.append([event.event_type for event in self.ledger.read_stream(KEY)])
        self.started.set()
        if self.fail is not None:
            raise self.fail
        return engine().generate(prompt_token_ids, sampling)


def _dsn(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(False)


@pytest.fixture
def watched(postgres_url: str, tmp_path: Path) -> Iterator[tuple[Gateway, WatchedEngine]]:
    """A gateway on PostgreSQL and local blobs whose engine is watched, attempt ``KEY`` open."""
    ledger = EventStore.open(postgres_url)
    watching = WatchedEngine(ledger, postgres_url)
    try:
        with serve(postgres_url, str(tmp_path / "blobs"), watching) as gateway:
            gateway.open(KEY)
            yield gateway, watching
    finally:
        ledger.close()


def _call(gateway: Gateway) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
    headers = {CAPTURE_KEY_HEADER: KEY}
    return gateway.http.post("/v1/chat/completions", json=body, headers=headers, timeout=WAIT_S)


def _events(gateway: Gateway) -> list[str]:
    return [event.event_type for event in gateway.service.log.store.read_stream(KEY)]


class HeldInserts:
    """A transaction holding ``EXCLUSIVE`` on the events table until ``release``: readers go
    on, every append waits (``waiting`` tells how many do)."""

    def __init__(self, database_url: str) -> None:
        self.holder = psycopg.connect(_dsn(database_url))
        self.holder.execute("LOCK TABLE grove_events IN EXCLUSIVE MODE")
        self.watcher = psycopg.connect(_dsn(database_url), autocommit=True)

    def waiting(self) -> int:
        row = self.watcher.execute(
            "SELECT count(*) FROM pg_locks WHERE NOT granted "
            "AND relation = 'grove_events'::regclass"
        ).fetchone()
        assert row is not None
        return int(row[0])

    def wait_for_append(self) -> None:
        """Return once an append waits on the lock (fail after ``WAIT_S``)."""
        deadline = time.monotonic() + WAIT_S
        while self.waiting() == 0:
            assert time.monotonic() < deadline, "no append came to wait on the lock"
            time.sleep(0.01)

    def release(self) -> None:
        self.holder.commit()
        self.holder.close()
        self.watcher.close()


def _held_call(gateway: Gateway, watching: WatchedEngine) -> tuple[Future[Any], HeldInserts]:
    """Start a call while appends are held; returns once it generated and its intent waits."""
    held = HeldInserts(watching.database_url)
    pool = ThreadPoolExecutor(1)
    answer = pool.submit(_call, gateway)
    pool.shutdown(wait=False)
    assert watching.started.wait(WAIT_S)
    held.wait_for_append()
    return answer, held


@pytest.mark.postgres
def test_the_engine_generates_while_the_intent_append_is_still_waiting(
    watched: tuple[Gateway, WatchedEngine],
):
    gateway, watching = watched
    answer, held = _held_call(gateway, watching)
    assert not answer.done()  # the intent cannot be durable while the lock is held
    held.release()

    assert answer.result(WAIT_S).status_code == 200
    assert watching.seen == [["attempt.opened"]]  # generation began before the intent landed
    assert _events(gateway) == ["attempt.opened", "call.intended", "call.committed"]


@pytest.mark.postgres
def test_an_engine_failure_during_a_held_intent_is_recorded_after_the_intent_lands(
    watched: tuple[Gateway, WatchedEngine],
):
    gateway, watching = watched
    watching.fail = EngineError("the inference server went away")
    answer, held = _held_call(gateway, watching)
    held.release()

    status_code = answer.result(WAIT_S).status_code
    (call,) = gateway.status(KEY)["calls"]
    assert (status_code, call["status"], call["failure_reason"]) == (
        502,
        "failed",
        "engine_error",
    )
    assert _events(gateway) == ["attempt.opened", "call.intended", "call.failed"]


@pytest.fixture
def refusing(watched: tuple[Gateway, WatchedEngine]) -> tuple[Gateway, WatchedEngine]:
    """The watched gateway, its database refusing every ``call.intended`` row from now on."""
    with psycopg.connect(_dsn(watched[1].database_url), autocommit=True) as owner:
        owner.execute(
            "CREATE FUNCTION refuse_intents() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'intents refused by the test'; END $$"
        )
        owner.execute(
            "CREATE TRIGGER refuse_intents BEFORE INSERT ON grove_events FOR EACH ROW "
            "WHEN (NEW.event_type = 'call.intended') EXECUTE FUNCTION refuse_intents()"
        )
    return watched


@pytest.mark.postgres
def test_a_failed_intent_discards_its_generation_and_answers_an_error(
    refusing: tuple[Gateway, WatchedEngine],
):
    gateway, watching = refusing
    answer = _call(gateway)

    assert (answer.status_code, answer.json()["error"]["code"]) == (500, "ledger_error")
    assert len(watching.seen) == 1  # the engine generated, overlapping the intent
    assert _events(gateway) == ["attempt.opened"]
    assert gateway.service.blobs.list_keys() == []


@pytest.mark.postgres
def test_after_a_failed_intent_the_attempt_has_no_pending_call_and_settles_at_once(
    refusing: tuple[Gateway, WatchedEngine],
):
    gateway, _ = refusing
    _call(gateway)

    status = gateway.http.post(f"/v1/attempts/{KEY}/result", json={"reward": 0.0}).json()
    assert (status["calls"], status["pending"], status["timed_out"]) == ([], [], False)


@pytest.mark.postgres
def test_without_the_overlap_the_intent_is_durable_before_generation_starts(
    watched: tuple[Gateway, WatchedEngine],
):
    gateway, watching = watched
    gateway.service.overlap_intents = False  # the baseline bench/gateway.py measures

    assert _call(gateway).status_code == 200
    assert watching.seen == [["attempt.opened", "call.intended"]]
