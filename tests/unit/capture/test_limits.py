"""The gateway's bounds on one request (``capture/limits.py``, ``capture/body_limits.py``):
the depth scan, the structural checks, and the body middleware driven through ASGI itself.

The middleware tests call it as uvicorn does, with a ``receive`` that yields a client's chunks
and counts how many the middleware pulled: that count is what the server read.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from grove.capture.body_limits import BodyLimits
from grove.capture.limits import (
    GatewayLimits,
    LimitExceeded,
    check_document,
    check_schema,
    json_shape,
)

CHUNK = 64 * 1024


def nested(levels: int) -> dict[str, Any]:
    """An object schema ``levels`` objects deep (each level adds two JSON levels)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


# -- json_shape ----------------------------------------------------------------------------


def test_json_shape_counts_arrays_and_objects() -> None:
    # {"a": [[1], [2, [3]]]}: depth: the object 1, the outer array 2, [2, [3]] 3, [3] 4;
    # containers: the object, the outer array, [1], [2, [3]], [3] = 5
    assert json_shape(b'{"a": [[1], [2, [3]]]}') == (4, 5)


def test_json_shape_ignores_brackets_inside_strings_and_escaped_quotes() -> None:
    body = json.dumps({"a": '[[[{{ \\" [[', "b": ["]]]"]}).encode()
    assert json_shape(body) == (2, 2)


def test_json_shape_of_a_deep_body_needs_no_recursion() -> None:
    assert json_shape(b"[" * 100_000 + b"]" * 100_000) == (100_000, 100_000)


def test_json_shape_of_an_empty_body_is_zero() -> None:
    assert json_shape(b"") == (0, 0)


# -- structure -----------------------------------------------------------------------------


def test_a_model_call_with_more_messages_than_the_limit_is_refused() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}] * 4}
    with pytest.raises(LimitExceeded, match=r"messages holds 4 items.*at most 3") as refused:
        check_document(body, "/v1/chat/completions", GatewayLimits(max_messages=3))
    assert (refused.value.status, refused.value.code) == (400, "too_many_messages")


def test_a_responses_input_with_more_items_than_the_limit_is_refused() -> None:
    body = {"model": "m", "input": [{"role": "user", "content": "hi"}] * 4}
    with pytest.raises(LimitExceeded, match="input holds 4 items"):
        check_document(body, "/v1/responses", GatewayLimits(max_messages=3))


def test_a_string_the_ledger_would_store_is_bounded() -> None:
    body = {"capture_key": "k", "rollout_id": "r" * 65, "prompt_group": "g", "rollout_index": 0}
    with pytest.raises(LimitExceeded, match=r"rollout_id is 65 characters.*at most 64") as refused:
        check_document(body, "/v1/attempts", GatewayLimits(max_string_chars=64))
    assert refused.value.param == "rollout_id"
    assert refused.value.key == "max_string_chars"


def test_a_nested_result_string_is_bounded_and_named() -> None:
    body = {"reward": 1.0, "output": [{"role": "assistant", "content": "x" * 65}]}
    with pytest.raises(LimitExceeded, match=r"output\[0\]\.content"):
        check_document(body, "/v1/attempts/k/result", GatewayLimits(max_string_chars=64))


def test_an_image_a_result_echoes_is_bounded_as_an_image() -> None:
    image = "data:image/png;base64," + "A" * 1000  # 750 bytes decoded
    body = {"reward": 1.0, "output": [{"role": "user", "content": [{"image_url": image}]}]}
    check_document(body, "/v1/attempts/k/result", GatewayLimits(max_string_chars=64))
    with pytest.raises(LimitExceeded, match="1022 characters"):
        limits = GatewayLimits(max_string_chars=64, max_image_bytes=512)
        check_document(body, "/v1/attempts/k/result", limits)


def test_the_conversation_of_a_model_call_is_not_a_ledger_string() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 1000}]}
    check_document(body, "/v1/chat/completions", GatewayLimits(max_string_chars=64))


def test_a_model_call_string_outside_the_conversation_is_bounded() -> None:
    body = {"model": "m", "messages": [], "stop": ["x" * 65]}
    with pytest.raises(LimitExceeded, match=r"stop\[0\]"):
        check_document(body, "/v1/chat/completions", GatewayLimits(max_string_chars=64))


def test_a_schema_over_the_byte_limit_is_refused() -> None:
    schema = {"type": "object", "description": "d" * 100}
    with pytest.raises(LimitExceeded, match="bytes") as refused:
        check_schema(schema, "response_format", GatewayLimits(max_schema_bytes=64))
    assert refused.value.code == "schema_too_large"


def test_a_schema_over_the_depth_limit_is_refused() -> None:
    # nested(2): the schema 1, properties 2, a 3, properties 4, a 5, then {"type"}'s value 6
    check_schema(nested(2), "tools[0]", GatewayLimits(max_schema_depth=6))
    with pytest.raises(LimitExceeded, match="deeper than 5") as refused:
        check_schema(nested(2), "tools[0]", GatewayLimits(max_schema_depth=5))
    assert refused.value.code == "schema_too_deep"


def test_a_schema_over_the_node_limit_is_refused() -> None:
    # {"type": "object", "properties": {"a": {...}, ...}}: 1 + 1 + 1 + 3 properties x 2 = 9
    schema = {"type": "object", "properties": {k: {"type": "string"} for k in "abc"}}
    check_schema(schema, "tools[0]", GatewayLimits(max_schema_nodes=9))
    with pytest.raises(LimitExceeded, match="more than 8 JSON values") as refused:
        check_schema(schema, "tools[0]", GatewayLimits(max_schema_nodes=8))
    assert refused.value.code == "schema_too_complex"


def test_every_schema_of_a_model_call_is_checked() -> None:
    tool = {"type": "function", "function": {"name": "f", "parameters": nested(40)}}
    body = {"model": "m", "messages": [], "tools": [{"type": "function"}, tool]}
    with pytest.raises(LimitExceeded, match=r"tools\[1\]\.function\.parameters"):
        check_document(body, "/v1/chat/completions", GatewayLimits())


def test_a_messages_api_tool_input_schema_is_checked() -> None:
    body = {"model": "m", "messages": [], "tools": [{"name": "f", "input_schema": nested(40)}]}
    with pytest.raises(LimitExceeded, match=r"tools\[0\]\.input_schema"):
        check_document(body, "/v1/messages", GatewayLimits())


def test_limits_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_messages must be > 0, got 0"):
        GatewayLimits(max_messages=0)


# -- the middleware, through ASGI ----------------------------------------------------------


class Client:
    """A client's body as ``receive`` messages, counting the bytes the server pulled."""

    def __init__(self, total: int, chunk: int = CHUNK, delay_s: float = 0.0) -> None:
        self.chunks = self._chunks(total, chunk)
        self.pulled = 0
        self.delay_s = delay_s

    @staticmethod
    def _chunks(total: int, chunk: int) -> Iterator[bytes]:
        sent = 0
        while sent < total:
            size = min(chunk, total - sent)
            sent += size
            yield b" " * size

    async def receive(self) -> dict[str, Any]:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        chunk = next(self.chunks, None)
        if chunk is None:
            return {"type": "http.request", "body": b"", "more_body": False}
        self.pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": True}


def serve_once(
    limits: GatewayLimits, client: Client, headers: list[tuple[bytes, bytes]] | None = None
) -> tuple[int, dict[str, Any], bool]:
    """(status, body, whether the app ran) of one POST through ``BodyLimits``."""
    ran = False

    async def app(scope: Any, receive: Any, send: Any) -> None:
        nonlocal ran
        ran = True
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/attempts", "headers": headers or []}
    asyncio.run(BodyLimits(app, limits)(scope, client.receive, send))
    body = json.loads(sent[1]["body"]) if sent[1]["body"] != b"{}" else {}
    return sent[0]["status"], body, ran


def test_a_body_over_the_limit_is_refused_after_reading_at_most_the_limit_and_one_chunk() -> None:
    limit = 1 << 20
    client = Client(50 * 1000 * 1000)  # 50 MB sent in 64 KiB chunks, no Content-Length
    status, body, ran = serve_once(GatewayLimits(max_body_bytes=limit), client)
    assert (status, body["error"]["code"], ran) == (413, "request_too_large", False)
    assert client.pulled <= limit + CHUNK
    assert "gateway.limits.max_body_bytes" in body["error"]["message"]


def test_a_content_length_over_the_limit_is_refused_before_the_body_is_read() -> None:
    client = Client(50 * 1000 * 1000)
    headers = [(b"content-length", b"50000000")]
    status, body, ran = serve_once(GatewayLimits(max_body_bytes=1 << 20), client, headers)
    assert (status, ran, client.pulled) == (413, False, 0)
    assert "Content-Length says 50000000 bytes" in body["error"]["message"]


def test_a_body_within_the_limit_reaches_the_app() -> None:
    status, _, ran = serve_once(GatewayLimits(max_body_bytes=1 << 20), Client(1 << 20))
    assert (status, ran) == (200, True)


def test_a_body_that_does_not_arrive_in_time_is_refused() -> None:
    client = Client(10 * CHUNK, delay_s=0.05)  # 10 chunks, 0.5 s in all
    status, body, ran = serve_once(GatewayLimits(body_timeout_s=0.2), client)
    assert (status, body["error"]["code"], ran) == (408, "body_timeout", False)
    assert client.pulled < 10 * CHUNK
