"""The gateway's door: an ASGI middleware that bounds every request body before the app sees it.

``BodyLimits`` wraps the application (``grove.capture.gateway.create_app`` installs it) and, for
each HTTP request (``capture/limits.py`` states the rules):

1. refuses a request line and headers over ``max_header_bytes`` (431; a head that arrives in
   pieces is bounded by the server itself, ``capture/slow_clients.py``);
2. refuses a ``Content-Length`` over ``max_body_bytes`` at once (413), reading none of the body;
3. reads the body from ``receive()``, counting bytes as they arrive, and answers 413 as soon as
   the count passes ``max_body_bytes``: at most the limit and one chunk are ever held, whatever
   the client sends; the whole body must arrive within ``body_timeout_s`` (408);
4. measures the body's JSON depth and counts its arrays and objects on the bytes (no parsing),
   then parses it and checks its
   structure (``grove.capture.limits.check_document``);
5. hands the application the body it read, then the client's own ``receive()`` (so the app still
   sees a disconnect); the body and its parsed document are in the scope too (``CHECKED_BODY``),
   where the gateway's routes (``CheckedBodyRoute``) take them: a body is parsed once.

A refusal is answered here, as every gateway refusal is, with OpenAI's error object and
``Connection: close`` (the rest of an unread body is never read), and the application never
runs, so nothing is written. A body that is not JSON passes on to the application, which
refuses it with its own message.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from dataclasses import dataclass
from typing import Any, Final

from fastapi import Request, Response
from fastapi.routing import APIRoute

from grove.capture.limits import GatewayLimits, LimitExceeded, check_document, json_shape
from grove.capture.wire import ErrorBody, ErrorDetail

__all__ = ["CHECKED_BODY", "BodyLimits", "CheckedBody", "CheckedBodyRequest", "CheckedBodyRoute"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

CHECKED_BODY: Final = "grove.checked_body"
"""Scope key: the request's ``CheckedBody``."""
_UNPARSED: Final = object()


@dataclass
class CheckedBody:
    """A request body as ``BodyLimits`` read and checked it: its bytes, the JSON document parsed
    from them (``_UNPARSED``: empty, or not JSON), and whether a reader has taken the bytes (the
    first reader does, through ``receive()`` or a ``CheckedBodyRequest``; later reads of
    ``receive()`` go to the client's own)."""

    data: bytes
    document: Any = _UNPARSED
    taken: bool = False


class BodyLimits:
    """ASGI middleware: every request body bounded by ``limits`` before ``app`` runs."""

    def __init__(self, app: ASGIApp, limits: GatewayLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Read, bound and check the body; then run the app on it (module docstring)."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_head(scope)
            body = await self._read(scope, receive)
            if body is None:
                return  # the client went away before its body arrived: nothing to answer
            checked = scope[CHECKED_BODY] = CheckedBody(body, self._check(scope, body))
        except LimitExceeded as refusal:
            await _refuse(send, refusal)
            return

        async def replay() -> Message:
            if checked.taken:
                return await receive()
            checked.taken = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    def _check_head(self, scope: Scope) -> None:
        """The request line and headers within ``max_header_bytes`` (as they came: path, query,
        each ``name: value`` line)."""
        size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"")
        size += sum(len(name) + len(value) + 4 for name, value in scope.get("headers", ()))
        if size > self.limits.max_header_bytes:
            raise LimitExceeded(
                431,
                "request_header_too_large",
                "max_header_bytes",
                f"the request line and headers hold {size} bytes; the gateway reads at most "
                f"{self.limits.max_header_bytes}",
            )

    async def _read(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, refused past ``max_body_bytes`` or ``body_timeout_s``; None when
        the client disconnected first."""
        limit = self.limits.max_body_bytes
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            raise _too_large(f"Content-Length says {declared} bytes", limit)
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):  # one timer for the body
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > limit:
                        raise _too_large(
                            f"the body passed {limit} bytes while it streamed in", limit
                        )
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise LimitExceeded(
                408,
                "body_timeout",
                "body_timeout_s",
                f"the request body did not arrive within {self.limits.body_timeout_s} s "
                f"({size} bytes came)",
            ) from None
        return b"".join(chunks)

    def _check(self, scope: Scope, body: bytes) -> Any:
        """JSON depth and size on the bytes, then the parsed body's structure; the document
        (``_UNPARSED``: empty, or not JSON)."""
        if not body:
            return _UNPARSED
        depth, containers = json_shape(body)
        if containers > self.limits.max_json_containers:
            raise LimitExceeded(
                400,
                "request_too_complex",
                "max_json_containers",
                f"the body holds {containers} arrays and objects; the gateway reads at most "
                f"{self.limits.max_json_containers}",
            )
        if depth > self.limits.max_json_depth:
            raise LimitExceeded(
                400,
                "request_too_deep",
                "max_json_depth",
                f"the body nests arrays and objects {depth} levels deep; the gateway reads at "
                f"most {self.limits.max_json_depth}",
            )
        try:
            document = json.loads(body)
        except (ValueError, RecursionError):
            return _UNPARSED  # not JSON: the application refuses it with its own message
        check_document(document, scope.get("path", ""), self.limits)
        return document


def _poll(receive: Receive) -> Message | None:
    """``receive()``'s message when it comes without waiting, else None (the wait abandoned,
    nothing taken: the message stays for the next ``receive()``)."""
    step = receive().__await__()
    try:
        step.send(None)
    except StopIteration as ready:
        return ready.value
    step.close()
    return None


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _too_large(found: str, limit: int) -> LimitExceeded:
    return LimitExceeded(
        413,
        "request_too_large",
        "max_body_bytes",
        f"Request body too large: {found}; the gateway reads at most {limit} bytes per request",
    )


async def _refuse(send: Send, refusal: LimitExceeded) -> None:
    """The refusal as OpenAI's error object, closing the connection."""
    detail = ErrorDetail(
        message=refusal.message,
        type="invalid_request_error",
        code=refusal.code,
        param=refusal.param,
    )
    payload = json.dumps(ErrorBody(error=detail).model_dump()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(payload)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": refusal.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


class CheckedBodyRequest(Request):
    """The request a gateway route sees: ``body()`` and ``json()`` answer what ``BodyLimits``
    read and parsed (the same bytes and ``json.loads`` result) instead of reading and parsing
    the body again, and ``is_disconnected()`` asks ``receive()`` without an AnyIO cancel scope."""

    async def body(self) -> bytes:
        """The body the door read, when no reader has taken it yet; else Starlette's."""
        checked = self.scope.get(CHECKED_BODY)
        if checked is None or checked.taken or hasattr(self, "_body"):
            return await super().body()
        checked.taken = True
        self._body = checked.data
        return self._body

    async def json(self) -> Any:
        """The parsed body (parsed here only when the door did not)."""
        checked = self.scope.get(CHECKED_BODY)
        if checked is None or checked.document is _UNPARSED:
            return await super().json()
        return checked.document

    async def is_disconnected(self) -> bool:
        """Whether the client went away, asked without waiting, as Starlette asks: ``receive()``
        runs up to its first wait, and its message counts only when it came without one."""
        if not self._is_disconnected:
            message = _poll(self._receive)
            self._is_disconnected = message is not None and message["type"] == "http.disconnect"
        return self._is_disconnected


class CheckedBodyRoute(APIRoute):
    """FastAPI's route, handed the request body ``BodyLimits`` parsed (FastAPI's custom route
    class hook): the body is parsed once, not once to check it and again to validate it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        """FastAPI's handler, on a request that reuses the door's parse."""
        handler = super().get_route_handler()

        async def checked(request: Request) -> Response:
            return await handler(CheckedBodyRequest(request.scope, request.receive))

        return checked
