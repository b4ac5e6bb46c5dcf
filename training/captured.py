"""The captured calls of an attempt as selection sees them, and the rules a selection names.

``CapturedCall`` is the record a selection policy reads for each call of an attempt (built by the
projector from the ledger, ``grove.training.projector.captured_calls``); ``SelectionRule`` names the
rule a ``SelectionError`` reports. Both the evidence matching (``training/evidence.py``) and the
policies and their contract (``training/selection.py``) read them; this module imports neither,
so neither import is a cycle. The two failure reasons that do not count as failures, and the
finish reasons of a complete generation, live here with the record they qualify
(``docs/forest.md``, "Where ``selected`` comes from" and "Failures and drops").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from grove.training.errors import SelectionError
from grove.training.forest import CALL_STATUSES, LENGTH_FINISH_REASONS

__all__ = [
    "COMPLETE_FINISH_REASONS",
    "REJECTED_BY_HARNESS",
    "REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES",
    "CapturedCall",
    "SelectionRule",
]

REQUEST_FINISHED_WITHOUT_STAGED_COORDINATES: Final = "request_finished_without_staged_coordinates"
"""A cancellation recorded after the call's capture committed: the one failure that does not mask
the rollout, when the call is unselected and no call of the attempt is pending."""
REJECTED_BY_HARNESS: Final = "rejected_by_harness"
"""The harness rejected a committed, complete response and resampled: a rejection, not a failure.
The call stays committed; it never masks its rollout, ``returned_history`` never matches it, and
``all_captured`` selects it as an abandoned retry."""

COMPLETE_FINISH_REASONS: Final = frozenset({"stop", "tool_calls"}) | LENGTH_FINISH_REASONS
"""Finish reasons of a complete (or length-limited, still eligible) generation; any other one,
such as ``content_filter``, is an incomplete generation."""


class SelectionRule:
    """The rules a ``SelectionError`` names (its ``rule``)."""

    INVALID_RESULT: Final = "invalid_result"
    MISSING_EVIDENCE: Final = "missing_evidence"
    CONTRADICTORY_EVIDENCE: Final = "contradictory_evidence"
    DUPLICATED_EVIDENCE: Final = "duplicated_evidence"
    AMBIGUOUS_EVIDENCE: Final = "ambiguous_evidence"
    MISSING_TERMINAL: Final = "missing_terminal"
    MISSING_COMPLETION_METADATA: Final = "missing_completion_metadata"
    INVALID_POLICY_RESULT: Final = "invalid_policy_result"
    INVALID_RECORD: Final = "invalid_record"


@dataclass(frozen=True, slots=True)
class CapturedCall:
    """One call of the attempt as the ledger describes it, without tensors (producer: the
    projector, from ``call.intended`` / ``call.committed`` / ``call.failed``; consumer: selection
    policies, including custom ones).

    What the ledger must provide: ``call_id`` and ``parent_id`` (from the intent); ``status`` —
    ``committed`` when a commit event exists, else ``failed`` when a failure event exists, else
    ``pending``; for committed calls ``response_id`` (the served response id),
    ``output_fingerprint`` (``fingerprint_output`` of the output items the gateway returned for
    it) and ``finish_reason``; ``failure_reason`` (the reason code of a ``call.failed`` event,
    also on a committed call that later recorded a failure, such as a rejected response, which
    stays ``committed``). ``None`` means "not recorded".
    """

    call_id: str
    parent_id: str | None
    status: str
    response_id: str | None = None
    output_fingerprint: str | None = None
    finish_reason: str | None = None
    failure_reason: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.call_id, str) or not self.call_id:
            raise SelectionError(
                SelectionRule.INVALID_RECORD,
                f"call_id must be a non-empty string, got {self.call_id!r}",
            )
        if self.status not in CALL_STATUSES:
            raise SelectionError(
                SelectionRule.INVALID_RECORD,
                f"status of call {self.call_id!r} must be one of {', '.join(CALL_STATUSES)}, "
                f"got {self.status!r}",
                call_id=self.call_id,
            )

    @property
    def rejected(self) -> bool:
        """Whether the harness rejected this committed, complete response and resampled."""
        return self.status == "committed" and self.failure_reason == REJECTED_BY_HARNESS
