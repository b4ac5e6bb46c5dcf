"""A client that disconnects mid-call: the call still commits, then records the cancellation
(``request_finished_without_staged_coordinates``), which masks nothing when the harness retried
(docs/forest.md, "Failures and drops")."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import openai
import pytest

from grove.capture.delivery import CALLER_GONE
from grove.ledger.attempt import CallState
from grove.training.projector import Projector, ProjectorSettings

from .conftest import Gateway, HeldEngine
from .test_completions import USER, ask, reply

HELD_MAX_TOKENS = 7  # HeldEngine holds the calls that ask for 7 tokens
WAIT_S = 30.0  # how long the server may take to notice; only a bound for polling


def wait_until(condition: Callable[[], Any], what: str) -> Any:
    """Poll ``condition`` until it holds (the server works in its own threads)."""
    deadline = time.monotonic() + WAIT_S
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"the gateway never {what}")
        time.sleep(0.01)
    return value


def connections(gateway: Gateway) -> int:
    assert gateway.server is not None
    return len(gateway.server.server.server_state.connections)


def abandon_held_call(gateway: Gateway, engine: HeldEngine, **options: Any) -> CallState:
    """Send a call the engine holds, give up on it (the client closes its socket), let the engine
    finish, and return the call once its answer was handled."""
    gateway.open()
    idle = connections(gateway)
    with gateway.client(timeout=0.5) as client, pytest.raises(openai.APITimeoutError):
        client.chat.completions.create(
            model="grove/test-tiny", messages=[USER], max_tokens=HELD_MAX_TOKENS, **options
        )
    assert engine.started.is_set()
    wait_until(lambda: connections(gateway) == idle, "saw the client's connection close")
    engine.release.set()
    (call_id,) = gateway.state().calls
    return wait_until(
        lambda: (c := gateway.state().calls[call_id]).failure is not None and c,
        "recorded the cancellation",
    )


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "streamed"])
def test_a_call_whose_client_went_away_commits_and_records_the_cancellation(
    held: tuple[Gateway, HeldEngine], stream: bool
):
    gateway, engine = held

    call = abandon_held_call(gateway, engine, stream=stream)

    assert call.committed is not None
    assert (call.failure.reason, call.failure.detail) == (
        CALLER_GONE,
        "the client disconnected before the answer was delivered",
    )
    status = gateway.status()["calls"][0]
    assert (status["status"], status["failure_reason"]) == ("committed", CALLER_GONE)
    events = [e.event_type for e in gateway.service.log.store.read_stream("att-1")]
    assert events.count("call.failed") == 1


def test_a_call_whose_client_stayed_records_no_failure(held: tuple[Gateway, HeldEngine]):
    gateway, _ = held
    gateway.open()

    _, headers = ask(gateway.client(), [USER])

    call = gateway.state().calls[headers["x-grove-call-id"]]
    assert (call.committed is not None, call.failure) == (True, None)


def test_a_rollout_whose_harness_retried_after_a_disconnect_still_trains(
    held: tuple[Gateway, HeldEngine],
):
    gateway, engine = held
    abandoned = abandon_held_call(gateway, engine)
    retry, headers = ask(gateway.client(), [USER])
    answer = gateway.http.post(
        "/v1/attempts/att-1/result", json={"reward": 1.0, "output": [reply(retry)]}
    )
    assert answer.status_code == 200, answer.text
    projector = Projector(
        gateway.service.log.store,
        gateway.service.blobs,
        ProjectorSettings(rollouts_per_group=1, groups_per_step=1),
    )

    projector.poll()

    finalized = gateway.state().finalized
    assert answer.json()["selection"]["call_ids"] == [headers["x-grove-call-id"]]
    assert abandoned.call_id not in answer.json()["selection"]["call_ids"]
    assert (finalized.trainable, finalized.masked_reason) == (True, None)
    published = projector.batch_for_step(0)
    assert published is not None and len(published.rollouts[0].rollout.rows) == 1
