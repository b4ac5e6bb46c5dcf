"""The gateway's limits over real HTTP (``docs/security.md``, "Limits"): each ``gateway.limits``
key, set in a configuration, changes what a real uvicorn server refuses, and a refusal is a
clean 4xx that writes nothing.

Slow and oversized requests are sent over a raw socket, as a hostile client sends them: a
chunked body that never ends, a head sent in pieces, a connection left idle. No test asserts a
duration: a refusal is shown by its answer (or the server closing the connection) arriving
before the socket's own, much longer, timeout.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from openai import BadRequestError

from grove.capture.limits import GatewayLimits
from grove.config import load_config

from .conftest import MODEL, Gateway

SOCKET_TIMEOUT_S = 20.0
MB = 1000 * 1000


def limited(serve_gateway: Callable[..., Gateway], **keys: Any) -> Gateway:
    """A gateway whose limits are a configuration's ``gateway.limits`` with ``keys`` set."""
    overrides = {f"gateway.limits.{key}": value for key, value in keys.items()}
    return serve_gateway(limits=load_config(overrides=overrides).gateway.limits.capture())


def connect(gateway: Gateway) -> socket.socket:
    url = urlsplit(gateway.base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=SOCKET_TIMEOUT_S)
    return sock


def read_answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of the answer on ``sock`` (read until the server closes it or
    the body is complete); a body that is not JSON as ``{"text": ...}``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        None,
    )
    while length is not None and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    try:
        return status, json.loads(body)
    except ValueError:  # the server's own plain-text answer (an unreadable head)
        return status, {"text": body.decode(errors="replace")}


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closes ``sock`` (before the socket's own timeout)."""
    try:
        while True:
            if not sock.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def post_head(path: str, **headers: str) -> bytes:
    lines = [f"POST {path} HTTP/1.1", "Host: gateway", "Content-Type: application/json"]
    lines += [f"{name.replace('_', '-')}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def rss_peak_kib() -> int:
    return int(_status_field("VmHWM"))


def _status_field(name: str) -> str:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{name}:"):
            return line.split()[1]
    raise AssertionError(f"/proc/self/status has no {name}")


def stream_chunked(sock: socket.socket, total: int, chunk: int = 64 * 1024) -> int:
    """Send up to ``total`` bytes as a chunked body until the server answers or hangs up;
    returns the bytes sent."""
    frame = f"{chunk:x}\r\n".encode() + b" " * chunk + b"\r\n"
    sock.setblocking(False)
    pending, sent = b"", 0
    try:
        while sent < total or pending:
            readable, writable, _ = select.select([sock], [sock], [], SOCKET_TIMEOUT_S)
            if readable or not writable:
                break  # the answer is there (or nothing moves)
            if not pending:
                pending, sent = frame, sent + chunk
            try:
                pending = pending[sock.send(pending) :]
            except BlockingIOError:
                continue
            except (BrokenPipeError, ConnectionResetError):
                break
    finally:
        sock.setblocking(True)
        sock.settimeout(SOCKET_TIMEOUT_S)
    return sent


# -- gateway.limits.max_body_bytes ---------------------------------------------------------


def test_a_50_mb_body_is_refused_while_it_streams_in_and_memory_stays_bounded(
    local_gateway: Gateway, capsys: pytest.CaptureFixture[str]
) -> None:
    # the gateway runs in this process (a uvicorn thread): its peak resident memory is ours
    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = rss_peak_kib()
    written = local_gateway.written()
    sock = connect(local_gateway)
    started = time.monotonic()
    sock.sendall(post_head("/v1/attempts", Transfer_Encoding="chunked"))
    sent = stream_chunked(sock, 50 * MB)
    status, body = read_answer(sock)
    elapsed = time.monotonic() - started
    sock.close()
    growth_mib = (rss_peak_kib() - before) / 1024
    with capsys.disabled():
        print(
            f"\n50 MB body: 413 after {elapsed:.3f} s, {sent / MB:.1f} MB sent, peak RSS "
            f"growth {growth_mib:.1f} MiB"
        )
    assert (status, body["error"]["code"]) == (413, "request_too_large")
    assert growth_mib < 100
    assert local_gateway.written() == written


def test_a_content_length_over_max_body_bytes_is_refused_before_the_body_is_sent(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_body_bytes=1024)
    sock = connect(gateway)
    sock.sendall(post_head("/v1/attempts", Content_Length="1025"))  # and no body at all
    status, body = read_answer(sock)
    sock.close()
    assert (status, body["error"]["code"]) == (413, "request_too_large")
    assert "Content-Length says 1025 bytes" in body["error"]["message"]
    assert "gateway.limits.max_body_bytes" in body["error"]["message"]


def test_a_body_within_max_body_bytes_is_served(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, max_body_bytes=1024)
    answer = gateway.http.post("/v1/attempts", json={"capture_key": "k" * 900})
    assert answer.status_code == 400  # through to the app, which wants more fields
    assert answer.json()["error"]["code"] == "invalid_request"


# -- gateway.limits.body_timeout_s ---------------------------------------------------------


def test_a_body_that_stops_arriving_is_refused_after_body_timeout_s(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, body_timeout_s=0.5)
    sock = connect(gateway)
    sock.sendall(post_head("/v1/attempts", Content_Length="100") + b'{"capture_key": ')
    status, body = read_answer(sock)  # the client sends nothing more
    sock.close()
    assert (status, body["error"]["code"]) == (408, "body_timeout")
    assert "gateway.limits.body_timeout_s" in body["error"]["message"]


# -- gateway.limits.header_timeout_s -------------------------------------------------------


def test_a_head_sent_too_slowly_is_cut_off_after_header_timeout_s(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, header_timeout_s=0.5, keep_alive_timeout_s=60)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n")  # the head never ends
    assert closed_by_server(sock)
    sock.close()


def test_a_head_that_arrives_in_time_is_served(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, header_timeout_s=5)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    status, body = read_answer(sock)
    sock.close()
    assert (status, body["status"]) == (200, "ok")


def test_the_next_heads_clock_starts_after_each_answer(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, header_timeout_s=0.5, keep_alive_timeout_s=60)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    assert read_answer(sock)[0] == 200
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n")  # the second head never ends
    assert closed_by_server(sock)
    sock.close()


# -- gateway.limits.keep_alive_timeout_s ---------------------------------------------------


def test_an_idle_keep_alive_connection_is_closed_after_keep_alive_timeout_s(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, keep_alive_timeout_s=0.3, header_timeout_s=60)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    assert read_answer(sock)[0] == 200
    assert closed_by_server(sock)  # nothing more was sent on it
    sock.close()


# -- gateway.limits.max_header_bytes -------------------------------------------------------


def test_a_head_over_max_header_bytes_is_refused(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, max_header_bytes=2048)
    padding = {"X-Padding": "p" * 3000}
    answer = gateway.http.get("/health", headers=padding)
    assert (answer.status_code, answer.json()["error"]["code"]) == (
        431,
        "request_header_too_large",
    )
    assert limited(serve_gateway).http.get("/health", headers=padding).status_code == 200


def test_a_head_still_incomplete_past_max_header_bytes_is_refused(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_header_bytes=2048)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\nX-Padding: " + b"p" * 3000)  # no end of head yet
    assert read_answer(sock)[0] == 400
    sock.close()


def test_a_head_sent_in_pieces_is_refused_once_its_bytes_pass_max_header_bytes(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_header_bytes=2048)
    sock = connect(gateway)
    sock.sendall(b"GET /health HTTP/1.1\r\n")
    for index in range(4):  # 4 headers of 535 bytes, each its own read: 2162 with the line
        sock.sendall(f"X-Padding-{index}: {'p' * 520}\r\n".encode())
        time.sleep(0.02)
    assert read_answer(sock)[0] == 400
    assert closed_by_server(sock)
    sock.close()


def test_each_head_on_a_keep_alive_connection_has_its_own_max_header_bytes(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_header_bytes=2048)
    sock = connect(gateway)
    head = f"GET /health HTTP/1.1\r\nHost: gateway\r\nX-Padding: {'p' * 1200}\r\n\r\n"
    for _ in range(3):  # 3 heads of about 1250 bytes: more than the limit together
        sock.sendall(head[:600].encode())
        time.sleep(0.02)
        sock.sendall(head[600:].encode())
        assert read_answer(sock)[0] == 200
    sock.close()


# -- gateway.limits.max_json_depth ---------------------------------------------------------


def test_a_body_deeper_than_max_json_depth_is_refused_before_parsing(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_json_depth=8)
    written = gateway.written()
    body = {"capture_key": "k", "rollout_id": "r", "prompt_group": "g", "rollout_index": 0}
    body["extra"] = [[[[[[[[[1]]]]]]]]]  # 9 arrays inside the object: depth 10
    answer = gateway.http.post("/v1/attempts", json=body)
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "request_too_deep"
    assert "10 levels deep" in answer.json()["error"]["message"]
    assert gateway.written() == written


# -- gateway.limits.max_json_containers ----------------------------------------------------


def test_a_body_of_more_containers_than_max_json_containers_is_refused_before_parsing(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_json_containers=16)
    written = gateway.written()
    body = {"capture_key": "k", "rollout_id": "r", "prompt_group": "g", "rollout_index": 0}
    answer = gateway.http.post("/v1/attempts", json={**body, "extra": [{}] * 16})  # 1 + 1 + 16
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "request_too_complex"
    assert "holds 18 arrays and objects" in answer.json()["error"]["message"]
    assert gateway.written() == written
    within = gateway.http.post("/v1/attempts", json={**body, "extra": [{}] * 14})
    assert within.json()["error"]["code"] == "invalid_request"  # the app's: no such field


def test_a_tool_schema_450_levels_deep_is_a_clean_400(local_gateway: Gateway) -> None:
    # D6: it used to reach the chat template and fail there with a recursion error (500)
    parameters: dict[str, Any] = {"type": "string"}
    for _ in range(450):
        parameters = {"type": "object", "properties": {"a": parameters}}
    tool = {"type": "function", "function": {"name": "deep", "parameters": parameters}}
    written = local_gateway.written()
    with pytest.raises(BadRequestError) as refused:
        local_gateway.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], tools=[tool]
        )
    assert refused.value.status_code == 400
    assert refused.value.code == "request_too_deep"
    assert local_gateway.written() == written


# -- gateway.limits.max_messages -----------------------------------------------------------


def test_a_call_with_more_messages_than_max_messages_is_refused(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_messages=3)
    messages = [{"role": "user", "content": "hi"}] * 4
    with pytest.raises(BadRequestError) as refused:
        gateway.client().chat.completions.create(model=MODEL, messages=messages)  # type: ignore[arg-type]
    assert refused.value.code == "too_many_messages"
    assert "messages holds 4 items" in refused.value.message


# -- gateway.limits.max_string_chars -------------------------------------------------------


def test_a_string_longer_than_max_string_chars_is_never_written(
    serve_gateway: Callable[..., Gateway],
) -> None:
    gateway = limited(serve_gateway, max_string_chars=64)
    written = gateway.written()
    body = {"capture_key": "k", "prompt_group": "g", "rollout_index": 0}
    answer = gateway.http.post("/v1/attempts", json={**body, "rollout_id": "r" * 65})
    assert answer.status_code == 400
    assert answer.json()["error"] == {
        "message": "the string at rollout_id is 65 characters; a string the ledger stores is at "
        "most 64 (raise gateway.limits.max_string_chars to allow more)",
        "type": "invalid_request_error",
        "code": "string_too_long",
        "param": "rollout_id",
    }
    assert gateway.written() == written
    assert gateway.http.post("/v1/attempts", json={**body, "rollout_id": "r" * 64}).is_success


# -- gateway.limits.max_schema_* -----------------------------------------------------------


def schema_call(gateway: Gateway, schema: dict[str, Any]) -> BadRequestError:
    """The refusal of a chat call whose response format is ``schema``."""
    with pytest.raises(BadRequestError) as refused:
        gateway.client().chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
        )
    return refused.value


def test_a_schema_over_max_schema_bytes_is_refused(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, max_schema_bytes=256)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(20)}}
    refused = schema_call(gateway, schema)
    assert refused.code == "schema_too_large"
    assert "response_format.json_schema.schema" in refused.message


def test_a_schema_over_max_schema_depth_is_refused(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, max_schema_depth=4)
    # the schema 1, properties 2, a 3, a's properties 4, b 5
    inner = {"type": "object", "properties": {"b": {"type": "string"}}}
    schema = {"type": "object", "properties": {"a": inner}}
    assert schema_call(gateway, schema).code == "schema_too_deep"


def test_a_schema_over_max_schema_nodes_is_refused(serve_gateway: Callable[..., Gateway]) -> None:
    gateway = limited(serve_gateway, max_schema_nodes=16)
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(8)}}
    assert schema_call(gateway, schema).code == "schema_too_complex"


@pytest.mark.parametrize("reference", ["http://example.com/s.json", "file:///etc/passwd", "s.json"])
def test_a_schema_ref_outside_the_schema_is_refused(local_gateway: Gateway, reference: str) -> None:
    # D9: such a reference used to be accepted and silently not enforced
    schema = {"type": "object", "properties": {"a": {"$ref": reference}}}
    local_gateway.open()  # the format is read on an attempt the client holds
    written = local_gateway.written()
    refused = schema_call(local_gateway, schema)
    assert refused.code == "unsupported_schema"
    assert "only local references (starting with '#')" in refused.message
    assert local_gateway.written() == written


def test_the_default_limits_are_the_configuration_defaults() -> None:
    assert load_config().gateway.limits.capture() == GatewayLimits()
