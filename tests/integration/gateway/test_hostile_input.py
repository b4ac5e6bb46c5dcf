"""Hostile input over real HTTP: each value below once reached the ledger, the engine or the answer
and came back as a 500 (or a 200 it should not have been). Each is now a 400 in OpenAI's error
envelope, and the ledger and the blob store hold exactly what they held before.

- Keys ending in a newline (``"k\\n"`` passed a ``^...$`` check).
- Numbers and names the ledger's columns cannot hold: ``rollout_index`` or ``policy_version``
  >= 2**31 (PostgreSQL ``integer``; >= 2**63 overflowed SQLite too), a ``rollout_id`` or
  ``prompt_group`` over 200 characters (``varchar(200)``), on both databases.
- Sampling values no engine takes, refused before the intent: a ``seed`` >= 2**63 was a 500 after
  the intent was written, which masked the rollout (``capture_failed``).
- A lone UTF-16 surrogate (``"\\ud800"``) anywhere in a body: in message content, a Responses input,
  a ``rollout_id``, a reject ``detail``, a result, an object key.

Requests carry the attempt's token when opening answered one (``X-Grove-Attempt-Token``), so they
reach the check under test rather than the token's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER

from .conftest import MODEL, Gateway, serve

TOKEN_HEADER = "X-Grove-Attempt-Token"
INT32_END = 2**31  # one past PostgreSQL's integer
INT64_END = 2**63  # one past SQLite's INTEGER and every engine's seed
LONE = "\ud800"  # a lone surrogate; json.dumps writes it as the escape "\\ud800"


@pytest.fixture
def ledger_gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on each ledger database (SQLite, PostgreSQL) and a local blob directory."""
    with serve(database_url, str(tmp_path / "blobs")) as running:
        yield running


def open_attempt(gateway: Gateway, capture_key: str = "att-1", **fields: Any) -> dict[str, str]:
    """Open an attempt; the headers that name it (and carry its token, when it has one)."""
    body = {"capture_key": capture_key, "rollout_id": f"r-{capture_key}", "prompt_group": "g0"}
    body.update({"rollout_index": 0, **fields})
    answer = gateway.http.post("/v1/attempts", json=body)
    assert answer.status_code == 200, answer.text
    headers = {CAPTURE_KEY_HEADER: capture_key}
    token = answer.json().get("attempt_token")
    if token is not None:
        headers[TOKEN_HEADER] = token
    return headers


def raw(gateway: Gateway, path: str, body: str, headers: dict[str, str] | None = None) -> Any:
    """POST ``body`` (JSON text, sent as written) to ``path``."""
    return gateway.http.post(
        path, content=body, headers={"content-type": "application/json", **(headers or {})}
    )


def chat_body(**fields: Any) -> dict[str, Any]:
    """A small valid chat request, with ``fields`` replaced."""
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 2,
        **fields,
    }


def assert_refused(
    gateway: Gateway,
    send: Callable[[], httpx.Response],
    *,
    code: str = "invalid_request",
    match: str = "",
    param: str | None = None,
) -> dict[str, Any]:
    """``send()`` answers 400 with Grove's ``code`` in OpenAI's envelope (its message holding
    ``match``, its param ``param`` when given) and writes no event and no blob."""
    before = gateway.written()
    answer = send()
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    assert match in error["message"]
    if param is not None:
        assert error["param"] == param
    assert gateway.written() == before
    return error


# -- D2: keys that end in a newline ---------------------------------------------------------


def test_opening_an_attempt_whose_capture_key_ends_in_a_newline_is_refused(
    local_gateway: Gateway,
):
    body = {"capture_key": "k\n", "rollout_id": "r", "prompt_group": "g", "rollout_index": 0}
    assert_refused(
        local_gateway,
        lambda: local_gateway.http.post("/v1/attempts", json=body),
        code="invalid_capture_key",
        match="Invalid stream id 'k\\n'",
    )


def test_an_attempt_path_whose_capture_key_ends_in_a_newline_is_refused(local_gateway: Gateway):
    headers = open_attempt(local_gateway, "k")
    assert_refused(
        local_gateway,
        lambda: local_gateway.http.post("/v1/attempts/k%0A/close", headers=headers),
        code="invalid_capture_key",
    )
    assert local_gateway.state("k").admissions_closed is False


# -- D3: numbers and names the ledger's columns cannot hold ----------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rollout_index", INT32_END),
        ("rollout_index", INT64_END),
        ("policy_version", INT32_END),
        ("policy_version", INT64_END),
        ("rollout_id", "r" * 201),
        ("prompt_group", "g" * 201),
        ("selection_policy", "p" * 201),
        ("seed", INT64_END),
        ("rollout_index", -1),
    ],
)
def test_an_attempt_field_out_of_the_ledgers_range_is_refused_on_each_database(
    ledger_gateway: Gateway, field: str, value: Any
):
    body = {"capture_key": "att-1", "rollout_id": "r", "prompt_group": "g", "rollout_index": 0}
    body[field] = value
    assert_refused(
        ledger_gateway,
        lambda: ledger_gateway.http.post("/v1/attempts", json=body),
        param=field,
    )
    assert ledger_gateway.state("att-1").opened is None


def test_an_attempt_at_the_edge_of_every_range_is_recorded_on_each_database(
    ledger_gateway: Gateway,
):
    edge = {
        "rollout_id": "r" * 200,
        "prompt_group": "g" * 200,
        "rollout_index": INT32_END - 1,
        "policy_version": INT32_END - 1,
        "seed": INT64_END - 1,
    }
    headers = open_attempt(ledger_gateway, "att-edge", **edge)
    status = ledger_gateway.http.get("/v1/attempts/att-edge", headers=headers)
    assert status.status_code == 200, status.text
    assert {key: status.json()[key] for key in edge if key != "seed"} == {
        key: value for key, value in edge.items() if key != "seed"
    }
    opened = ledger_gateway.state("att-edge").opened
    assert opened is not None and opened.seed == INT64_END - 1


def test_a_result_naming_a_terminal_response_id_over_200_characters_is_refused(
    local_gateway: Gateway,
):
    headers = open_attempt(local_gateway)
    body = {"reward": 1.0, "terminal_response_id": "x" * 201}
    assert_refused(
        local_gateway,
        lambda: local_gateway.http.post("/v1/attempts/att-1/result", json=body, headers=headers),
        param="terminal_response_id",
    )


# -- D4: sampling values no engine takes, refused before the intent -------------------------


def test_a_chat_seed_of_2_to_the_64_is_refused_before_the_intent(local_gateway: Gateway):
    headers = open_attempt(local_gateway)
    body = json.dumps(chat_body(seed=18446744073709551616))  # the reproduction
    assert_refused(
        local_gateway,
        lambda: raw(local_gateway, "/v1/chat/completions", body, headers),
        match="seed",
        param="seed",
    )
    assert local_gateway.state().calls == {}
    answer = local_gateway.http.post("/v1/chat/completions", json=chat_body(), headers=headers)
    assert answer.status_code == 200, answer.text  # the attempt is unharmed


def test_the_largest_signed_64_bit_seed_is_sampled(local_gateway: Gateway):
    headers = open_attempt(local_gateway)
    answer = local_gateway.http.post(
        "/v1/chat/completions", json=chat_body(seed=INT64_END - 1), headers=headers
    )
    assert answer.status_code == 200, answer.text
    assert [call.status.value for call in local_gateway.state().calls.values()] == ["committed"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", INT64_END),
        ("seed", -1),
        ("max_tokens", INT32_END),
        ("max_completion_tokens", INT32_END),
        ("n", 2**70),
        ("top_logprobs", 2**70),
    ],
)
def test_a_chat_sampling_integer_out_of_range_is_refused(
    local_gateway: Gateway, field: str, value: int
):
    headers = open_attempt(local_gateway)
    body = chat_body(**{field: value})
    if field == "max_completion_tokens":
        del body["max_tokens"]
    assert_refused(
        local_gateway,
        lambda: local_gateway.http.post("/v1/chat/completions", json=body, headers=headers),
        code="invalid_request" if field not in ("n", "top_logprobs") else f"unsupported_{field}",
        param=field,
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", "NaN"), ("temperature", "Infinity"), ("top_p", "1e308"), ("top_p", "-0.5")],
)
def test_a_chat_sampling_number_out_of_range_is_refused(
    local_gateway: Gateway, field: str, value: str
):
    headers = open_attempt(local_gateway)
    body = json.dumps(chat_body(**{field: "VALUE"})).replace('"VALUE"', value)
    error = assert_refused(
        local_gateway,
        lambda: raw(local_gateway, "/v1/chat/completions", body, headers),
        code="invalid_sampling",
    )
    assert f"Invalid sampling parameter {field}" in error["message"]


def test_a_responses_max_output_tokens_of_2_to_the_31_is_refused(local_gateway: Gateway):
    headers = open_attempt(local_gateway)
    body = {"model": MODEL, "input": "x", "max_output_tokens": INT32_END}
    assert_refused(
        local_gateway,
        lambda: local_gateway.http.post("/v1/responses", json=body, headers=headers),
        param="max_output_tokens",
    )


# -- D5: lone surrogates ---------------------------------------------------------------------


def _chat(*messages: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": list(messages), **fields}


SURROGATE_BODIES: dict[str, tuple[str, Any, str]] = {
    "message content": (
        "/v1/chat/completions",
        _chat({"role": "user", "content": f"a{LONE}b"}),
        "messages.0.content",
    ),
    "message content part": (
        "/v1/chat/completions",
        _chat({"role": "user", "content": [{"type": "text", "text": LONE}]}),
        "messages.0.content.0.text",
    ),
    "a trailing low surrogate": (
        "/v1/chat/completions",
        _chat({"role": "user", "content": "\udfff"}),
        "messages.0.content",
    ),
    "an object key": (
        "/v1/chat/completions",
        _chat({"role": "user", "content": "x", LONE: 1}),
        "messages.0",
    ),
    "responses input": ("/v1/responses", {"model": MODEL, "input": LONE}, "input"),
    "responses input item": (
        "/v1/responses",
        {"model": MODEL, "input": [{"role": "user", "content": LONE}]},
        "input.0.content",
    ),
    "tool schema": (
        "/v1/chat/completions",
        _chat(
            {"role": "user", "content": "x"},
            tools=[{"type": "function", "function": {"name": "f", "description": LONE}}],
        ),
        "tools.0.function.description",
    ),
    "measure": (
        "/v1/attempts/att-1/measure",
        _chat({"role": "user", "content": LONE}),
        "messages.0.content",
    ),
    "result": ("/v1/attempts/att-1/result", {"reward": 1, "note": LONE}, "note"),
}
"""Where a lone surrogate sits, the route it is sent to and the place the refusal names; each
body is sent as ``json.dumps`` writes it (``"\\ud800"``, ASCII-escaped)."""


@pytest.mark.parametrize("name", list(SURROGATE_BODIES))
def test_a_lone_surrogate_anywhere_in_a_model_call_or_result_is_refused(
    local_gateway: Gateway, name: str
):
    path, body, where = SURROGATE_BODIES[name]
    headers = open_attempt(local_gateway)
    text = json.dumps(body)
    assert "\\ud800" in text or "\\udfff" in text
    error = assert_refused(local_gateway, lambda: raw(local_gateway, path, text, headers))
    assert f"{where} holds a lone UTF-16 surrogate" in error["message"]


def test_a_lone_surrogate_in_a_rollout_id_opens_no_attempt(local_gateway: Gateway):
    body = json.dumps(
        {"capture_key": "att-1", "rollout_id": LONE, "prompt_group": "g", "rollout_index": 0}
    )
    error = assert_refused(local_gateway, lambda: raw(local_gateway, "/v1/attempts", body))
    assert "rollout_id holds a lone UTF-16 surrogate" in error["message"]


def test_a_lone_surrogate_in_a_reject_detail_leaves_the_call_committed(local_gateway: Gateway):
    headers = open_attempt(local_gateway)
    committed = local_gateway.http.post(
        "/v1/chat/completions", json=chat_body(), headers={**headers, CALL_ID_HEADER: "c1"}
    )
    assert committed.status_code == 200, committed.text
    error = assert_refused(
        local_gateway,
        lambda: raw(
            local_gateway,
            "/v1/attempts/att-1/calls/c1/reject",
            json.dumps({"detail": LONE}),
            headers,
        ),
    )
    assert "detail holds a lone UTF-16 surrogate" in error["message"]
    assert local_gateway.state().calls["c1"].status.value == "committed"


def test_a_surrogate_pair_is_one_character_and_is_served(local_gateway: Gateway):
    headers = open_attempt(local_gateway)
    body = json.dumps(_chat({"role": "user", "content": "\ud83d\ude00"}))  # U+1F600 escaped
    assert "\\ud83d\\ude00" in body
    answer = raw(local_gateway, "/v1/chat/completions", body, headers)
    assert answer.status_code == 200, answer.text
