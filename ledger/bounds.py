"""The ranges a recorded field holds on both ledger databases, so that no value outside them is
ever written (``docs/gateway.md``, "Field ranges").

The events table keeps payloads as JSON, but the projections (``ledger/schema.py``) copy fields
into typed columns, and the narrower database sets the bound:

- counts, indexes and versions (``rollout_index``, ``policy_version``, token lengths, steps) are
  PostgreSQL ``integer`` columns: ``0 .. 2**31 - 1``;
- byte sizes and seeds fit a signed 64-bit integer (PostgreSQL ``bigint``, SQLite ``INTEGER``,
  torch's and vLLM's seeds): ``0 .. 2**63 - 1``;
- identifiers (rollout ids, prompt groups, call and response ids, policy names) are
  ``varchar(200)``: at most 200 characters; reason codes and finish reasons ``varchar(64)``.

The event models (``ledger/events.py``) declare these bounds, so an append that breaks one is an
``InvalidEventPayload`` before anything is written; the gateway's request models
(``capture/wire.py``) declare the same, so a client learns them from the OpenAPI schema and gets a
400 instead.
"""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import Field

__all__ = [
    "MAX_BYTES",
    "MAX_CODE_CHARS",
    "MAX_COUNT",
    "MAX_NAME_CHARS",
    "MAX_SEED",
    "Code",
    "Count",
    "Name",
    "Seed",
    "Size",
]

MAX_COUNT: Final = 2**31 - 1
"""The largest index, count or version: PostgreSQL ``integer``."""
MAX_BYTES: Final = 2**63 - 1
"""The largest byte size: a signed 64-bit integer."""
MAX_SEED: Final = 2**63 - 1
"""The largest seed: a signed 64-bit integer (derived seeds are non-negative int64 too)."""
MAX_NAME_CHARS: Final = 200
"""The longest identifier: ``varchar(200)``, as the stream id (capture key) is."""
MAX_CODE_CHARS: Final = 64
"""The longest reason code or finish reason: ``varchar(64)``."""

Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
"""A non-negative index, count or version that an ``integer`` column holds."""
Size = Annotated[int, Field(ge=0, le=MAX_BYTES)]
"""A non-negative byte size that a ``bigint`` column holds."""
Seed = Annotated[int, Field(ge=0, le=MAX_SEED)]
"""A sampling seed: a non-negative signed 64-bit integer."""
Name = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
"""An identifier a ``varchar(200)`` column holds."""
Code = Annotated[str, Field(max_length=MAX_CODE_CHARS)]
"""A reason code or finish reason a ``varchar(64)`` column holds."""
