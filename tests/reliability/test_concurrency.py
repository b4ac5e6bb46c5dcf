"""Concurrency: each call id is intended and inferred once, however requests race.

The deterministic specification runs in this process (a second request for the same call arrives
while the first is in inference); the load test runs 8 client processes against one ``grove serve``
on PostgreSQL and S3 (``test_concurrent_clients_lose_nothing``).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import pytest

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptError
from grove.ledger.store import EventStore
from grove.storage import BlobRef, open_blob_store
from grove.workspace import Workspace
from tests.fixtures.s3 import S3Server

from .clients import RACE_ATTEMPT, RACED_CALL, SHARED_ATTEMPT, SHARED_TOKENS, run_client
from .conftest import MODEL
from .figures import FiguresFile
from .harness import Ack
from .invariants import LedgerView, lost_acknowledgements, repeated_intents, version_gaps
from .processes import Launcher, fork_server, s3_environment

CLIENTS = 8
SHARED_CALLS = 3  # each client's calls in the one attempt every client writes to
ROLLOUTS = 4  # each client's own rollouts (three calls each, some resampled)
USER = {"role": "user", "content": "Describe the weather in plain words."}
CALL = ModelCall([USER], RenderOptions(model=MODEL), SamplingParams(max_tokens=4), "c0")


class RacingEngine:
    """An engine whose first inference first lets ``race`` run: a second request for the same
    call arriving while the first one is being inferred. What ``race`` raised is kept."""

    def __init__(self, inner: Engine, race: Callable[[], object]) -> None:
        self.inner = inner
        self._race: Callable[[], object] | None = race
        self.raised: BaseException | None = None

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.inner.check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        race, self._race = self._race, None
        if race is not None:
            try:
                race()
            except BaseException as error:
                self.raised = error
        return self.inner.generate(prompt_token_ids, sampling)


def test_a_racing_request_for_an_intended_call_is_refused_before_inference(
    capture: CaptureService,
):
    capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
    racing = RacingEngine(capture.engine, lambda: capture.generate("att-1", CALL))
    capture.engine = racing
    outcome = capture.generate("att-1", CALL)
    assert isinstance(racing.raised, AttemptError)
    with pytest.raises(AttemptError, match="already intended by another request"):
        raise racing.raised
    events = [
        (e.event_type, e.payload.get("call_id")) for e in capture.log.store.read_stream("att-1")
    ]
    assert events == [
        ("attempt.opened", None),
        ("call.intended", "c0"),
        ("call.committed", "c0"),
    ]
    assert capture.blobs.list_keys() == [outcome.blob.key]


@pytest.mark.postgres
@pytest.mark.s3
def test_eight_concurrent_clients_lose_nothing_and_intend_each_call_once(
    tmp_path: Path, postgres_url: str, s3_server: S3Server, figures: FiguresFile
):
    started = time.monotonic()
    env = s3_environment(s3_server)
    workspace = Workspace.resolve(tmp_path / "work", postgres_url, s3_server.fresh_url())
    migrate.upgrade(postgres_url)  # as the owner: grove serve never changes a schema
    launcher = Launcher(tmp_path, env)
    gateway = launcher.exec_grove_serve(workspace)  # the grove executable, as an operator runs it
    try:
        assert gateway.base_url is not None
        for key in (RACE_ATTEMPT, SHARED_ATTEMPT):
            opened = httpx.post(
                f"{gateway.base_url}/v1/attempts",
                json={
                    "capture_key": key,
                    "rollout_id": key,
                    "prompt_group": key,
                    "rollout_index": 0,
                },
                headers={ATTEMPT_TOKEN_HEADER: SHARED_TOKENS[key]},
            )
            assert opened.status_code == 200, opened.text
        barrier = fork_server().Barrier(CLIENTS)
        outputs = [tmp_path / f"client-{n}.json" for n in range(CLIENTS)]
        clients = [
            fork_server().Process(
                target=run_client,
                args=(gateway.base_url, n, SHARED_CALLS, ROLLOUTS, barrier, str(outputs[n])),
            )
            for n in range(CLIENTS)
        ]
        for client in clients:
            client.start()
        for client in clients:
            client.join(300)
            assert client.exitcode == 0
    finally:
        gateway.stop()
    records = [json.loads(path.read_text()) for path in outputs]
    acks = [Ack(**ack) for record in records for ack in record["acks"]]
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        store, blobs = EventStore.open(postgres_url), open_blob_store(workspace.blob_url)
        try:
            view = LedgerView.read(store)
            committed = [
                c.committed for s in view.attempts.values() for c in s.calls.values() if c.committed
            ]
            for call in committed:  # every committed call's blob verifies
                blobs.get(BlobRef(call.blob_key, call.blob_sha256, call.blob_bytes))
            blob_keys = blobs.list_keys()
        finally:
            store.close()

    statuses = Counter(record["race_status"] for record in records)
    assert statuses == {200: 1, 409: CLIENTS - 1}
    race = view.attempts[RACE_ATTEMPT]
    assert list(race.calls) == [RACED_CALL] and race.calls[RACED_CALL].failure is None
    assert len(view.attempts[SHARED_ATTEMPT].calls) == CLIENTS * SHARED_CALLS
    assert lost_acknowledgements(view, acks) == []
    assert repeated_intents(view) == []
    assert version_gaps(view) == []
    assert [k for k, s in view.attempts.items() if s.pending_call_ids] == []
    assert sorted(c.blob_key for c in committed) == blob_keys
    selected = [s for s in view.attempts.values() if s.selection is not None]
    assert len(selected) == CLIENTS * ROLLOUTS
    figures.record(
        "concurrency/postgresql-s3",
        {
            "clients": CLIENTS,
            "attempts": len(view.attempts),
            "calls_committed": len(committed),
            "acknowledgements_checked": len(acks),
            "events_checked": len(view.events),
            "blobs_verified": len(committed),
            "racing_requests_for_one_call_id": CLIENTS,
            "race_winners": statuses[200],
            "lost": 0,
            "seconds": round(time.monotonic() - started, 1),
        },
    )
