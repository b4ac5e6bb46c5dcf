"""Slow clients: the gateway's HTTP server bounds how long and how much a request's head takes.

A client that opens connections and sends its request line and headers a byte at a time (a
"slow loris") would hold a connection, and its memory, for as long as it likes. uvicorn's h11
server bounds the size of an incomplete head (``h11_max_incomplete_event_size``) and the idle
time between requests on a keep-alive connection (``timeout_keep_alive``), but not the time a
head takes: a byte every few seconds resets its keep-alive timer. :class:`SlowClientProtocol`
adds that bound: from the moment a connection opens, and again after each response, the next
request's head must be complete within ``header_timeout_s``, or the connection is closed.

:func:`server_options` gives the uvicorn settings for a :class:`grove.capture.limits.GatewayLimits`
(``grove/services/serve.py`` passes them to ``uvicorn.Config``); the body's own bounds are
``capture/body_limits.py``'s. A head over ``max_header_bytes`` is answered 400 by h11 and the
connection closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from grove.capture.limits import GatewayLimits

__all__ = ["SlowClientProtocol", "server_options"]


class SlowClientProtocol(H11Protocol):
    """uvicorn's h11 protocol, closing a connection whose request head takes longer than
    ``header_timeout_s`` (set per server by :func:`server_options`)."""

    header_timeout_s: float = GatewayLimits.header_timeout_s
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Start the clock for the first request's head."""
        super().connection_made(transport)
        self._arm_head_timer()

    def handle_events(self) -> None:
        """uvicorn's event handling; a complete head stops the clock."""
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:
            self._disarm_head_timer()

    def on_response_complete(self) -> None:
        """uvicorn's bookkeeping; then the clock starts for the next request's head."""
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
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
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.logger.info(
                "closing a connection whose request head took over %s s", self.header_timeout_s
            )
            self.transport.close()


def server_options(limits: GatewayLimits | None) -> dict[str, Any]:
    """uvicorn ``Config`` keyword arguments bounding slow and oversized request heads (None:
    the default limits)."""
    limits = limits or GatewayLimits()
    protocol = type(
        "SlowClientProtocol", (SlowClientProtocol,), {"header_timeout_s": limits.header_timeout_s}
    )
    return {
        "http": protocol,
        "timeout_keep_alive": limits.keep_alive_timeout_s,
        "h11_max_incomplete_event_size": limits.max_header_bytes,
    }
