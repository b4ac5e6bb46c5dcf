"""The attempt lifecycle: its state folded from events, and the rules for recording the next one.

An attempt is one stream (its capture key). Calls are *intended* before inference (unique per call
id), then *committed* or *failed*; an intent with neither is pending. After the harness returns,
admissions close (later intents are refused) and the attempt *settles*: pending calls are awaited
up to a limit; a commit recorded after settling is *late* and never becomes a parent or trains.
A failure is final for a pending call; a failure recorded after a commit keeps the call committed
and records the reason (e.g. ``request_finished_without_staged_coordinates``).

``fold_attempt`` is pure (events in, state out; ``ledger/attempt_state.py``, whose names this
module exports too). ``AttemptLog`` records events with these rules,
using optimistic concurrency so independent calls of one attempt may be recorded concurrently, and
deterministic event ids so a retried write is idempotent.

``AttemptLog`` keeps the last state it knows of each attempt (a bounded cache) and appends from it
with that state's version as the expected one, without reading the stream first: the store
refuses the append (``WrongExpectedVersion``) when another writer got in between, and only then
is the state brought up to date, by reading the events after its version, and checked again.
A rule that refuses an event on the held state is checked again on a state just read before the
refusal stands, so a refusal never rests on a stale state. ``load`` and ``refresh`` read only the
events after the held state too: a stream only grows, so the state folded from its prefix plus
the events after it is the state folded from the whole stream.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from grove.ledger.admission import CallStatus
from grove.ledger.attempt_state import (
    AttemptError,
    AttemptState,
    CallState,
    fold_attempt,
    index_call_event,
)
from grove.ledger.errors import EventIdConflict, WrongExpectedVersion
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
from grove.ledger.store import ANY_VERSION, EventStore, NewEvent, validate_stream_id

__all__ = [
    "AttemptError",
    "AttemptLog",
    "AttemptState",
    "CallState",
    "CallStatus",
    "StaleAttemptState",
    "fold_attempt",
    "index_call_event",
]

DEFAULT_SETTLE_TIMEOUT_S = 300.0
DEFAULT_CACHED_ATTEMPTS = 4096
_ALREADY = object()  # a check's answer: this exact event is already recorded
Check = Callable[["AttemptState"], object]


class StaleAttemptState(AttemptError):
    """An intent planned against a state of the attempt that is no longer its latest (another
    writer appended since): nothing was written; read the attempt again, plan again, retry."""

    def __init__(self, capture_key: str, call_id: str, planned: int, actual: int) -> None:
        super().__init__(
            capture_key,
            f"the call was planned at version {planned} of the attempt, which is at {actual} "
            "now: read it again and plan again",
            call_id,
        )
        self.planned = planned
        self.actual = actual


class AttemptLog:
    """Records an attempt's lifecycle events in the ledger, enforcing the lifecycle rules.

    Safe to share between threads. ``cached_attempts`` bounds the states it holds (the least
    recently used are dropped, and read again from the ledger when needed).
    """

    def __init__(
        self,
        store: EventStore,
        *,
        retries: int = 50,
        cached_attempts: int = DEFAULT_CACHED_ATTEMPTS,
    ) -> None:
        self.store = store
        self.retries = retries
        self.cached_attempts = cached_attempts
        self._held: OrderedDict[str, AttemptState] = OrderedDict()
        self._lock = threading.Lock()

    def load(self, capture_key: str) -> AttemptState:
        """The attempt's current state (read from the ledger: the events after the held state)."""
        return self.refresh(self._hold(capture_key) or AttemptState(capture_key))

    def refresh(self, state: AttemptState) -> AttemptState:
        """``state`` brought up to date by reading only the events after its version."""
        stored = self.store.read_stream(state.capture_key, after_version=state.version)
        return self._keep(fold_attempt(state.capture_key, (s.decode() for s in stored), state))

    def known_version(self, capture_key: str) -> int | None:
        """The version of the latest state this log holds of the attempt (its own appends
        included), without reading; None when it holds none."""
        state = self._hold(capture_key)
        return None if state is None else state.version

    def held(self, capture_key: str) -> AttemptState | None:
        """The latest state this log knows of the attempt (its own appends included), without
        reading; None when it holds none."""
        return self._hold(capture_key)

    def keep(self, state: AttemptState) -> None:
        """Hold ``state``, folded by the caller from this log's store, as the latest this log
        knows of its attempt, unless it holds a later one: its next append expects that
        version, without reading first."""
        self._keep(state)

    def _hold(self, capture_key: str) -> AttemptState | None:
        """The latest state this log knows of the attempt, without reading; None if none."""
        with self._lock:
            state = self._held.get(capture_key)
            if state is not None:
                self._held.move_to_end(capture_key)
            return state

    def _keep(self, state: AttemptState) -> AttemptState:
        """Hold ``state`` unless a later one is held; returns ``state``."""
        with self._lock:
            held = self._held.get(state.capture_key)
            if held is None or held.version <= state.version:
                self._held[state.capture_key] = state
            self._held.move_to_end(state.capture_key)
            while len(self._held) > self.cached_attempts:
                self._held.popitem(last=False)
        return state

    def _record(
        self,
        capture_key: str,
        event_id: str,
        event: Event,
        check: Check,
        assumed: AttemptState | None = None,
    ) -> int | None:
        """Append ``event`` if ``check(state)`` passes, retrying when another writer got in first.

        The first try appends from the held state (or, when none is held, from ``assumed``:
        what the caller expects of an attempt it has not read), without reading; a conflict, or
        a refusal by ``check`` on a state not read by this call, reads the events after it and
        tries again.
        When ``check`` says the event is already recorded, the append is an idempotent retry: the
        same event id with the same payload is accepted, anything else is ``EventIdConflict``.
        Returns the stream's version after this call appended the event, None when it was
        already recorded.
        """
        validate_stream_id(capture_key)
        state, read = self._hold(capture_key) or assumed, False
        if state is None:
            state, read = self.load(capture_key), True
        for _ in range(self.retries):
            try:
                verdict = check(state)
            except AttemptError:
                if read:
                    raise
                state, read = self.refresh(state), True
                continue
            expected = ANY_VERSION if verdict is _ALREADY else state.version
            try:
                result = self.store.append(capture_key, [NewEvent(event, event_id)], expected)
            except WrongExpectedVersion as conflict:
                # A stream never shrinks; one that did (a ledger restored from a backup under a
                # running process) is read again from its start.
                start = state if conflict.actual >= state.version else AttemptState(capture_key)
                state, read = self.refresh(start), True
                continue
            if not result.duplicate and expected != ANY_VERSION:
                self._keep(fold_attempt(capture_key, [event], state))
            return None if result.duplicate else result.stream_version
        raise AttemptError(
            capture_key, f"gave up recording {event.type} after {self.retries} races"
        )

    def open(self, opened: AttemptOpened) -> int | None:
        """Start the attempt (idempotent for the same payload). Returns the stream's version
        after this call appended the event, None when it was already recorded."""

        def check(state: AttemptState) -> object:
            if state.opened is not None:
                return _ALREADY
            if state.version:
                raise AttemptError(opened.capture_key, "the stream already holds other events")
            return None

        # A new attempt's stream is empty: append at version 0 without reading first (a stream
        # that holds events fails the version check, and is then read and checked).
        key = opened.capture_key
        return self._record(key, f"{key}:opened", opened, check, assumed=AttemptState(key))

    def intend(
        self, capture_key: str, intended: CallIntended, *, at: AttemptState | None = None
    ) -> bool:
        """Record a call's intent before inference; refused when closed, duplicated or orphaned.

        Returns True when this call recorded the intent, False when the identical intent was
        already recorded (an idempotent retry): only the caller that recorded it may infer.
        ``at``: the state the call was planned against; the intent is appended only if the
        attempt is still at that version, else ``StaleAttemptState`` (nothing written), never
        appended after reading what came since: a plan made against a stale state fails.
        """
        call_id = intended.call_id

        def check(state: AttemptState) -> object:
            if state.opened is None:
                raise AttemptError(capture_key, "unknown attempt: open it first", call_id)
            if call_id in state.calls:
                return _ALREADY
            if state.admissions_closed:
                raise AttemptError(
                    capture_key, "admissions are closed: the harness already returned", call_id
                )
            _check_fork_call(capture_key, state, intended)
            parent = intended.parent_call_id
            if intended.source_capture_key is not None:
                return None  # the fork's source, checked above
            if parent is not None and parent not in state.parentable_call_ids:
                raise AttemptError(
                    capture_key,
                    f"parent {parent} is not a committed call of this attempt "
                    "(pending, failed, late and foreign calls are never parents)",
                    call_id,
                )
            return None

        event_id = f"{capture_key}:{call_id}:intended"
        if at is None:
            return self._record(capture_key, event_id, intended, check) is not None
        expected = ANY_VERSION if check(at) is _ALREADY else at.version
        try:
            result = self.store.append(capture_key, [NewEvent(intended, event_id)], expected)
        except WrongExpectedVersion as conflict:
            raise StaleAttemptState(capture_key, call_id, at.version, conflict.actual) from None
        if result.duplicate:
            return False
        self._keep(fold_attempt(capture_key, [intended], at))
        return True

    def commit(self, capture_key: str, committed: CallCommitted) -> int | None:
        """Acknowledge a call whose blob is stored; late when the attempt already settled.
        Returns the stream's version after this append, None when it was already recorded."""
        call_id = committed.call_id

        def check(state: AttemptState) -> object:
            call = state.calls.get(call_id)
            if call is None:
                raise AttemptError(capture_key, "commit of a call that was never intended", call_id)
            if call.status is CallStatus.COMMITTED:
                return _ALREADY
            if call.status is CallStatus.FAILED:
                raise AttemptError(
                    capture_key, "the call already failed; its late write stays an orphan", call_id
                )
            source = call.intended.source_capture_key
            if (committed.parent_call_id, committed.source_capture_key) != (
                call.parent_call_id,
                source,
            ):
                raise AttemptError(
                    capture_key,
                    f"commit names parent {committed.parent_call_id} of "
                    f"{committed.source_capture_key or 'this attempt'}, the intent "
                    f"{call.parent_call_id} of {source or 'this attempt'}",
                    call_id,
                )
            return None

        return self._record(capture_key, f"{capture_key}:{call_id}:committed", committed, check)

    def fail(self, capture_key: str, failed: CallFailed) -> None:
        """Record that a call ended without a usable capture (or why its request ended)."""
        call_id = failed.call_id

        def check(state: AttemptState) -> object:
            call = state.calls.get(call_id)
            if call is None:
                raise AttemptError(
                    capture_key, "failure of a call that was never intended", call_id
                )
            return _ALREADY if call.failure is not None else None

        self._record(capture_key, f"{capture_key}:{call_id}:failed", failed, check)

    def close_admissions(self, capture_key: str) -> None:
        """The harness returned: refuse later intents (idempotent)."""

        def check(state: AttemptState) -> object:
            if state.opened is None:
                raise AttemptError(capture_key, "unknown attempt: open it first")
            return _ALREADY if state.admissions_closed else None

        self._record(capture_key, f"{capture_key}:admissions_closed", AdmissionsClosed(), check)

    def settle(
        self,
        capture_key: str,
        timeout_s: float = DEFAULT_SETTLE_TIMEOUT_S,
        poll_s: float = 0.05,
    ) -> AttemptState:
        """Close admissions, wait for pending calls up to ``timeout_s``, record the outcome.

        An attempt with nothing pending closes and settles in one append (one commit, no read
        when this log holds its latest state); otherwise step by step: close, wait, settle.
        """
        settled = self._settle_at_once(capture_key)
        if settled is not None:
            return settled
        self.close_admissions(capture_key)
        deadline = time.monotonic() + timeout_s
        state = self.load(capture_key)
        while state.pending_call_ids and time.monotonic() < deadline and state.settled is None:
            time.sleep(poll_s)
            state = self.load(capture_key)
        if state.settled is None:
            pending = state.pending_call_ids
            outcome = AttemptSettled(pending_call_ids=pending, timed_out=bool(pending))
            self._record(
                capture_key,
                f"{capture_key}:settled",
                outcome,
                lambda s: _ALREADY if s.settled is not None else None,
            )
        return self.load(capture_key)

    def settle_selecting(
        self, capture_key: str, selected: RolloutSelected, *, at: AttemptState
    ) -> AttemptState | None:
        """Close admissions, settle and record ``selected`` in one append (one commit) at the
        version of ``at``, the state the selection was made from, when ``at`` is opened,
        unsettled, unselected, has nothing pending and holds every call ``selected`` names: the
        state after them. None, with nothing written, otherwise or when another writer appended
        since: the caller settles and selects step by step (``settle``, ``select``)."""
        if any(call_id not in at.calls for call_id in selected.call_ids):
            return None
        return self._settle_at_once(capture_key, at, selected)

    def _settle_at_once(
        self,
        capture_key: str,
        state: AttemptState | None = None,
        selected: RolloutSelected | None = None,
    ) -> AttemptState | None:
        """Append ``attempt.admissions_closed`` (unless recorded) and ``attempt.settled`` (and
        ``selected``) together at the version of ``state`` (default: the state this log holds,
        read when it holds none), when that state is opened, unsettled, unselected and has no
        pending call: the state after them. None when it does not hold, or another writer
        appended since (nothing written): the caller goes step by step, deciding on a state it
        reads. The events and their ids are those the steps would record, so a retry of either
        way is idempotent."""
        state = state or self._hold(capture_key) or self.load(capture_key)
        if (
            state.opened is None
            or state.settled is not None
            or state.selection is not None
            or state.pending_call_ids
        ):
            return None
        events: list[Event] = [] if state.admissions_closed else [AdmissionsClosed()]
        events.append(AttemptSettled(pending_call_ids=(), timed_out=False))
        if selected is not None:
            events.append(selected)
        ids = {AdmissionsClosed: "admissions_closed", AttemptSettled: "settled"}
        ids[RolloutSelected] = "selected"
        appended = [NewEvent(e, f"{capture_key}:{ids[type(e)]}") for e in events]
        try:
            result = self.store.append(capture_key, appended, state.version)
        except (WrongExpectedVersion, EventIdConflict):
            return None  # another writer appended since (some of these events, perhaps)
        if result.duplicate:
            return None
        return self._keep(fold_attempt(capture_key, events, state))

    def select(self, capture_key: str, selected: RolloutSelected) -> None:
        """Record the selection policy's result (once per attempt)."""

        def check(state: AttemptState) -> object:
            if not state.admissions_closed:
                raise AttemptError(capture_key, "select after the harness returned (close first)")
            unknown = [c for c in selected.call_ids if c not in state.calls]
            if unknown:
                raise AttemptError(capture_key, f"selection names unknown calls {unknown}")
            return _ALREADY if state.selection is not None else None

        self._record(capture_key, f"{capture_key}:selected", selected, check)

    def finalize(self, capture_key: str, finalized: RolloutFinalized) -> None:
        """Record the projector's decision for the attempt (once)."""

        def check(state: AttemptState) -> object:
            if state.selection is None:
                raise AttemptError(capture_key, "finalize needs a recorded selection")
            return _ALREADY if state.finalized is not None else None

        self._record(capture_key, f"{capture_key}:finalized", finalized, check)

    def cleaned(self, capture_key: str, cleaned: AttemptCleaned) -> None:
        """Record that exactly these staging keys were removed."""
        self.store.append(capture_key, [cleaned])


def _check_fork_call(capture_key: str, state: AttemptState, intended: CallIntended) -> None:
    """Refuse a call that names a parent in another attempt other than the attempt's fork
    source, or that reuses the source call's id in a fork (``docs/fork.md``)."""
    assert state.opened is not None  # checked by the caller
    fork, call_id = state.opened.fork_from, intended.call_id
    if fork is not None and call_id == fork.source_call_id:
        raise AttemptError(
            capture_key,
            f"a fork's call ids must differ from its source call's: {call_id!r} is the call "
            f"of {fork.source_capture_key!r} this attempt forks; send another call id",
            call_id,
        )
    source = intended.source_capture_key
    if source is None:
        return
    if fork is None or (source, intended.parent_call_id) != (
        fork.source_capture_key,
        fork.source_call_id,
    ):
        forked = "none" if fork is None else f"{fork.source_call_id} of {fork.source_capture_key}"
        raise AttemptError(
            capture_key,
            f"a parent in another attempt must be the attempt's fork source: got "
            f"{intended.parent_call_id} of {source}, the fork source is {forked}",
            call_id,
        )
