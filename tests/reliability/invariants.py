"""What must hold after any number of kills, checked on the ledger and the checkpoints.

``LedgerView.read`` takes one consistent look at the whole ledger; each check returns the
problems it found (an empty list when the rule holds), so a failing test names every breach:

- ``lost_acknowledgements``: every event a client saw acknowledged is recorded;
- ``repeated_intents``: each call id is intended once per attempt;
- ``version_gaps``: each stream's versions run 1..n (no torn or half-written append);
- ``publication_problems``: steps run 0..n-1, each rollout trains in one step at most, and whole
  (its row ids are exactly its finalized paths), masked rollouts contribute no row;
- ``rollout_outcomes``: how every attempt ended, and the breaches: an attempt with a pending or
  failed selected call that trains, a selected attempt never finalized;
- ``checkpoint_problems``: every checkpoint verifies and its projector position is the one its
  step's ``batch.published`` records.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from grove.ledger.attempt import AttemptState, fold_attempt
from grove.ledger.events import BatchPublished, LedgerPosition
from grove.ledger.store import EventStore, StoredEvent
from grove.training.checkpoint import latest_checkpoint, verify_checkpoint

from .harness import Ack

__all__ = [
    "LedgerView",
    "checkpoint_problems",
    "lost_acknowledgements",
    "publication_problems",
    "repeated_intents",
    "rollout_outcomes",
    "version_gaps",
]


@dataclass(frozen=True)
class LedgerView:
    """Every event of the ledger, each attempt folded, and the training stream's batches."""

    events: tuple[StoredEvent, ...]
    attempts: dict[str, AttemptState]
    batches: tuple[BatchPublished, ...]

    @classmethod
    def read(cls, store: EventStore, training_stream: str = "training") -> LedgerView:
        """Read the whole ledger with the gap-free reader (waiting, on PostgreSQL, until no
        transaction elsewhere holds it back)."""
        deadline = time.monotonic() + 60
        while True:
            events: list[StoredEvent] = []
            mark = LedgerPosition(position=0)
            while (batch := store.read_after(mark, 5000)).events:
                events += batch.events
                mark = batch.mark
            if len(events) == store.count() or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        streams: dict[str, list[StoredEvent]] = defaultdict(list)
        for event in events:
            streams[event.stream_id].append(event)
        training = streams.pop(training_stream, [])
        attempts = {
            key: fold_attempt(key, (e.decode() for e in stream)) for key, stream in streams.items()
        }
        batches = tuple(e.decode() for e in training)
        assert all(isinstance(b, BatchPublished) for b in batches)
        return cls(tuple(events), attempts, batches)  # type: ignore[arg-type]


def lost_acknowledgements(view: LedgerView, acks: Iterable[Ack]) -> list[Ack]:
    """The acknowledged events the ledger does not hold."""
    return [ack for ack in acks if not _recorded(view, ack)]


def _recorded(view: LedgerView, ack: Ack) -> bool:
    state = view.attempts.get(ack.capture_key)
    if state is None:
        return False
    if ack.event_type == "attempt.opened":
        return state.opened is not None
    if ack.event_type == "rollout.selected":
        return state.selection is not None
    call = state.calls.get(ack.call_id or "")
    if call is None:
        return False
    if ack.event_type == "call.failed":
        return call.failure is not None
    return call.committed is not None and call.committed.response_id == ack.response_id


def repeated_intents(view: LedgerView) -> list[tuple[str, str]]:
    """``(capture key, call id)`` of every call intended more than once."""
    intents = Counter(
        (e.stream_id, e.payload["call_id"]) for e in view.events if e.event_type == "call.intended"
    )
    return sorted(key for key, count in intents.items() if count > 1)


def version_gaps(view: LedgerView) -> list[str]:
    """Streams whose versions are not exactly 1..n in position order."""
    versions: dict[str, list[int]] = defaultdict(list)
    for event in view.events:
        versions[event.stream_id].append(event.stream_version)
    return sorted(s for s, v in versions.items() if v != list(range(1, len(v) + 1)))


def publication_problems(view: LedgerView) -> list[str]:
    """Breaches of exactly-once, whole-rollout publication."""
    problems = []
    if [b.step for b in view.batches] != list(range(len(view.batches))):
        problems.append(f"steps are not 0..n-1: {[b.step for b in view.batches]}")
    finalized: dict[str, list[AttemptState]] = defaultdict(list)
    for state in view.attempts.values():
        if state.finalized is not None:
            finalized[state.finalized.rollout_id].append(state)
    published = Counter(r for b in view.batches for r in b.rollout_ids)
    problems += [f"rollout {r} published in {n} steps" for r, n in published.items() if n > 1]
    for batch in view.batches:
        for rollout_id in batch.rollout_ids:
            decided = finalized.get(rollout_id, [])
            if len(decided) != 1:
                problems.append(f"rollout {rollout_id} has {len(decided)} finalized attempts")
                continue
            decision = decided[0].finalized
            assert decision is not None
            rows = [r for r in batch.row_ids if r.rsplit("/", 1)[0] == rollout_id]
            expected = [f"{rollout_id}/{i}" for i in range(len(decision.paths))]
            if rows != (expected if decision.trainable else []):
                problems.append(f"rollout {rollout_id} trains rows {rows}, expected {expected}")
    return problems


def rollout_outcomes(view: LedgerView) -> tuple[Counter[str], list[str]]:
    """How each attempt ended (``trainable``, ``masked:REASON``, ``never_selected``) and the
    breaches: an incomplete attempt that trains, a selected attempt never finalized."""
    outcomes: Counter[str] = Counter()
    problems = []
    for key, state in view.attempts.items():
        if state.selection is None:
            outcomes["never_selected"] += 1
            continue
        if state.finalized is None:
            problems.append(f"attempt {key} was selected but never finalized")
            continue
        if not state.finalized.trainable:
            outcomes[f"masked:{state.finalized.masked_reason}"] += 1
            continue
        outcomes["trainable"] += 1
        assert state.settled is not None
        selected = [state.calls.get(c) for c in state.selection.call_ids]
        if state.settled.pending_call_ids or any(
            c is None or c.committed is None or c.late or c.failure is not None for c in selected
        ):
            problems.append(f"attempt {key} is incomplete but trainable")
    return outcomes, problems


def checkpoint_problems(directory: Path, view: LedgerView) -> list[str]:
    """Breaches of checkpoint integrity and of the projector position each one records."""
    problems = []
    steps = sorted(int(p.name[5:]) for p in directory.glob("step_*") if p.name[5:].isdigit())
    for step in steps:
        path = directory / f"step_{step:08d}"
        metadata = verify_checkpoint(path)
        if step > len(view.batches):
            problems.append(f"checkpoint {path.name} is past the {len(view.batches)} steps")
            continue
        mark = view.batches[step - 1].ledger_position
        position = dict(metadata.projector_position)
        expected = {
            "published_step": step - 1,
            "transaction_id": mark.transaction_id,
            "position": mark.position,
        }
        if position != expected:
            problems.append(f"checkpoint {path.name} records {position}, expected {expected}")
    latest = latest_checkpoint(directory)
    if steps and (latest is None or latest.name != f"step_{steps[-1]:08d}"):
        problems.append(f"the latest complete checkpoint is {latest}, not step {steps[-1]}")
    return problems
