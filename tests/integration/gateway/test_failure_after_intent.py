"""A call that fails after its intent, on building its commit, is recorded ``internal_error`` at
once, so the harness's result is taken without waiting out the settle timeout (300 s by default)
and the rollout is finalized masked like any failed capture (docs/gateway.md, "Failures after the
intent")."""

from __future__ import annotations

import time
from collections.abc import Callable

import openai
import pytest

import grove.capture.call_events

from .conftest import Gateway
from .test_completions import USER, ask

AT_ONCE_S = 5.0  # far below the default settle timeout


@pytest.fixture
def breaking(serve_gateway: Callable[..., Gateway], monkeypatch: pytest.MonkeyPatch) -> Gateway:
    """A gateway with the default settle timeout whose commits cannot be built (the output's
    fingerprint fails), attempt ``att-1`` opened."""
    gateway = serve_gateway()
    gateway.open()

    def broken(messages: object) -> str:
        raise RuntimeError("fingerprinting failed")

    monkeypatch.setattr(grove.capture.call_events, "fingerprint_output", broken)
    return gateway


def test_a_call_that_fails_building_its_commit_is_answered_500_and_recorded_failed(
    breaking: Gateway,
):
    with pytest.raises(openai.APIStatusError) as failed:
        ask(breaking.client("att-1"), [USER])

    (call,) = breaking.status("att-1")["calls"]
    assert (failed.value.status_code, call["status"], call["failure_reason"]) == (
        500,
        "failed",
        "internal_error",
    )


def test_the_result_after_such_a_failure_settles_at_once(breaking: Gateway):
    with pytest.raises(openai.APIStatusError):
        ask(breaking.client("att-1"), [USER])

    started = time.monotonic()
    answer = breaking.http.post("/v1/attempts/att-1/result", json={"reward": 0.0})
    waited = time.monotonic() - started

    status = answer.json()
    assert answer.status_code == 200, answer.text
    assert (status["settled"], status["timed_out"], status["pending"]) == (True, False, [])
    assert waited < AT_ONCE_S
