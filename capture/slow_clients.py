"""Slow clients: the gateway's HTTP server bounds how long and how much a request's head takes.

A client that opens connections and sends its request line and headers a byte at a time (a
"slow loris") would hold a connection, and its memory, for as long as it likes. uvicorn bounds
the idle time between requests on a keep-alive connection (``timeout_keep_alive``), but not the
time a head takes (a byte every few seconds resets its keep-alive timer), and its httptools
server not the size of an incomplete head either. :class:`SlowClientProtocol`, uvicorn's
httptools protocol (the request is parsed in C by llhttp), adds both bounds:

- from the moment a connection opens, and again after each response, the next request's head
  must be complete within ``header_timeout_s``, or the connection is closed;
- the bytes that arrive while a head is incomplete are counted, and once they pass
  ``max_header_bytes`` the request is answered 400 and the connection closed (what h11's
  ``h11_max_incomplete_event_size`` did). A head that begins in the same read as the end of a
  pipelined request is counted from the next read, so at most the limit and one read are held.

A head that arrives complete is parsed whatever its size, and then refused 431 by
``capture/body_limits.py`` when it is over ``max_header_bytes``.

:func:`server_options` gives the uvicorn settings for a :class:`grove.capture.limits.GatewayLimits`
(``grove/services/serve.py`` passes them to ``uvicorn.Config``); the body's own bounds are
``capture/body_limits.py``'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from grove.capture.limits import GatewayLimits

__all__ = ["SlowClientProtocol", "server_options"]


class SlowClientProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head takes longer than
    ``header_timeout_s`` and refusing one whose incomplete head passes ``max_header_bytes``
    (both set per server by :func:`server_options`)."""

    header_timeout_s: float = GatewayLimits.header_timeout_s
    max_header_bytes: int = GatewayLimits.max_header_bytes
    _head_timer: asyncio.TimerHandle | None = None
    _awaiting_head: bool = True  # the next bytes belong to a request head not yet complete
    _head_bytes: int = 0  # bytes received while that head is incomplete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the clock for the first request's head."""
        super().connection_made(transport)
        self._arm_head_timer()

    def data_received(self, data: bytes) -> None:
        """uvicorn's parsing; a head still incomplete past ``max_header_bytes`` is refused."""
        if self._awaiting_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if (
            self._awaiting_head
            and self._head_bytes > self.max_header_bytes
            and not self.transport.is_closing()
        ):
            self._disarm_head_timer()
            self.logger.warning(
                "refusing a request head still incomplete after %s bytes", self._head_bytes
            )
            self.send_400_response("Request head too large.")

    def on_headers_complete(self) -> None:
        """A complete head stops the clock; then uvicorn starts the request."""
        self._awaiting_head = False
        self._disarm_head_timer()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """uvicorn's bookkeeping; the bytes after a request belong to the next one's head."""
        super().on_message_complete()
        self._awaiting_head, self._head_bytes = True, 0

    def on_response_complete(self) -> None:
        """uvicorn's bookkeeping; then the clock starts for the next request's head."""
        super().on_response_complete()
        if not self.transport.is_closing() and self._awaiting_head:
            self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        """Stop the clock; uvicorn's bookkeeping."""
        self._disarm_head_timer()
        super().connection_lost(exc)

    def _arm_head_timer(self) -> None:
        self._disarm_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _disarm_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._awaiting_head and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request head took over %s s", self.header_timeout_s
            )
            self.transport.close()


def server_options(limits: GatewayLimits | None) -> dict[str, Any]:
    """uvicorn ``Config`` keyword arguments bounding slow and oversized request heads (None:
    the default limits)."""
    limits = limits or GatewayLimits()
    protocol = type(
        "SlowClientProtocol",
        (SlowClientProtocol,),
        {"header_timeout_s": limits.header_timeout_s, "max_header_bytes": limits.max_header_bytes},
    )
    return {"http": protocol, "timeout_keep_alive": limits.keep_alive_timeout_s}
