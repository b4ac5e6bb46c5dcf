"""The attempt lifecycle's rules for one event, on plain facts: shared by the fold and the SQL.

``fold_attempt`` (``ledger/attempt.py``) reads the facts from its state; the projection tables
(``ledger/inline_fold.py``) read them from their rows. Both record an event the rules leave out
as a contradiction with ``contradiction_entry``'s words, so the lineage views and the fold agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from grove.ledger.events import (
    AdmissionsClosed,
    AttemptOpened,
    AttemptSettled,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)

__all__ = [
    "ATTEMPT_EVENTS",
    "NEVER_OPENED",
    "CallFacts",
    "LifecycleFacts",
    "contradiction_entry",
    "lifecycle_violation",
]


@dataclass(frozen=True)
class CallFacts:
    """What the lifecycle rules know of one intended call (``LifecycleFacts.call``)."""

    parent_call_id: str | None
    committed: bool
    failed: bool
    has_failure: bool


@dataclass(frozen=True)
class LifecycleFacts:
    """What the lifecycle rules look at to judge one event: the fold reads them from its state,
    the SQL projections (``ledger/inline_fold.py``) from their rows, so both apply one rule set."""

    opened: bool
    call: CallFacts | None = None
    selected: bool = False
    finalized: bool = False
    unknown_selected: tuple[str, ...] = ()
    """The calls a ``rollout.selected`` names that the attempt never intended."""


ATTEMPT_EVENTS = (
    CallIntended,
    CallCommitted,
    CallFailed,
    AdmissionsClosed,
    AttemptSettled,
    RolloutSelected,
    RolloutFinalized,
)
"""The events that belong after an ``attempt.opened`` (``attempt.cleaned`` may record an
attempt's removed keys whether or not it was ever opened)."""


NEVER_OPENED = "the attempt was never opened"
"""Why every attempt event of a stream never opened is left out."""


def lifecycle_violation(facts: LifecycleFacts, event: Event) -> str | None:
    """Why ``event`` cannot follow an attempt described by ``facts``; None when it can."""
    if isinstance(event, AttemptOpened):
        return "the attempt is already open" if facts.opened else None
    if isinstance(event, ATTEMPT_EVENTS) and not facts.opened:
        return NEVER_OPENED
    call = facts.call
    if isinstance(event, CallIntended):
        return "the call is already intended" if call is not None else None
    if isinstance(event, CallCommitted | CallFailed):
        if call is None:
            return "the call was never intended"
        if call.has_failure and isinstance(event, CallFailed):
            return "the call already failed"
        if isinstance(event, CallCommitted):
            if call.committed:
                return "the call is already committed"
            if call.failed:
                return "the call already failed"
            if event.parent_call_id != call.parent_call_id:
                return f"the intent names parent {call.parent_call_id}"
        return None
    if isinstance(event, RolloutSelected):
        if facts.selected:
            return "the rollout is already selected"
        if facts.unknown_selected:
            return f"the selection names calls never intended: {', '.join(facts.unknown_selected)}"
        return None
    if isinstance(event, RolloutFinalized):
        if not facts.selected:
            return "the rollout was never selected"
        return "the rollout is already finalized" if facts.finalized else None
    return None


def contradiction_entry(event: Event, why: str) -> str:
    """How a contradiction is recorded: the event's type, its call when it names one, and why."""
    subject = getattr(event, "call_id", None)
    return event.type + (f" of call {subject}" if subject else "") + f": {why}"
