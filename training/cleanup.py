"""Staging cleanup: which of an attempt's blobs may go, and when (``docs/storage.md``, "Cleanup").

An attempt's partition ``staging/{capture_key}/`` holds one blob per committed call, maybe blobs
of calls whose writer may still be writing, and maybe blobs no event names. Once the projector's
decision on the attempt is final, training needs only the selected calls of a published,
trainable rollout: a restarted trainer rebuilds the published step from those blobs, and
``grove replay --verify`` and ``grove show`` read them. The rule (``plan_cleanup``, pure):

- **final**: finalized masked (no row of it ever trains), finalized in a prompt group dropped at
  a published step (``batch.published`` names it among ``dropped_rollout_ids``: it never trains
  either), or finalized trainable and published (``batch.published`` names its rollout). A
  trainable rollout neither published nor dropped, and an attempt not yet settled, selected and
  finalized, keep every blob they name.
- **kept**: the selected calls' blobs of a published, trainable rollout. Nothing else is kept.
- **removed at once** (of a final attempt): every other blob a ``call.committed`` names — rejected
  resamples, abandoned branches, every call of a masked or dropped rollout, commits recorded
  after the attempt settled (late) — since its writer is done; and the partition's **orphans**,
  stored keys that no event names and no waiting call may still write.
- **waiting**: the keys of calls that are pending, or failed without a commit (a failure does not
  acknowledge a worker's writes). Only the attempt's **teardown** removes them, once it settled
  ``window_s`` ago (``token_capture.pending_call_timeout_s``; at once when it has no such call).
  A write after teardown is an orphan for the next collection.

The I/O is ``clean_attempt``: list the partition, read the attempt's stream, apply the plan with
``grove.storage.cleanup``'s exact deletes (pending keys refused) or whole-partition teardown, then
record ``attempt.cleaned`` with exactly the keys removed. ``clean_step`` runs it on the attempts
of a step ``grove train`` just trained; ``collect_garbage`` (``grove gc``) on every partition in
the store, orphans of attempts the ledger does not know included.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from grove.ledger.attempt import AttemptLog, AttemptState, CallStatus, fold_attempt
from grove.ledger.events import AttemptCleaned, AttemptSettled, BatchPublished, LedgerPosition
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import BlobStore, StorageUnavailableError, capture_key_of, staging_key
from grove.storage.cleanup import blob_sizes, delete_blobs, teardown_partition
from grove.storage.keys import STAGING, staging_prefix
from grove.training.projector import PublishedBatch

__all__ = [
    "AttemptCleanup",
    "CleanupPlan",
    "CleanupReport",
    "clean_attempt",
    "clean_step",
    "collect_garbage",
    "plan_cleanup",
    "published_rollouts",
]

logger = logging.getLogger(__name__)

_MASKED = "masked"  # CleanupPlan.final: finalized masked, no row of it ever trains
_PUBLISHED = "published"  # CleanupPlan.final: finalized trainable, and published
_DROPPED = "dropped"  # CleanupPlan.final: finalized in a prompt group dropped at a published step


@dataclass(frozen=True)
class CleanupPlan:
    """What may happen to one attempt's staging partition now (``plan_cleanup``).

    ``final`` is why the attempt's decision is final (``"masked"``, ``"published"``), or None
    when it is not. ``remove`` are the stored keys to delete now, ``orphans`` those of them no
    event names; ``keep`` the stored selected keys of a published, trainable rollout;
    ``waiting`` the stored keys of calls whose writer may still write, left for teardown.
    ``teardown`` is whether the attempt is past its wait (``waiting`` is then empty: its keys
    are in ``remove``). Every key is stored; ``remove``, ``keep`` and ``waiting`` are sorted and
    disjoint.
    """

    capture_key: str
    final: str | None
    remove: tuple[str, ...]
    orphans: tuple[str, ...]
    keep: tuple[str, ...]
    waiting: tuple[str, ...]
    teardown: bool


def _waiting_keys(state: AttemptState) -> set[str]:
    """The keys of calls whose writer may still write: pending, or failed without a commit."""
    return {
        staging_key(state.capture_key, c.call_id)
        for c in state.calls.values()
        if c.committed is None and c.status in (CallStatus.PENDING, CallStatus.FAILED)
    }


def _final(state: AttemptState, published: bool, dropped: bool) -> str | None:
    """Why the attempt's decision is final, or None (not settled, selected and finalized; or
    trainable and neither published nor dropped)."""
    if state.settled is None or state.selection is None or state.finalized is None:
        return None
    if not state.finalized.trainable:
        return _MASKED
    if dropped:
        return _DROPPED
    return _PUBLISHED if published else None


def plan_cleanup(
    state: AttemptState,
    stored: Iterable[str],
    *,
    published: bool,
    settled_for_s: float | None,
    window_s: float,
    dropped: bool = False,
) -> CleanupPlan:
    """Which of ``stored`` (the keys listed under the attempt's partition) may go now.

    ``published``: a ``batch.published`` names the attempt's rollout; ``dropped``: one names it
    among the rollouts of the prompt groups it dropped. ``settled_for_s``: seconds
    since ``attempt.settled`` was recorded (None: not settled). ``window_s``: how long a settled
    attempt's waiting calls keep their blobs. An attempt that is not final loses only orphans.
    """
    stored_keys = set(stored)
    named = {c.call_id: c.committed.blob_key for c in state.calls.values() if c.committed}
    named_keys = set(named.values())
    waiting = _waiting_keys(state) - named_keys
    orphans = stored_keys - named_keys - waiting
    final = _final(state, published, dropped)
    keep: set[str] = set()
    remove = set(orphans)
    teardown = False
    if final is not None:
        if final == _PUBLISHED:
            selected = state.recorded_selection().call_ids
            keep = {named[c] for c in selected if c in named} & stored_keys
        remove |= (named_keys & stored_keys) - keep
        settled_for = settled_for_s if settled_for_s is not None else -1.0
        teardown = not waiting or settled_for >= window_s
        if teardown:
            remove |= stored_keys & waiting
    return CleanupPlan(
        state.capture_key,
        final,
        remove=tuple(sorted(remove)),
        orphans=tuple(sorted(orphans)),
        keep=tuple(sorted(keep)),
        waiting=tuple(sorted(stored_keys & waiting - remove)),
        teardown=teardown,
    )


@dataclass(frozen=True)
class AttemptCleanup:
    """What ``clean_attempt`` did (in a dry run: would do) to one attempt's partition: its plan,
    the bytes of ``plan.remove``, and whether ``attempt.cleaned`` was recorded."""

    plan: CleanupPlan
    removed_bytes: int
    recorded: bool


def _settled_for_s(events: Sequence[StoredEvent], now: datetime) -> float | None:
    """Seconds since the attempt's first ``attempt.settled`` was recorded (None: not settled)."""
    settled = next((e for e in events if e.event_type == AttemptSettled.type), None)
    if settled is None:
        return None
    at = settled.recorded_at
    if at.tzinfo is None:  # SQLite keeps UTC without a zone
        at = at.replace(tzinfo=UTC)
    return (now - at).total_seconds()


def _removed_bytes(state: AttemptState, blobs: BlobStore, keys: Sequence[str]) -> int:
    """Bytes of ``keys``: as ``call.committed`` recorded them, else as the store reports them."""
    recorded = {
        c.committed.blob_key: c.committed.blob_bytes for c in state.calls.values() if c.committed
    }
    measured = blob_sizes(blobs, [key for key in keys if key not in recorded])
    return sum(recorded.get(key, measured.get(key, 0)) for key in keys)


def clean_attempt(
    store: EventStore,
    blobs: BlobStore,
    capture_key: str,
    *,
    published_rollouts: Container[str],
    window_s: float,
    dry_run: bool = False,
    now: datetime | None = None,
    stored: Iterable[str] | None = None,
    dropped_rollouts: Container[str] = frozenset(),
) -> AttemptCleanup:
    """Apply ``plan_cleanup`` to one attempt, then record ``attempt.cleaned`` with the keys
    removed. Deletes are exact (``delete_blobs``, which refuses waiting keys); a partition with
    nothing kept, once past its wait, is torn down whole (temporary files too).

    ``published_rollouts``: the rollout ids a ``batch.published`` names; ``dropped_rollouts``
    those it names as rollouts of dropped prompt groups. ``stored``: the
    partition's keys, when the caller listed them before reading the ledger (else listed here,
    first: a blob is written after its call's intent, so every listed blob's call is known).
    An attempt the ledger does not know is all orphans, and no event is recorded for it.
    """
    listed = list(stored) if stored is not None else blobs.list_keys(staging_prefix(capture_key))
    events = store.read_stream(capture_key)
    state = fold_attempt(capture_key, (e.decode() for e in events))
    rollout_id = None if state.opened is None else state.opened.rollout_id
    plan = plan_cleanup(
        state,
        listed,
        published=rollout_id is not None and rollout_id in published_rollouts,
        dropped=rollout_id is not None and rollout_id in dropped_rollouts,
        settled_for_s=_settled_for_s(events, now or datetime.now(UTC)),
        window_s=window_s,
    )
    size = _removed_bytes(state, blobs, plan.remove)
    if dry_run or not plan.remove:
        return AttemptCleanup(plan, size, recorded=False)
    if plan.teardown and not plan.keep:
        removed = teardown_partition(blobs, capture_key)
    else:
        removed = delete_blobs(blobs, plan.remove, pending_keys=plan.waiting)
    recorded = state.opened is not None and bool(removed)
    if recorded:
        AttemptLog(store).cleaned(capture_key, AttemptCleaned(keys=tuple(sorted(removed))))
    return AttemptCleanup(plan, size, recorded)


@dataclass
class CleanupReport:
    """What a cleanup pass removed (in a dry run: would remove), in counts and bytes.

    ``removed`` are the keys deleted, ``orphans`` those of them no event named; ``kept`` counts
    the selected blobs kept for published rollouts, ``waiting`` the blobs of calls that may still
    be written (left for teardown); ``failed`` the attempts the store could not clean this time.
    """

    dry_run: bool = False
    attempts: int = 0
    cleaned: int = 0
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    orphans: list[str] = field(default_factory=list)
    kept: int = 0
    waiting: int = 0
    failed: list[str] = field(default_factory=list)

    def add(self, result: AttemptCleanup) -> None:
        """Count one attempt's cleanup."""
        plan = result.plan
        self.attempts += 1
        self.cleaned += bool(plan.remove)
        self.removed += plan.remove
        self.removed_bytes += result.removed_bytes
        self.orphans += plan.orphans
        self.kept += len(plan.keep)
        self.waiting += len(plan.waiting)

    def as_dict(self) -> dict[str, object]:
        """The report as JSON-able values (``grove gc --json``)."""
        return {
            "dry_run": self.dry_run,
            "attempts": self.attempts,
            "cleaned_attempts": self.cleaned,
            "removed_blobs": len(self.removed),
            "removed_bytes": self.removed_bytes,
            "orphans": len(self.orphans),
            "kept_selected": self.kept,
            "waiting": self.waiting,
            "failed": list(self.failed),
        }


def _clean_each(
    store: EventStore,
    blobs: BlobStore,
    attempts: Iterable[tuple[str, list[str] | None]],
    report: CleanupReport,
    *,
    published_rollouts: Container[str],
    dropped_rollouts: Container[str],
    window_s: float,
    now: datetime | None = None,
) -> CleanupReport:
    for capture_key, stored in attempts:
        try:
            result = clean_attempt(
                store,
                blobs,
                capture_key,
                published_rollouts=published_rollouts,
                dropped_rollouts=dropped_rollouts,
                window_s=window_s,
                dry_run=report.dry_run,
                now=now,
                stored=stored,
            )
        except StorageUnavailableError as error:
            logger.warning("cleanup of attempt %s left for grove gc: %s", capture_key, error)
            report.failed.append(capture_key)
            continue
        report.add(result)
    return report


def clean_step(
    store: EventStore, blobs: BlobStore, published: PublishedBatch, *, window_s: float
) -> CleanupReport:
    """Clean the attempts of a step ``grove train`` just trained: each rollout of the batch is
    published, trainable or masked, and each rollout of a prompt group the step dropped is final
    too. A store failure leaves the attempt for ``grove gc`` (logged, and in ``failed``):
    training goes on."""
    rollouts = (*published.rollouts, *published.dropped_rollouts)
    return _clean_each(
        store,
        blobs,
        [(rollout.capture_key, None) for rollout in rollouts],
        CleanupReport(),
        published_rollouts={rollout.rollout_id for rollout in published.rollouts},
        dropped_rollouts={rollout.rollout_id for rollout in published.dropped_rollouts},
        window_s=window_s,
    )


def published_rollouts(store: EventStore, wait_s: float = 5.0) -> set[str]:
    """Every rollout id a ``batch.published`` names, on any training stream (one ledger scan).
    A step published behind the reader's horizon is missed: its attempts then keep more."""
    return _batch_rollouts(store, wait_s)[0]


def _batch_rollouts(store: EventStore, wait_s: float) -> tuple[set[str], set[str]]:
    """The rollout ids every ``batch.published`` names: those it trains, and those of the prompt
    groups it dropped (one ledger scan, after waiting up to ``wait_s`` for the horizon)."""
    store.wait_for_horizon(wait_s)
    trained: set[str] = set()
    dropped: set[str] = set()
    mark = LedgerPosition(position=0)
    while True:
        batch = store.read_after(mark, 1000)
        if not batch.events:
            return trained, dropped
        for stored in batch.events:
            if stored.event_type == BatchPublished.type:
                event = stored.decode()
                if not isinstance(event, BatchPublished):
                    raise TypeError(f"event {stored.position} decoded as {type(event).__name__}")
                trained.update(event.rollout_ids)
                dropped.update(event.dropped_rollout_ids)
        mark = batch.mark


def collect_garbage(
    store: EventStore,
    blobs: BlobStore,
    *,
    window_s: float,
    dry_run: bool = False,
    now: datetime | None = None,
) -> CleanupReport:
    """``grove gc``: clean every staging partition in the store by ``plan_cleanup``.

    The store is listed before the ledger is read, so every listed blob's call intent is already
    recorded: a call in flight is pending (waiting), never an orphan. Partitions of attempts the
    ledger does not know are orphans whole: the blob store must belong to this ledger.
    """
    by_attempt: dict[str, list[str]] = {}
    for key in blobs.list_keys(f"{STAGING}/"):
        capture_key = capture_key_of(key)
        if capture_key is not None:
            by_attempt.setdefault(capture_key, []).append(key)
    trained, dropped = _batch_rollouts(store, 5.0)
    return _clean_each(
        store,
        blobs,
        sorted(by_attempt.items()),
        CleanupReport(dry_run=dry_run),
        published_rollouts=trained,
        dropped_rollouts=dropped,
        window_s=window_s,
        now=now,
    )
