"""What the gateway does once per request, over real HTTP: the body is parsed once (the door's
parse is the one the route validates), and FastAPI's native telemetry is off, so a request
looks up no OpenTelemetry provider."""

from __future__ import annotations

import json
from typing import Any

import pytest
from opentelemetry import _logs, metrics, trace

from .conftest import MODEL, Gateway


def chat_body() -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    ).encode()


def test_a_model_call_body_is_parsed_once(local_gateway: Gateway, monkeypatch: pytest.MonkeyPatch):
    local_gateway.open()
    body, parses = chat_body(), []
    loads = json.loads

    def counting(text: Any, *args: Any, **kwargs: Any) -> Any:
        parses.extend([text] if text == body else [])
        return loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", counting)
    answer = local_gateway.http.post(
        "/v1/chat/completions",
        content=body,
        headers={"Content-Type": "application/json", "X-Grove-Capture-Key": "att-1"},
    )
    assert answer.status_code == 200, answer.text
    assert len(parses) == 1


def test_a_json_body_without_a_json_content_type_is_still_refused(local_gateway: Gateway):
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post(
        "/v1/chat/completions",
        content=chat_body(),
        headers={"Content-Type": "text/plain", "X-Grove-Capture-Key": "att-1"},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_request"
    assert local_gateway.written() == before


def test_a_request_looks_up_no_opentelemetry_provider(
    local_gateway: Gateway, monkeypatch: pytest.MonkeyPatch
):
    lookups: list[str] = []
    for module, name in (
        (trace, "get_tracer_provider"),
        (metrics, "get_meter_provider"),
        (_logs, "get_logger_provider"),
    ):
        found = getattr(module, name)
        monkeypatch.setattr(
            module, name, lambda found=found, name=name: lookups.append(name) or found()
        )
    local_gateway.open()
    assert local_gateway.http.get("/v1/models").status_code == 200
    assert lookups == []
