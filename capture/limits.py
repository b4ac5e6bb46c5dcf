"""What the gateway reads from one client, bounded: the settings and the checks of a body.

Every request is untrusted, so the gateway bounds what it reads before it parses it
(``docs/security.md``, "Limits"). :class:`GatewayLimits` holds every bound, with a safe default;
``grove.config`` exposes each as a ``gateway.limits`` key. The checks, in the order a request
meets them:

1. **Headers**: at most ``max_header_bytes`` of request line and headers (431, by
   ``capture/body_limits.py``; a head still incomplete past that size is answered 400 by the
   server, ``capture/slow_clients.py``), received within ``header_timeout_s`` (the connection
   is closed beyond); an idle keep-alive connection is closed after ``keep_alive_timeout_s``.
2. **Body bytes** (``capture/body_limits.py``): a ``Content-Length`` over ``max_body_bytes`` is
   refused (413) before a byte of the body is read; a body without one is counted while it
   streams in and refused as soon as the count passes the limit, so the server never holds more
   than the limit and one chunk. The whole body must arrive within ``body_timeout_s`` (408).
3. **JSON shape** (:func:`json_shape`): the nesting of ``[`` and ``{`` outside strings, and how
   many arrays and objects there are, found in one pass over the bytes without recursion and
   without parsing; over ``max_json_depth`` or ``max_json_containers``: 400. Only then is the
   body parsed (its depth and size are now bounded: no parser recursion is deep, and no body of
   millions of tiny objects costs the parser and the request models gigabytes).
4. **Structure** (:func:`check_document`): a model call (Chat and Messages ``messages``,
   Responses ``input``) holds at most ``max_messages`` items; each structured-output schema
   (``response_format``, ``text.format``, each tool's parameters or ``input_schema``) at most
   ``max_schema_bytes`` (compact JSON), ``max_schema_depth`` levels and ``max_schema_nodes`` JSON
   values; every string a request writes into the ledger is at most ``max_string_chars``
   characters, but for an image data URL (a returned history may echo one), which is bounded
   by ``max_image_bytes`` instead. The conversation of a model call (``messages``, ``input``,
   ``instructions``, ``system``) is rendered into tokens, never written into the ledger, so its
   text is bounded by the body alone.
5. **Images** (``capture/media.py``): at most ``max_image_bytes`` decoded, and at most
   ``max_image_pixels`` (width x height, read from the image's header before it is decoded).

A refusal is a :class:`LimitExceeded`: its status, Grove's stable code, and a message naming
the limit, the value found and the ``gateway.limits`` key that raises it. Nothing is written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from itertools import accumulate
from typing import Any, Final

import numpy as np

__all__ = [
    "CONVERSATION_KEYS",
    "GatewayLimits",
    "LimitExceeded",
    "check_document",
    "check_schema",
    "is_model_call",
    "json_shape",
]

MiB: Final = 1 << 20
CONVERSATION_KEYS: Final = frozenset({"messages", "input", "instructions", "system"})
"""Top-level fields of a model call that hold its conversation (rendered, not stored as text)."""
_MODEL_CALL_SUFFIXES: Final = ("/chat/completions", "/responses", "/messages", "/measure")
_SCAN_CHUNK: Final = 1 << 20
_SHORT_REST: Final = 512  # bytes outside strings scanned in Python up to this many
_NOT_BRACKETS: Final = bytes(b for b in range(256) if b not in b"[]{}")
_STEPS: Final = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}
_DATA_URL_HEAD: Final = 64  # room for "data:image/...;base64," before the image's base64
_STRING: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)


@dataclass(frozen=True)
class GatewayLimits:
    """Every bound on what one request may make the gateway read, hold, compute or store.

    Producer: ``grove.config`` (the ``gateway.limits`` section) or a caller of
    ``grove.capture.gateway.create_app``; consumers: ``capture/body_limits.py``,
    ``capture/slow_clients.py``, ``capture/media.py`` and :func:`check_document`. Every value is
    positive; the defaults are the documented safe ones (``docs/security.md``).
    """

    max_body_bytes: int = 16 * MiB
    """Bytes of one request body (413 beyond, before parsing)."""
    body_timeout_s: float = 60.0
    """Seconds the whole body may take to arrive (408 beyond)."""
    header_timeout_s: float = 10.0
    """Seconds the request line and headers may take to arrive (connection closed beyond)."""
    keep_alive_timeout_s: float = 5.0
    """Seconds an idle keep-alive connection is kept open between requests."""
    max_header_bytes: int = 16 * 1024
    """Bytes of request line and headers (431 beyond)."""
    max_json_depth: int = 64
    """Nesting levels of arrays and objects in a body (400 beyond, before parsing)."""
    max_json_containers: int = 100_000
    """Arrays and objects in a body (400 beyond, before parsing)."""
    max_messages: int = 4096
    """Chat ``messages`` or Responses ``input`` items of one model call."""
    max_string_chars: int = MiB
    """Characters of any one string a request writes into the ledger."""
    max_schema_bytes: int = 16 * 1024
    """Bytes (compact JSON) of one structured-output or tool parameter schema."""
    max_schema_depth: int = 32
    """Nesting levels of one schema."""
    max_schema_nodes: int = 2048
    """JSON values (objects, arrays, strings, numbers, ...) of one schema."""
    max_image_bytes: int = 8 * MiB
    """Decoded bytes of one image."""
    max_image_pixels: int = 4096 * 4096
    """Width x height of one image, read from its header before it is decoded."""

    def __post_init__(self) -> None:
        for field in fields(self):
            value = getattr(self, field.name)
            if not value > 0:
                raise ValueError(f"GatewayLimits.{field.name} must be > 0, got {value!r}")


class LimitExceeded(Exception):
    """A request over one of the :class:`GatewayLimits`: answered with ``status`` and ``code``,
    the message naming the limit and the value found; ``key`` is the ``gateway.limits`` key."""

    def __init__(
        self, status: int, code: str, key: str, message: str, param: str | None = None
    ) -> None:
        self.status = status
        self.code = code
        self.key = key
        self.param = param
        self.message = f"{message} (raise gateway.limits.{key} to allow more)"
        super().__init__(self.message)


def is_model_call(path: str) -> bool:
    """Whether ``path`` is a model-call route (its conversation is exempt from the string
    limit: it is rendered into tokens, not written into the ledger)."""
    return path.endswith(_MODEL_CALL_SUFFIXES)


def json_shape(body: bytes) -> tuple[int, int]:
    """``(depth, containers)``: the deepest nesting of ``[`` and ``{`` in ``body`` outside JSON
    strings, and how many there are.

    One pass without recursion and without parsing: every string (a quote, then characters
    other than quote and backslash or escaped pairs, then a quote) is removed by one regular
    expression, then the running count of openers minus closers is taken: in Python over the
    brackets of a short rest (a model call's body, whose rest is its keys' punctuation; numpy's
    set-up costs more there), in chunks with numpy otherwise. Its maximum is the depth, the
    openers counted are the containers. Malformed JSON gets some count; the parser refuses it
    later.
    """
    stripped = _STRING.sub(b"", body)
    if len(stripped) <= _SHORT_REST:
        brackets = stripped.translate(None, _NOT_BRACKETS)
        containers = brackets.count(b"[") + brackets.count(b"{")
        return max(accumulate((_STEPS[b] for b in brackets), initial=0)), containers
    data = np.frombuffer(stripped, dtype=np.uint8)
    depth = peak = containers = 0
    for start in range(0, len(data), _SCAN_CHUNK):
        chunk = data[start : start + _SCAN_CHUNK]
        opens = (chunk == ord("[")) | (chunk == ord("{"))
        closes = (chunk == ord("]")) | (chunk == ord("}"))
        containers += int(np.count_nonzero(opens))
        steps = opens.astype(np.int32) - closes
        running = np.cumsum(steps) + depth
        peak = max(peak, int(running.max()))
        depth = int(running[-1])
    return peak, containers


def check_document(document: Any, path: str, limits: GatewayLimits) -> None:
    """Refuse a parsed body over the structural limits (module docstring, step 4)."""
    model_call = is_model_call(path) and isinstance(document, Mapping)
    if model_call:
        for key in ("messages", "input"):
            items = document.get(key)
            if isinstance(items, list) and len(items) > limits.max_messages:
                raise LimitExceeded(
                    400,
                    "too_many_messages",
                    "max_messages",
                    f"{key} holds {len(items)} items; the gateway takes at most "
                    f"{limits.max_messages} per model call",
                    key,
                )
        for where, schema in _schemas(document):
            check_schema(schema, where, limits)
    stored = (
        {k: v for k, v in document.items() if k not in CONVERSATION_KEYS}
        if model_call
        else document
    )
    image_chars = limits.max_image_bytes // 3 * 4 + _DATA_URL_HEAD
    for where, text in _strings(stored):
        if text.startswith("data:image/") and len(text) <= image_chars:
            continue  # an image a returned history echoes: bounded as an image
        if len(text) > limits.max_string_chars:
            raise LimitExceeded(
                400,
                "string_too_long",
                "max_string_chars",
                f"the string at {where or 'body'} is {len(text)} characters; a string the "
                f"ledger stores is at most {limits.max_string_chars}",
                where or None,
            )


def check_schema(schema: Any, where: str, limits: GatewayLimits) -> None:
    """Refuse a structured-output schema over the schema limits; ``where`` names it."""
    size = len(json.dumps(schema, separators=(",", ":")))
    if size > limits.max_schema_bytes:
        raise LimitExceeded(
            400,
            "schema_too_large",
            "max_schema_bytes",
            f"the schema of {where} is {size} bytes (compact JSON); the gateway enforces "
            f"schemas of at most {limits.max_schema_bytes}",
            _param(where),
        )
    nodes = depth = 0
    pending: list[tuple[Any, int]] = [(schema, 1)]
    while pending:
        value, level = pending.pop()
        nodes += 1
        depth = max(depth, level)
        if depth > limits.max_schema_depth:
            raise LimitExceeded(
                400,
                "schema_too_deep",
                "max_schema_depth",
                f"the schema of {where} nests deeper than {limits.max_schema_depth} levels",
                _param(where),
            )
        if nodes > limits.max_schema_nodes:
            raise LimitExceeded(
                400,
                "schema_too_complex",
                "max_schema_nodes",
                f"the schema of {where} holds more than {limits.max_schema_nodes} JSON values",
                _param(where),
            )
        children = value.values() if isinstance(value, Mapping) else value
        if isinstance(value, Mapping | list):
            pending.extend((child, level + 1) for child in children)


def _param(where: str) -> str:
    return where.split("[", 1)[0].split(".", 1)[0]


def _schemas(document: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    """The structured-output schemas of a model-call body, named by where they are."""
    response_format = document.get("response_format")
    if isinstance(response_format, Mapping):
        inner = response_format.get("json_schema")
        if isinstance(inner, Mapping) and "schema" in inner:
            yield "response_format.json_schema.schema", inner["schema"]
    text = document.get("text")
    if isinstance(text, Mapping):
        spec = text.get("format")
        if isinstance(spec, Mapping) and "schema" in spec:
            yield "text.format.schema", spec["schema"]
    tools = document.get("tools")
    if isinstance(tools, list):
        for index, tool in enumerate(tools):
            if not isinstance(tool, Mapping):
                continue
            function = tool.get("function")
            if isinstance(function, Mapping) and "parameters" in function:
                yield f"tools[{index}].function.parameters", function["parameters"]
            for key in ("parameters", "input_schema"):  # Responses; Messages
                if key in tool:
                    yield f"tools[{index}].{key}", tool[key]


def _strings(document: Any) -> Iterator[tuple[str, str]]:
    """Every string in ``document`` (keys too), with where it is; iterative, never recursive."""
    pending: list[tuple[str, Any]] = [("", document)]
    while pending:
        where, value = pending.pop()
        if isinstance(value, str):
            yield where, value
        elif isinstance(value, Mapping):
            for key, child in value.items():
                inner = f"{where}.{key}" if where else str(key)
                yield inner, str(key)
                pending.append((inner, child))
        elif isinstance(value, list):
            pending.extend((f"{where}[{i}]", child) for i, child in enumerate(value))
