"""The per-attempt call budget over real HTTP: with ``token_capture.max_model_calls`` set, an
attempt records at most that many model calls; the next is refused (409
``call_budget_exhausted``) before its intent, nothing written, and every recorded call counts,
a resample after a rejection too (``capture/attempt_settings.py``; ``docs/gateway.md``,
"Call budget")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from openai import ConflictError

from grove.capture.attempt_settings import AttemptSettings
from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.config import ConfigurationError, GroveConfig, load_config
from grove.services.serve import ServerThread, build_gateway, gateway_options
from grove.workspace import Workspace

from .conftest import MODEL, Gateway
from .support import AttemptTokens
from .test_completions import USER


def call(gateway: Gateway, capture_key: str = "att-1", model: str = MODEL) -> str:
    """One model call of ``capture_key``; its response id."""
    completion = gateway.client(capture_key).chat.completions.create(
        model=model, messages=[USER], max_tokens=2
    )
    return completion.id


def refused_call(gateway: Gateway, capture_key: str = "att-1", model: str = MODEL) -> ConflictError:
    """A model call of ``capture_key`` that must be refused with 409; the refusal."""
    with pytest.raises(ConflictError) as refused:
        call(gateway, capture_key, model)
    return refused.value


def budget_gateway(serve_gateway: Callable[..., Gateway], budget: int) -> Gateway:
    return serve_gateway(attempts=AttemptSettings(max_model_calls=budget))


def test_a_call_beyond_the_budget_is_refused_409_and_writes_nothing(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = budget_gateway(serve_gateway, 2)
    gateway.open()
    call(gateway), call(gateway)
    before = gateway.written()

    refusal = refused_call(gateway)

    assert refusal.status_code == 409
    assert refusal.body["code"] == "call_budget_exhausted"
    assert (
        "Attempt 'att-1' has recorded 2 model calls, its budget "
        "(token_capture.max_model_calls: 2)" in refusal.body["message"]
    )
    assert "raise token_capture.max_model_calls" in refusal.body["message"]
    assert gateway.written() == before
    assert len(gateway.state().calls) == 2


def test_a_resample_after_a_rejection_counts_against_the_budget(
    serve_gateway: Callable[..., Gateway],
) -> None:
    # Budget 2: call 1, rejected by the harness, then its resample (call 2) use it up.
    gateway = budget_gateway(serve_gateway, 2)
    gateway.open()
    call(gateway)
    (first,) = gateway.state().calls
    rejected = gateway.http.post(f"/v1/attempts/att-1/calls/{first}/reject", json={"detail": "x"})
    assert rejected.status_code == 200, rejected.text
    call(gateway)
    before = gateway.written()

    assert refused_call(gateway).body["code"] == "call_budget_exhausted"
    assert gateway.written() == before


def test_the_budget_counts_the_calls_of_each_attempt_apart(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = budget_gateway(serve_gateway, 1)
    gateway.open("att-1"), gateway.open("att-2")
    call(gateway, "att-1")

    call(gateway, "att-2")

    assert refused_call(gateway, "att-1").body["code"] == "call_budget_exhausted"
    assert refused_call(gateway, "att-2").body["code"] == "call_budget_exhausted"


def test_measuring_a_request_is_not_a_call_of_the_budget(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = budget_gateway(serve_gateway, 1)
    gateway.open()
    measured = gateway.http.post(
        "/v1/attempts/att-1/measure", json={"model": MODEL, "messages": [USER]}
    )
    assert measured.status_code == 200, measured.text

    call(gateway)

    assert len(gateway.state().calls) == 1


def test_the_default_budget_is_unbounded() -> None:
    assert GroveConfig().token_capture.max_model_calls is None
    assert AttemptSettings().max_model_calls is None


@pytest.mark.parametrize("budget", [0, -1])
def test_a_budget_below_one_is_refused(budget: int) -> None:
    with pytest.raises(ConfigurationError, match=r"token_capture.max_model_calls"):
        load_config({"token_capture": {"max_model_calls": budget}})
    with pytest.raises(ValueError, match=r"max_model_calls must be >= 1"):
        AttemptSettings(max_model_calls=budget)


def test_the_configuration_key_sets_the_budget_of_the_gateway(tmp_path: Path) -> None:
    config = GroveConfig.model_validate({"token_capture": {"max_model_calls": 1}})
    app = build_gateway(Workspace.resolve(tmp_path), **gateway_options(config))
    tokens = AttemptTokens()
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.base_url, event_hooks=tokens.hooks) as http,
    ):
        gateway = Gateway(server.base_url, app.state.gateway.service, http, tokens=tokens)
        gateway.open()
        call(gateway, model=EMBEDDED_MODEL_NAME)
        refusal = refused_call(gateway, model=EMBEDDED_MODEL_NAME)
    assert "(token_capture.max_model_calls: 1)" in refusal.body["message"]
