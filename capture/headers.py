"""The headers of the capture protocol: what a client sends to name its attempt and call, and what
the gateway answers about the call's admission (``docs/gateway.md``, "Headers")."""

from __future__ import annotations

from typing import Final

from grove.capture.lifecycle import CallOutcome

__all__ = [
    "CALL_ID_HEADER",
    "CAPTURE_KEY_HEADER",
    "DECISION_HEADER",
    "PARENT_CALL_ID_HEADER",
    "ROOT_REASON_HEADER",
    "decision_headers",
]

CAPTURE_KEY_HEADER: Final = "X-Grove-Capture-Key"
"""Request header naming the attempt (its capture key) a model call belongs to; required."""
CALL_ID_HEADER: Final = "X-Grove-Call-Id"
"""Request header naming the call id to record (optional; a fresh id otherwise). Answered on
every generation with the id the call was recorded under."""
DECISION_HEADER: Final = "X-Grove-Decision"
"""Answer header: ``root`` or ``continuation``."""
PARENT_CALL_ID_HEADER: Final = "X-Grove-Parent-Call-Id"
"""Answer header: the parent call of a continuation."""
ROOT_REASON_HEADER: Final = "X-Grove-Root-Reason"
"""Answer header: why the call is a root (``docs/normalization.md``)."""


def decision_headers(outcome: CallOutcome) -> dict[str, str]:
    """The answer headers of a model call: its call id, its admission decision, its parent (a
    continuation) or its root reason."""
    decision = outcome.decision
    headers = {CALL_ID_HEADER: outcome.call_id, DECISION_HEADER: decision.kind.value}
    if decision.parent_call_id is not None:
        headers[PARENT_CALL_ID_HEADER] = decision.parent_call_id
    if decision.reason is not None:
        headers[ROOT_REASON_HEADER] = decision.reason.value
    return headers
