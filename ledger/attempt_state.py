"""An attempt's state folded from its events: each call's status, the attempt's opening,
admissions, settlement, selection, finalization and cleanup (``grove.ledger.attempt`` records
the events by these rules).

``fold_attempt`` is pure (events in, state out); ``index_call_event`` adds a call event to an
admission index as the fold sees it. A stream only grows, so the state folded from a prefix of
the stream, plus the events after it, is the state folded from the whole stream.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from grove.ledger.admission import AdmissionIndex, CallStatus
from grove.ledger.errors import LedgerError
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptCleaned,
    AttemptOpened,
    AttemptSettled,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)
from grove.ledger.lifecycle import (
    CallFacts,
    LifecycleFacts,
    contradiction_entry,
    lifecycle_violation,
)

__all__ = [
    "AttemptError",
    "AttemptState",
    "CallState",
    "CallStatus",
    "fold_attempt",
    "index_call_event",
]


class AttemptError(LedgerError):
    """A lifecycle rule refused the event; nothing was written."""

    def __init__(self, capture_key: str, rule: str, call_id: str | None = None) -> None:
        self.capture_key = capture_key
        self.call_id = call_id
        where = f"attempt {capture_key}" + (f", call {call_id}" if call_id else "")
        super().__init__(f"{rule} ({where})")


@dataclass(frozen=True)
class CallState:
    """One call of the attempt as the ledger knows it."""

    intended: CallIntended
    status: CallStatus = CallStatus.PENDING
    committed: CallCommitted | None = None
    failure: CallFailed | None = None
    late: bool = False

    @property
    def call_id(self) -> str:
        """The call's id, unique within the attempt."""
        return self.intended.call_id

    @property
    def parent_call_id(self) -> str | None:
        """The parent call's id (None for a root)."""
        return self.intended.parent_call_id


@dataclass(frozen=True)
class AttemptState:
    """An attempt folded from its events; ``version`` is the stream version it reflects.

    ``contradictions`` lists, in stream order, the events that break the lifecycle rules and
    were left out of the state: ``AttemptLog`` never writes them, but a writer that appends
    straight to the store can (an event before the attempt was opened, a call intended,
    committed or failed twice, a commit or failure of a call never intended, a selection of
    calls never intended or a second one, a finalization without a selection or a second one).
    The first event stands; a rollout whose attempt holds any contradiction never trains.
    """

    capture_key: str
    version: int = 0
    opened: AttemptOpened | None = None
    calls: dict[str, CallState] = field(default_factory=dict)
    admissions_closed: bool = False
    settled: AttemptSettled | None = None
    selection: RolloutSelected | None = None
    finalized: RolloutFinalized | None = None
    cleaned_keys: tuple[str, ...] = ()
    contradictions: tuple[str, ...] = ()

    @property
    def pending_call_ids(self) -> tuple[str, ...]:
        """Calls intended but neither committed nor failed, in intent order."""
        return tuple(c.call_id for c in self.calls.values() if c.status is CallStatus.PENDING)

    @property
    def parentable_call_ids(self) -> tuple[str, ...]:
        """Calls that may be parents: committed before the attempt settled."""
        return tuple(
            c.call_id
            for c in self.calls.values()
            if c.status is CallStatus.COMMITTED and not c.late
        )

    @property
    def attempt_token_digest(self) -> str | None:
        """The digest of the attempt's secret its ``attempt.opened`` event recorded; None when
        the attempt was never opened, or was opened before attempts had a secret."""
        return None if self.opened is None else self.opened.attempt_token_digest

    def recorded_opening(self) -> AttemptOpened:
        """The ``attempt.opened`` event, for a reader that only takes opened attempts."""
        if self.opened is None:
            raise AttemptError(self.capture_key, "the attempt was never opened")
        return self.opened

    def recorded_selection(self) -> RolloutSelected:
        """The ``rollout.selected`` event, for a reader that only takes selected attempts."""
        if self.selection is None:
            raise AttemptError(self.capture_key, "the attempt has no recorded selection")
        return self.selection

    def recorded_finalization(self) -> RolloutFinalized:
        """The ``rollout.finalized`` event, for a reader that only takes finalized attempts."""
        if self.finalized is None:
            raise AttemptError(self.capture_key, "the attempt's rollout was never finalized")
        return self.finalized


def _facts(state: AttemptState, event: Event) -> LifecycleFacts:
    call_id = getattr(event, "call_id", None)
    call = state.calls.get(call_id) if isinstance(call_id, str) else None
    return LifecycleFacts(
        opened=state.opened is not None,
        call=None
        if call is None
        else CallFacts(
            parent_call_id=call.parent_call_id,
            committed=call.committed is not None,
            failed=call.status is CallStatus.FAILED,
            has_failure=call.failure is not None,
        ),
        selected=state.selection is not None,
        finalized=state.finalized is not None,
        unknown_selected=tuple(c for c in dict.fromkeys(event.call_ids) if c not in state.calls)
        if isinstance(event, RolloutSelected)
        else (),
    )


def _changes(state: AttemptState, event: Event) -> dict[str, Any]:
    """The fields ``event`` changes in ``state`` (a contradiction changes only the list of them)."""
    calls = state.calls
    why = lifecycle_violation(_facts(state, event), event)
    if why is not None:
        return {"contradictions": (*state.contradictions, contradiction_entry(event, why))}
    if isinstance(event, AttemptOpened):
        return {"opened": event}
    if isinstance(event, CallIntended):
        return {"calls": {**calls, event.call_id: CallState(event)}}
    if isinstance(event, CallCommitted):
        call = calls[event.call_id]
        updated = replace(
            call, status=CallStatus.COMMITTED, committed=event, late=state.settled is not None
        )
        return {"calls": {**calls, event.call_id: updated}}
    if isinstance(event, CallFailed):
        call = calls[event.call_id]
        status = call.status if call.status is CallStatus.COMMITTED else CallStatus.FAILED
        updated = replace(call, status=status, failure=event)
        return {"calls": {**calls, event.call_id: updated}}
    if isinstance(event, AdmissionsClosed):
        return {"admissions_closed": True}
    if isinstance(event, AttemptSettled):
        return {"settled": event, "admissions_closed": True}
    if isinstance(event, RolloutSelected):
        return {"selection": event}
    if isinstance(event, RolloutFinalized):
        return {"finalized": event}
    if isinstance(event, AttemptCleaned):
        return {"cleaned_keys": state.cleaned_keys + event.keys}
    return {}


def fold_attempt(
    capture_key: str, events: Iterable[Event], start: AttemptState | None = None
) -> AttemptState:
    """The attempt's state after ``events`` (its stream in version order), folded onto ``start``."""
    state = start or AttemptState(capture_key)
    for event in events:
        state = replace(state, version=state.version + 1, **_changes(state, event))
    return state


def index_call_event(index: AdmissionIndex, state: AttemptState, event: Event) -> None:
    """Bring an attempt's admission index up to date with ``event`` (``state`` is after it).

    A commit that was not late indexes the call as committed; a failure recorded after a commit
    (a rejected response, say) indexes it as failed, which takes it out of the parents. Pending
    and plainly failed calls are never indexed: they can never be parents. Events the fold left
    out as contradictions (``AttemptState.contradictions``) change nothing. Capture keeps its
    live index with this, and replay rebuilds the recorded one with it.
    """
    if not isinstance(event, CallCommitted | CallFailed):
        return
    call = state.calls.get(event.call_id)
    if call is None or event not in (call.committed, call.failure):
        return
    if isinstance(event, CallCommitted) and not call.late:
        index.add(
            event.replay_summary.candidate(
                event.call_id, CallStatus.COMMITTED, frozenset({event.response_id})
            )
        )
    elif isinstance(event, CallFailed) and call.committed is not None:
        committed = call.committed
        index.add(
            committed.replay_summary.candidate(
                event.call_id, CallStatus.FAILED, frozenset({committed.response_id})
            )
        )
