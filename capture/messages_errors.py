"""Anthropic's conventions on ``/v1/messages``: its error envelope and its ``x-api-key`` header.

Every refusal and failure of the gateway is made once, as the OpenAI error object
(``capture/refusals.py``). On ``/v1/messages`` this middleware rewrites that answer into
Anthropic's envelope, ``{"type": "error", "error": {"type", "message"}}``, with the same status
(which is what the ``anthropic`` client maps to its exception classes) and the error type
Anthropic names for it (:data:`ERROR_TYPES`); the message keeps Grove's code in front
(``[code] message``). A request there that carries its key as ``x-api-key`` (the ``anthropic``
client's ``api_key``) and no ``Authorization`` header has it read as the bearer token.
"""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ERROR_TYPES", "MESSAGES_PATH", "MessagesConventions", "anthropic_error"]

MESSAGES_PATH: Final = "/v1/messages"

ERROR_TYPES: Final[dict[int, str]] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    422: "invalid_request_error",
    429: "rate_limit_error",
    503: "overloaded_error",
}
"""Anthropic's error type per status; any other 5xx is ``api_error``, any other 4xx
``invalid_request_error``."""


def anthropic_error(status: int, body: Any) -> dict[str, Any]:
    """Anthropic's error envelope for an answer with ``status`` and Grove's error ``body``."""
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        message = f"[{error.get('code')}] {error.get('message')}"
        # Grove's own code rides beside Anthropic's fields, as on every other route.
        return {
            "type": "error",
            "error": {"type": kind, "message": message, "code": error.get("code")},
        }
    return {"type": "error", "error": {"type": kind, "message": str(body)}}


class MessagesConventions:
    """ASGI middleware: Anthropic's error envelope and ``x-api-key`` on ``/v1/messages`` only."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != MESSAGES_PATH:
            await self.app(scope, receive, send)
            return
        headers = list(scope["headers"])
        names = {name for name, _ in headers}
        key = next((value for name, value in headers if name == b"x-api-key"), None)
        if key is not None and b"authorization" not in names:
            scope = {**scope, "headers": [*headers, (b"authorization", b"Bearer " + key)]}
        started: dict[str, Any] = {}
        chunks: list[bytes] = []

        async def rewriting(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] >= 400:
                started.update(message)
                return
            if not started:
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if message.get("more_body"):
                return
            try:
                body = json.loads(b"".join(chunks))
            except ValueError:
                body = b"".join(chunks).decode(errors="replace")
            data = json.dumps(anthropic_error(started["status"], body)).encode()
            kept = [
                (name, value)
                for name, value in started.get("headers", [])
                if name not in (b"content-length", b"content-type")
            ]
            kept += [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(data))]
            await send({**started, "headers": kept})
            await send({"type": "http.response.body", "body": data})

        await self.app(scope, receive, rewriting)
