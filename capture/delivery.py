"""Delivering a committed call's answer, and noticing a client that went away before it.

A model call is not stopped by its client: once admitted, generation, blob and commit finish as
they would (the worker may still write). What the client's disconnect changes is the record: a
committed call whose answer was not delivered records ``call.failed`` with ``CALLER_GONE``
(``request_finished_without_staged_coordinates``). The call stays committed; outside the
selection, with nothing pending, that cancellation masks nothing (``docs/forest.md``, "Failures
and drops"), so a harness that retried still trains.

Two checks, both after the commit: ``caller_disconnected`` asks the server, on the event loop
once the call's worker thread is done, whether the connection is already closed (before a plain
answer or a stream is sent); ``DeliveredStream`` notices a stream that ends before its last event
was handed to the server (the server cancels a stream whose client disconnects). Both are
uvicorn/Starlette behaviour: a closed connection is reported as ``http.disconnect`` by the ASGI
``receive``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final

import anyio
import anyio.to_thread
from fastapi import Request
from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

__all__ = ["CALLER_GONE", "DeliveredStream", "caller_disconnected"]

CALLER_GONE: Final = "request_finished_without_staged_coordinates"
"""The failure reason a committed call records when its client went away before the answer was
delivered (one of ``grove.capture.failure_reasons.FAILURE_REASONS``)."""


async def caller_disconnected(connection: Request) -> bool:
    """Whether the client of ``connection`` has closed it, asked on the event loop without
    waiting (a closed connection is already reported by ``receive``)."""
    return await connection.is_disconnected()


class DeliveredStream(StreamingResponse):
    """Server-sent events that call ``on_cut`` (once, in a worker thread) when the stream ends
    before its last event was handed to the server: the client disconnected, or sending failed."""

    def __init__(
        self, events: Iterator[str], headers: dict[str, str], on_cut: Callable[[], None]
    ) -> None:
        super().__init__(events, media_type="text/event-stream", headers=headers)
        self.on_cut = on_cut

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Stream the events; on a cut, record it even while being cancelled."""
        delivered = False

        async def tracked(message: Message) -> None:
            nonlocal delivered
            await send(message)
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                delivered = True

        try:
            await super().__call__(scope, receive, tracked)
        finally:
            if not delivered:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(self.on_cut)
