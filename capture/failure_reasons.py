"""The reason codes the capture side records in ``call.failed``, and how a failure is described.

A call fails in the stage that raised (``capture/lifecycle.py``): ``engine_error`` while the
engine generates or its generation becomes a delta, ``storage_error`` while the delta blob is
written, ``internal_error`` while the commit is built or appended. Two more are recorded on a
committed call: ``request_finished_without_staged_coordinates`` when its client went away before
the answer was delivered (``capture/delivery.py``), and ``rejected_by_harness`` when the harness
rejected the response (``docs/events.md``; how each weighs in training: ``docs/forest.md``,
"Failures and drops").
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ENGINE_ERROR",
    "FAILURE_REASONS",
    "INTERNAL_ERROR",
    "STORAGE_ERROR",
    "failure_detail",
]

ENGINE_ERROR: Final = "engine_error"
"""The engine failed to generate, or its generation could not be made a delta."""
STORAGE_ERROR: Final = "storage_error"
"""The delta blob could not be written."""
INTERNAL_ERROR: Final = "internal_error"
"""The blob was written, but building or appending the commit failed (the output could not be
parsed or fingerprinted, or the ledger refused the commit)."""

FAILURE_REASONS: Final = (
    ENGINE_ERROR,
    STORAGE_ERROR,
    INTERNAL_ERROR,
    "request_finished_without_staged_coordinates",
    "rejected_by_harness",
)
"""Every reason code a capture service records in ``call.failed``."""

MAX_DETAIL_CHARS: Final = 2000
"""The longest ``call.failed`` detail written for an exception."""


def failure_detail(error: BaseException) -> str:
    """What ``call.failed`` says of ``error``: its class and message, at most
    ``MAX_DETAIL_CHARS`` characters."""
    return f"{type(error).__name__}: {error}"[:MAX_DETAIL_CHARS]
