"""Replay an attempt: fold its events one at a time, and re-run its recorded admission decisions.

Pure: stored events in, plain records out (no database, no blob store, no model). ``grove replay``
reads the stream and prints what :func:`replay_attempt` returns; ``grove replay --verify`` adds
:func:`verify_admissions` and the training-side checks (``grove/tools/replay.py``), all reported as
:class:`DecisionCheck` records.

Admission is re-run the way capture decided it (``capture/lifecycle.py``): each intent's recorded
boundary (``AdmissionDecision.from_payload``) goes through today's ``grove.ledger.admission.decide``
against an index rebuilt from the attempt's events before that intent (committed calls that were
not late, and committed calls that later failed, as failed). Two parts of the live decision cannot
be re-run from the ledger and are taken as recorded: the splice's boundary check, which needs the
request's messages and the tokenizer (a candidate it rooted stays rooted for the recorded reason),
and calls of the same attempt that committed concurrently, between capture's read of the stream
and its intent.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from grove.ledger import admission
from grove.ledger.admission import (
    AdmissionDecision,
    AdmissionError,
    AdmissionIndex,
    DecisionKind,
    Equivalence,
    RootReason,
)
from grove.ledger.attempt import AttemptState, CallStatus, fold_attempt, index_call_event
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
from grove.ledger.store import StoredEvent

__all__ = [
    "SPLICE_ROOT_REASONS",
    "CheckOutcome",
    "DecisionCheck",
    "ReplayStep",
    "StateSummary",
    "compare_fields",
    "describe_event",
    "replay_attempt",
    "state_before",
    "verify_admissions",
]

SPLICE_ROOT_REASONS = frozenset(
    {RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE, RootReason.RENDERED_HISTORY_DIFFERS}
)
"""Root reasons the splice's boundary check records after admission chose a candidate."""


class CheckOutcome(StrEnum):
    """What re-running one recorded decision found."""

    SAME = "same"
    DIFFERS = "differs"
    SKIPPED = "skipped"


@dataclass(frozen=True)
class DecisionCheck:
    """One recorded decision re-run with today's code (producers: :func:`verify_admissions`,
    ``grove.tools.replay``; consumer: ``grove replay --verify``).

    ``decision`` is ``admission``, ``selection``, ``finalization`` or ``publication``;
    ``subject`` what it decided about (a call id, a rollout id, a training step); ``position``
    the ledger position of the recorded decision. ``differences`` has one line per field that
    differs (empty unless ``outcome`` is ``differs``); ``note`` says what was not re-run, or why
    the check was skipped.
    """

    decision: str
    subject: str
    position: int
    outcome: CheckOutcome
    differences: tuple[str, ...] = ()
    note: str = ""

    @classmethod
    def compared(
        cls,
        decision: str,
        subject: str,
        position: int,
        recorded: Mapping[str, Any],
        today: Mapping[str, Any],
        note: str = "",
    ) -> DecisionCheck:
        """The check of ``recorded`` against ``today``: same, or differs field by field."""
        differences = compare_fields(recorded, today)
        outcome = CheckOutcome.DIFFERS if differences else CheckOutcome.SAME
        return cls(decision, subject, position, outcome, differences, note)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "decision": self.decision,
            "subject": self.subject,
            "position": self.position,
            "outcome": self.outcome.value,
            "differences": list(self.differences),
            "note": self.note,
        }


def compare_fields(recorded: Mapping[str, Any], today: Mapping[str, Any]) -> tuple[str, ...]:
    """One line per key whose values differ: ``key: recorded X, today Y`` (recorded order)."""
    keys = [*recorded, *(k for k in today if k not in recorded)]
    return tuple(
        f"{key}: recorded {recorded.get(key)!r}, today {today.get(key)!r}"
        for key in keys
        if recorded.get(key) != today.get(key)
    )


@dataclass(frozen=True)
class StateSummary:
    """What an attempt's state shows after one event: its calls by status and its decisions.

    ``committed`` excludes ``late`` commits (acknowledged after settling: they never train);
    ``failures`` maps every call that recorded a failure to its reason, including committed calls
    the harness later rejected. ``selection`` is None before ``rollout.selected``;
    ``finalization`` None before ``rollout.finalized``, else ``trainable`` or ``masked: REASON``.
    ``contradictions`` are the events the fold left out because they break the lifecycle rules
    (``AttemptState.contradictions``).
    """

    pending: tuple[str, ...]
    committed: tuple[str, ...]
    late: tuple[str, ...]
    failed: tuple[str, ...]
    failures: dict[str, str]
    admissions_closed: bool
    settled: bool
    settle_timed_out: bool
    selection: tuple[str, ...] | None
    finalization: str | None
    paths: tuple[tuple[str, ...], ...]
    cleaned_keys: int
    contradictions: tuple[str, ...] = ()

    @classmethod
    def of(cls, state: AttemptState) -> StateSummary:
        """The summary of ``state``."""
        calls = list(state.calls.values())
        finalized = state.finalized
        finalization = None
        if finalized is not None:
            finalization = (
                "trainable" if finalized.trainable else f"masked: {finalized.masked_reason}"
            )
        return cls(
            pending=state.pending_call_ids,
            committed=tuple(
                c.call_id for c in calls if c.status is CallStatus.COMMITTED and not c.late
            ),
            late=tuple(c.call_id for c in calls if c.late),
            failed=tuple(c.call_id for c in calls if c.status is CallStatus.FAILED),
            failures={c.call_id: c.failure.reason for c in calls if c.failure is not None},
            admissions_closed=state.admissions_closed,
            settled=state.settled is not None,
            settle_timed_out=state.settled is not None and state.settled.timed_out,
            selection=None if state.selection is None else state.selection.call_ids,
            finalization=finalization,
            paths=() if finalized is None else finalized.paths,
            cleaned_keys=len(state.cleaned_keys),
            contradictions=state.contradictions,
        )

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "pending": list(self.pending),
            "committed": list(self.committed),
            "late": list(self.late),
            "failed": list(self.failed),
            "failures": dict(self.failures),
            "admissions_closed": self.admissions_closed,
            "settled": self.settled,
            "settle_timed_out": self.settle_timed_out,
            "selection": None if self.selection is None else list(self.selection),
            "finalization": self.finalization,
            "paths": [list(p) for p in self.paths],
            "cleaned_keys": self.cleaned_keys,
            "contradictions": list(self.contradictions),
        }


@dataclass(frozen=True)
class ReplayStep:
    """One event of the attempt and the state folded up to and including it (producer:
    :func:`replay_attempt`; consumer: ``grove replay``)."""

    position: int
    stream_version: int
    event_type: str
    detail: str
    state: AttemptState = field(repr=False)

    @property
    def summary(self) -> StateSummary:
        """The state after this event, summarized."""
        return StateSummary.of(self.state)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the event and the summarized state after it."""
        return {
            "position": self.position,
            "stream_version": self.stream_version,
            "event_type": self.event_type,
            "detail": self.detail,
            "state": self.summary.as_dict(),
        }


def _ids(call_ids: Sequence[str]) -> str:
    return ", ".join(call_ids) if call_ids else "none"


def describe_event(event: Event, state: AttemptState) -> str:
    """One line saying what ``event`` recorded; ``state`` is the attempt's state after it."""
    if isinstance(event, AttemptOpened):
        mode = "forest" if event.forest_mode else "no forest"
        return (
            f"rollout {event.rollout_id} (index {event.rollout_index}) of group "
            f"{event.prompt_group}; {mode}; selection {event.selection_policy}"
        )
    if isinstance(event, CallIntended):
        if event.decision == DecisionKind.CONTINUATION.value:
            kind = f"continuation of {event.parent_call_id}"
        else:
            kind = f"root ({event.root_reason})"
        return f"{event.call_id}: {kind}, {event.prompt_tokens} prompt tokens"
    if isinstance(event, CallCommitted):
        late = " (late: the attempt had settled)" if state.calls[event.call_id].late else ""
        return (
            f"{event.call_id}: {event.prompt_delta_len} new prompt + {event.generated_len} "
            f"generated tokens, cum_len {event.cum_len}, finish {event.finish_reason}{late}"
        )
    if isinstance(event, CallFailed):
        detail = f" ({event.detail})" if event.detail else ""
        return f"{event.call_id}: {event.reason}{detail}"
    if isinstance(event, AdmissionsClosed):
        return "the harness returned: no new calls"
    if isinstance(event, AttemptSettled):
        if event.timed_out:
            return f"the wait ran out with pending {_ids(event.pending_call_ids)}"
        return "no call pending"
    if isinstance(event, RolloutSelected):
        return (
            f"{event.policy} selected {_ids(event.call_ids)}; terminal "
            f"{event.terminal_response_id}; reward {event.reward:g}"
        )
    if isinstance(event, RolloutFinalized):
        if not event.trainable:
            return f"masked: {event.masked_reason}"
        rows = "; ".join(" > ".join(path) for path in event.paths)
        return f"trainable, {len(event.paths)} rows: {rows}"
    if isinstance(event, AttemptCleaned):
        return f"removed {len(event.keys)} staging blobs"
    return event.type


def replay_attempt(
    capture_key: str, events: Sequence[StoredEvent], until: int | None = None
) -> tuple[ReplayStep, ...]:
    """Fold the attempt's stream event by event; one step per event at positions <= ``until``.

    ``events`` is the attempt's stream in version order (``EventStore.read_stream``).
    """
    steps = []
    state = AttemptState(capture_key)
    for stored in events:
        if until is not None and stored.position > until:
            break
        event = stored.decode()
        before, state = state, fold_attempt(capture_key, [event], state)
        detail = _left_out(before, state) or describe_event(event, state)
        steps.append(
            ReplayStep(stored.position, stored.stream_version, stored.event_type, detail, state)
        )
    return tuple(steps)


def _left_out(before: AttemptState, after: AttemptState) -> str | None:
    """How the fold left the last event out, when it broke a lifecycle rule."""
    if len(after.contradictions) > len(before.contradictions):
        return f"left out, it breaks the lifecycle: {after.contradictions[-1]}"
    return None


def state_before(capture_key: str, events: Sequence[StoredEvent], position: int) -> AttemptState:
    """The attempt's state folded from its events recorded before ``position``."""
    return fold_attempt(capture_key, (s.decode() for s in events if s.position < position))


def _rerun_admission(position: int, intended: CallIntended, index: AdmissionIndex) -> DecisionCheck:
    subject = intended.call_id
    if not intended.admission:
        return DecisionCheck(
            "admission",
            subject,
            position,
            CheckOutcome.SKIPPED,
            note="the intent carries no admission record, so there is nothing to re-run",
        )
    recorded = AdmissionDecision.from_payload(intended.admission)
    try:
        today = admission.decide(
            recorded.boundary,
            render_options_digest=recorded.render_options_digest,
            index=index,
            tool_content_equivalence_proven=Equivalence.TOOL_CONTENT_NULL_EMPTY
            in recorded.equivalences,
        )
    except AdmissionError as error:
        return DecisionCheck(
            "admission",
            subject,
            position,
            CheckOutcome.DIFFERS,
            (f"recorded {recorded.kind.value}; today admission refuses the request: {error}",),
        )
    note = ""
    if recorded.reason in SPLICE_ROOT_REASONS and today.kind is DecisionKind.CONTINUATION:
        today = today.rooted(recorded.reason)
        note = f"the splice's boundary check is taken as recorded ({recorded.reason.value})"
    return DecisionCheck.compared(
        "admission", subject, position, recorded.as_payload(), today.as_payload(), note
    )


def verify_admissions(
    capture_key: str, events: Sequence[StoredEvent], until: int | None = None
) -> tuple[DecisionCheck, ...]:
    """Re-run every intent's admission decision (at positions <= ``until``) with today's
    ``grove.ledger.admission.decide``, against the index its attempt had just before the intent."""
    checks = []
    state = AttemptState(capture_key)
    index = AdmissionIndex()
    for stored in events:
        if until is not None and stored.position > until:
            break
        event = stored.decode()
        before, state = state, fold_attempt(capture_key, [event], state)
        left_out = _left_out(before, state)
        if left_out is not None:
            if isinstance(event, CallIntended):
                checks.append(
                    DecisionCheck(
                        "admission",
                        event.call_id,
                        stored.position,
                        CheckOutcome.SKIPPED,
                        note=left_out,
                    )
                )
            continue
        if isinstance(event, CallIntended):
            checks.append(_rerun_admission(stored.position, event, index))
        if isinstance(event, AttemptOpened) and event.fork_from is not None:
            index.add(event.fork_from.candidate())  # a fork's calls may continue its source
        index_call_event(index, state, event)
    return tuple(checks)
