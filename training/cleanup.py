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

Forks (``docs/fork.md``) read blobs of other attempts: a fork's rows start with its source chain
(``attempt.opened.fork_from.chain``), whose blobs live in the partitions of the source and, for a
fork of a fork, of the source's source. A fork **holds** every key of its chain while it is not
final (by the rule above, applied to the fork), and while it is published and trainable with a
selected call that continues its source (its rows are rebuilt from the chain, as from its own
selected calls). ``fork_held_keys`` (pure) finds the held keys of folded forks; ``plan_cleanup``
takes them as plain data and keeps a held key of a final attempt (``held``) instead of removing
it. The cleanup after the last holder is final removes it: ``clean_step`` cleans the sources of
the step's forks after the forks, and ``grove gc`` every partition.

The order of a cleanup and a fork's opening: the source's ``attempt.cleaned`` event is the commit
point. A fork whose opening reads the source after it names a key of the fork's chain is refused
(``grove.capture.forks.fork_source``: 409 ``attempt_rule``, nothing written); a fork whose
``attempt.opened`` was committed when the pass scanned the ledger holds its chain. Between the
two (an opening that read the source before its ``attempt.cleaned`` was recorded and committed
after the scan), and for a fork of a fork whose source's source removed part of its chain (the
opening checks its source's own removals), a fork can name a removed blob: the projector masks it
``blob_invalid``, as any missing blob, so it never trains on a wrong token.

The I/O is ``clean_attempt``: list the partition, read the attempt's stream, apply the plan with
``grove.storage.cleanup``'s exact deletes (pending keys refused) or whole-partition teardown, then
record ``attempt.cleaned`` with exactly the keys removed. ``clean_step`` runs it on the attempts
of a step ``grove train`` just trained; ``collect_garbage`` (``grove gc``) on every partition in
the store, orphans of attempts the ledger does not know included. Each pass scans the ledger
once (``batch.published`` and ``attempt.opened`` only, queried by type), for the published and
dropped rollouts and the forks' sources, and reads the stream of each fork whose chain names a
blob of an attempt it cleans.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Container, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from sqlalchemy import bindparam, select

from grove.ledger.attempt import AttemptLog, AttemptState, CallStatus, fold_attempt
from grove.ledger.database import autocommit, translate_errors
from grove.ledger.events import (
    AttemptCleaned,
    AttemptOpened,
    AttemptSettled,
    BatchPublished,
    ForkSource,
)
from grove.ledger.schema import EVENTS
from grove.ledger.store import EventStore, StoredEvent
from grove.ledger.upcasting import decode_as
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
    "fork_held_keys",
    "plan_cleanup",
    "published_rollouts",
]

logger = logging.getLogger(__name__)

_MASKED = "masked"  # CleanupPlan.final: finalized masked, no row of it ever trains
_PUBLISHED = "published"  # CleanupPlan.final: finalized trainable, and published
_DROPPED = "dropped"  # CleanupPlan.final: finalized in a prompt group dropped at a published step
_SCAN_PAGE = 1000  # events of the scanned types per query of _scan_ledger

# The events a pass reads from the whole ledger, a page after ``:p_after`` (built once, as the
# store's reads): ``batch.published`` (an index finds them) and ``attempt.opened``.
_SCANNED: Final = (
    select(
        EVENTS.c.position,
        EVENTS.c.stream_id,
        EVENTS.c.event_type,
        EVENTS.c.schema_version,
        EVENTS.c.payload,
    )
    .where(
        EVENTS.c.position > bindparam("p_after", type_=EVENTS.c.position.type),
        EVENTS.c.event_type.in_((BatchPublished.type, AttemptOpened.type)),
    )
    .order_by(EVENTS.c.position)
    .limit(_SCAN_PAGE)
)


@dataclass
class _LedgerScan:
    """What one scan of the ledger found: the rollout ids ``batch.published`` trains and drops,
    and each fork's source by the fork's capture key."""

    trained: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    forks: dict[str, ForkSource] = field(default_factory=dict)


@dataclass(frozen=True)
class CleanupPlan:
    """What may happen to one attempt's staging partition now (``plan_cleanup``).

    ``final`` is why the attempt's decision is final (``"masked"``, ``"published"``), or None
    when it is not. ``remove`` are the stored keys to delete now, ``orphans`` those of them no
    event names; ``keep`` the stored selected keys of a published, trainable rollout;
    ``held`` the stored keys a final attempt keeps only because a fork's chain holds them
    (``fork_held_keys``); ``waiting`` the stored keys of calls whose writer may still write,
    left for teardown. ``teardown`` is whether the attempt is past its wait (``waiting`` is then
    empty: its keys are in ``remove``). Every key is stored; ``remove``, ``keep``, ``held`` and
    ``waiting`` are sorted and disjoint.
    """

    capture_key: str
    final: str | None
    remove: tuple[str, ...]
    orphans: tuple[str, ...]
    keep: tuple[str, ...]
    waiting: tuple[str, ...]
    teardown: bool
    held: tuple[str, ...] = ()


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


def _continues_source(fork: AttemptState) -> bool:
    """Whether a selected call of ``fork`` continues its source call, so its rows carry the
    source chain (a selected call's parent is selected, else the rollout is masked)."""
    selected = () if fork.selection is None else fork.selection.call_ids
    return any(
        fork.calls[c].intended.source_capture_key is not None for c in selected if c in fork.calls
    )


def fork_held_keys(
    forks: Iterable[AttemptState], *, published: Container[str], dropped: Container[str]
) -> frozenset[str]:
    """The source-chain blob keys that ``forks`` (folded attempts; those that fork nothing are
    skipped) hold: every chain key of a fork that is not final, and of a published, trainable
    fork whose rows carry its chain. ``published`` and ``dropped``: the rollout ids
    ``batch.published`` names as trained and as dropped."""
    held: set[str] = set()
    for fork in forks:
        opened = fork.opened
        if opened is None or opened.fork_from is None:
            continue
        rollout_id = opened.rollout_id
        final = _final(fork, rollout_id in published, rollout_id in dropped)
        if final is None or (final == _PUBLISHED and _continues_source(fork)):
            held.update(source.blob_key for source in opened.fork_from.chain)
    return frozenset(held)


def plan_cleanup(
    state: AttemptState,
    stored: Iterable[str],
    *,
    published: bool,
    settled_for_s: float | None,
    window_s: float,
    dropped: bool = False,
    held: Collection[str] = frozenset(),
) -> CleanupPlan:
    """Which of ``stored`` (the keys listed under the attempt's partition) may go now.

    ``published``: a ``batch.published`` names the attempt's rollout; ``dropped``: one names it
    among the rollouts of the prompt groups it dropped. ``settled_for_s``: seconds
    since ``attempt.settled`` was recorded (None: not settled). ``window_s``: how long a settled
    attempt's waiting calls keep their blobs. ``held``: the keys forks hold
    (``fork_held_keys``), kept while the attempt's other blobs go. An attempt that is not final
    loses only orphans.
    """
    stored_keys = set(stored)
    named = {c.call_id: c.committed.blob_key for c in state.calls.values() if c.committed}
    named_keys = set(named.values())
    waiting = _waiting_keys(state) - named_keys
    orphans = stored_keys - named_keys - waiting
    final = _final(state, published, dropped)
    keep: set[str] = set()
    kept_for_forks: set[str] = set()
    remove = set(orphans)
    teardown = False
    if final is not None:
        if final == _PUBLISHED:
            selected = state.recorded_selection().call_ids
            keep = {named[c] for c in selected if c in named} & stored_keys
        remove |= (named_keys & stored_keys) - keep
        kept_for_forks = remove & named_keys & set(held)
        remove -= kept_for_forks
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
        held=tuple(sorted(kept_for_forks)),
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
    fork_holds: Collection[str] | None = None,
) -> AttemptCleanup:
    """Apply ``plan_cleanup`` to one attempt, then record ``attempt.cleaned`` with the keys
    removed. Deletes are exact (``delete_blobs``, which refuses waiting keys); a partition with
    nothing kept, once past its wait, is torn down whole (temporary files too).

    ``published_rollouts``: the rollout ids a ``batch.published`` names; ``dropped_rollouts``
    those it names as rollouts of dropped prompt groups. ``stored``: the
    partition's keys, when the caller listed them before reading the ledger (else listed here,
    first: a blob is written after its call's intent, so every listed blob's call is known).
    ``fork_holds``: the keys forks hold (``fork_held_keys``); None: found here, by a scan of the
    ledger. An attempt the ledger does not know is all orphans, and no event is recorded for it.
    """
    listed = list(stored) if stored is not None else blobs.list_keys(staging_prefix(capture_key))
    if fork_holds is None:
        fork_holds = _forks_holding(store, _scan_ledger(store), {capture_key})
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
        held=fork_holds,
    )
    size = _removed_bytes(state, blobs, plan.remove)
    if dry_run or not plan.remove:
        return AttemptCleanup(plan, size, recorded=False)
    if plan.teardown and not plan.keep and not plan.held:
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
    the selected blobs kept for published rollouts, ``held`` the blobs of final attempts kept
    for forks, ``waiting`` the blobs of calls that may still be written (left for teardown);
    ``failed`` the attempts the store could not clean this time.
    """

    dry_run: bool = False
    attempts: int = 0
    cleaned: int = 0
    removed: list[str] = field(default_factory=list)
    removed_bytes: int = 0
    orphans: list[str] = field(default_factory=list)
    kept: int = 0
    held: int = 0
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
        self.held += len(plan.held)
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
            "held_for_forks": self.held,
            "waiting": self.waiting,
            "failed": list(self.failed),
        }


def _clean_each(
    store: EventStore,
    blobs: BlobStore,
    attempts: Sequence[tuple[str, list[str] | None]],
    report: CleanupReport,
    scan: _LedgerScan,
    *,
    window_s: float,
    now: datetime | None = None,
) -> CleanupReport:
    """Clean ``attempts`` (capture key, listed keys or None) by what ``scan`` found."""
    holds = _forks_holding(store, scan, {capture_key for capture_key, _ in attempts})
    for capture_key, stored in attempts:
        try:
            result = clean_attempt(
                store,
                blobs,
                capture_key,
                published_rollouts=scan.trained,
                dropped_rollouts=scan.dropped,
                window_s=window_s,
                dry_run=report.dry_run,
                now=now,
                stored=stored,
                fork_holds=holds,
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
    too; then the sources of the forks among them, whose held blobs may go now. A store failure
    leaves the attempt for ``grove gc`` (logged, and in ``failed``): training goes on."""
    scan = _scan_ledger(store)
    scan.trained.update(rollout.rollout_id for rollout in published.rollouts)
    scan.dropped.update(rollout.rollout_id for rollout in published.dropped_rollouts)
    step = [r.capture_key for r in (*published.rollouts, *published.dropped_rollouts)]
    sources = [c.capture_key for key in step if key in scan.forks for c in scan.forks[key].chain]
    attempts = [(key, None) for key in dict.fromkeys([*step, *sources])]
    return _clean_each(store, blobs, attempts, CleanupReport(), scan, window_s=window_s)


def published_rollouts(store: EventStore) -> set[str]:
    """Every rollout id a ``batch.published`` names, on any training stream (one ledger query)."""
    return _scan_ledger(store).trained


def _scan_ledger(store: EventStore) -> _LedgerScan:
    """The rollouts every committed ``batch.published`` names, trained and dropped, and the
    source of every fork a committed ``attempt.opened`` records: a query of these two types by
    pages of positions, which decodes no other event (over ten times faster than reading the
    whole ledger in order). An event committed after its page was read is missed: a step's
    attempts then keep more, and a fork's chain is not held (the projector masks the fork if
    its blobs went)."""
    scan = _LedgerScan()
    after = 0
    while True:
        with translate_errors(store.url), autocommit(store.engine.connect()) as conn:
            rows = conn.execute(_SCANNED, {"p_after": after}).all()
        if not rows:
            return scan
        for row in rows:
            if row.event_type == BatchPublished.type:
                published = decode_as(
                    BatchPublished, row.event_type, row.schema_version, row.payload
                )
                scan.trained.update(published.rollout_ids)
                scan.dropped.update(published.dropped_rollout_ids)
            elif row.payload.get("fork_from"):
                opened = decode_as(AttemptOpened, row.event_type, row.schema_version, row.payload)
                if opened.fork_from is not None:
                    scan.forks[row.stream_id] = opened.fork_from
        after = rows[-1].position


def _forks_holding(
    store: EventStore, scan: _LedgerScan, capture_keys: Collection[str]
) -> frozenset[str]:
    """The keys held by the forks ``scan`` found whose chains name a blob of an attempt in
    ``capture_keys`` (``fork_held_keys``; each such fork's stream is read)."""
    forks = [
        key
        for key, source in scan.forks.items()
        if any(call.capture_key in capture_keys for call in source.chain)
    ]
    states = (fold_attempt(key, (e.decode() for e in store.read_stream(key))) for key in forks)
    return fork_held_keys(states, published=scan.trained, dropped=scan.dropped)


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
    return _clean_each(
        store,
        blobs,
        sorted(by_attempt.items()),
        CleanupReport(dry_run=dry_run),
        _scan_ledger(store),
        window_s=window_s,
        now=now,
    )
