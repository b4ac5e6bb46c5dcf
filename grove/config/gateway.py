"""The ``gateway`` section of Grove's configuration: how the capture gateway bounds its clients.

``gateway.limits`` holds every bound on what one request may make the gateway read, hold,
compute or store (``docs/security.md``, "Limits"): each key is a field of
``grove.capture.limits.GatewayLimits``, with the same default, and :meth:`LimitsConfig.capture`
hands them to the gateway (``grove.services.serve.build_gateway``). The section says how a server
treats untrusted clients, not what a run computes, so it is left out of the configuration's
digest: a resumed run may change it.
"""

from __future__ import annotations

from pydantic import Field

from grove.capture.limits import GatewayLimits
from grove.config.base import Section

__all__ = ["GatewayConfig", "LimitsConfig"]

_DEFAULTS = GatewayLimits()
_GiB = 1 << 30
_HOUR = 3600.0


class LimitsConfig(Section):
    """``gateway.limits``: the bounds on one request (``capture/limits.py`` states each rule)."""

    max_body_bytes: int = Field(default=_DEFAULTS.max_body_bytes, ge=1, le=_GiB)
    """Bytes of one request body. A larger ``Content-Length`` is refused (413) before the body
    is read; a body without one is refused as soon as it passes the limit while it streams in."""

    body_timeout_s: float = Field(default=_DEFAULTS.body_timeout_s, gt=0, le=_HOUR)
    """Seconds the whole body of a request may take to arrive (408 beyond)."""

    header_timeout_s: float = Field(default=_DEFAULTS.header_timeout_s, gt=0, le=_HOUR)
    """Seconds the request line and headers may take to arrive, from the connection's opening
    or the previous response; the connection is closed beyond."""

    keep_alive_timeout_s: float = Field(default=_DEFAULTS.keep_alive_timeout_s, gt=0, le=_HOUR)
    """Seconds an idle keep-alive connection stays open between requests."""

    max_header_bytes: int = Field(default=_DEFAULTS.max_header_bytes, ge=1024, le=1 << 20)
    """Bytes of a request's line and headers (431 beyond; a head still incomplete past it is
    answered 400 and its connection closed)."""

    max_json_depth: int = Field(default=_DEFAULTS.max_json_depth, ge=4, le=10_000)
    """Nesting levels of arrays and objects in a body, measured before it is parsed (400)."""

    max_json_containers: int = Field(default=_DEFAULTS.max_json_containers, ge=16, le=1 << 30)
    """Arrays and objects in a body, counted before it is parsed (400): bounds what parsing and
    validating a body of many tiny objects costs."""

    max_messages: int = Field(default=_DEFAULTS.max_messages, ge=1, le=1_000_000)
    """Chat ``messages`` or Responses ``input`` items of one model call (400 beyond)."""

    max_string_chars: int = Field(default=_DEFAULTS.max_string_chars, ge=64, le=_GiB)
    """Characters of any one string a request writes into the ledger: every string of an
    attempt, result or reject body, and of a model call outside its conversation (400); an
    image data URL is bounded by ``max_image_bytes`` instead."""

    max_schema_bytes: int = Field(default=_DEFAULTS.max_schema_bytes, ge=64, le=_GiB)
    """Bytes (compact JSON) of one structured-output or tool parameter schema (400)."""

    max_schema_depth: int = Field(default=_DEFAULTS.max_schema_depth, ge=2, le=10_000)
    """Nesting levels of one structured-output or tool parameter schema (400)."""

    max_schema_nodes: int = Field(default=_DEFAULTS.max_schema_nodes, ge=2, le=10_000_000)
    """JSON values (objects, arrays, strings, numbers, booleans, nulls) of one schema (400)."""

    max_image_bytes: int = Field(default=_DEFAULTS.max_image_bytes, ge=1024, le=_GiB)
    """Decoded bytes of one image (400), worked out from its base64 length before decoding."""

    max_image_pixels: int = Field(default=_DEFAULTS.max_image_pixels, ge=1, le=1 << 32)
    """Width x height of one image (400), read from its header before its pixels are decoded."""

    def capture(self) -> GatewayLimits:
        """These limits as the gateway takes them."""
        return GatewayLimits(**self.model_dump())


class GatewayConfig(Section):
    """``gateway``: how the capture gateway treats its clients."""

    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    """The bounds on one request."""
