"""Projector shards: several processes share the finalization of a ledger by prompt group.

A shard follows the ledger with the gap-free reader, as the projector does, and keeps of each
attempt only what the lease rule needs: its prompt group and rollout id, and whether it is
settled, selected and finalized. An attempt that is settled and selected but not finalized is
*ready*; the shard that leases its prompt group finalizes it (``ledger/leases.py``, a PostgreSQL
advisory lock): it reads the attempt's state again under the lease and records
``rollout.finalized`` with the projector's own decision (``grove.training.finalization.decide`` and
``finalization_event`` with the same settings, so the event is the one a single projector
records). That decision is the expensive part of projection: it reads and verifies every selected
call's blob and builds the forest and its rows.

Leases:

- a shard holds at most ``max_groups`` prompt groups at once; when it needs another, it gives
  back a held group that has had no ready attempt for ``idle_s`` seconds (an idle group), so
  groups that wait for a slow harness do not starve the rest, while a group whose harness is
  busy stays with its shard;
- a group's lease is given back once ``rollouts_per_group`` of its logical rollouts are
  finalized (the group is complete);
- ready attempts of a group leased by another shard wait; when that shard dies (SIGKILL
  included) the server releases its leases and the next ``poll`` takes them over.

Exactly once: ``AttemptLog.finalize`` appends with the attempt's expected version and a
deterministic event id, so even two shards that both believed they held a group (a lease lost
with its connection) record one finalization. Steps are published by a ``Projector`` created
with ``finalize=False`` (in any number of processes: the training stream's expected version
publishes each step once), which reads the shards' finalizations instead of recording its own.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass

from grove.ledger.attempt import AttemptLog
from grove.ledger.events import AttemptOpened, LedgerPosition
from grove.ledger.leases import Leases
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import BlobStore
from grove.training.finalization import decide, finalization_event
from grove.training.projector import ProjectorSettings

__all__ = ["DEFAULT_MAX_GROUPS", "ProjectorShard"]

DEFAULT_MAX_GROUPS = 8
DEFAULT_IDLE_S = 60.0


@dataclass
class _Attempt:
    """What a shard knows of one attempt (from its events' types, without folding it)."""

    group: str
    rollout_id: str
    settled: bool = False
    selected: bool = False
    finalized: bool = False

    @property
    def ready(self) -> bool:
        return self.settled and self.selected and not self.finalized


class ProjectorShard:
    """Finalizes the ready attempts of the prompt groups it leases (see the module docstring)."""

    def __init__(
        self,
        store: EventStore,
        blobs: BlobStore,
        settings: ProjectorSettings,
        leases: Leases,
        *,
        max_groups: int = DEFAULT_MAX_GROUPS,
        idle_s: float = DEFAULT_IDLE_S,
    ) -> None:
        if max_groups < 1 or idle_s < 0:
            raise ValueError(f"max_groups must be >= 1 and idle_s >= 0, got {max_groups}, {idle_s}")
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.leases = leases
        self.max_groups = max_groups
        self.idle_s = idle_s
        self.log = AttemptLog(store)
        self.mark = LedgerPosition(position=0)
        self.finalized_here: list[str] = []  # capture keys this shard finalized, in order
        self._attempts: dict[str, _Attempt] = {}
        self._members: dict[str, set[str]] = defaultdict(set)  # group -> finalized rollouts
        self._busy_at: dict[str, float] = {}  # held group -> when it last had a ready attempt

    def poll(self, limit: int = 1000) -> int:
        """Read the events not yet seen, finalize the ready attempts of the groups this shard
        leases or can lease, give back the leases of complete groups; how many it finalized."""
        self._read(limit)
        finalized = 0
        waiting = sorted(k for k, a in self._attempts.items() if a.ready)
        now = time.monotonic()
        for group in {self._attempts[k].group for k in waiting} & self.leases.held:
            self._busy_at[group] = now
        for capture_key in waiting:
            attempt = self._attempts[capture_key]
            if attempt.ready and self._lease(attempt.group) and self._finalize(capture_key):
                finalized += 1
        for group in self.leases.held:
            if self._complete(group):
                self._give_back(group)
        return finalized

    def close(self) -> None:
        """Give back every lease."""
        self.leases.close()

    # -- following the ledger ----------------------------------------------------------------

    def _read(self, limit: int) -> None:
        while True:
            batch = self.store.read_after(self.mark, limit)
            for stored in batch.events:
                self._observe(stored)
            self.mark = batch.mark
            if len(batch.events) < limit:
                return

    def _observe(self, stored: StoredEvent) -> None:
        key = stored.stream_id
        if key == self.settings.training_stream or not key.startswith(self.settings.capture_prefix):
            return
        if stored.event_type == AttemptOpened.type:
            opened = stored.decode_as(AttemptOpened)
            self._attempts.setdefault(key, _Attempt(opened.prompt_group, opened.rollout_id))
            return
        attempt = self._attempts.get(key)
        if attempt is None:
            return  # an event before the attempt was opened: the fold leaves it out
        if stored.event_type == "attempt.settled":
            attempt.settled = True
        elif stored.event_type == "rollout.selected":
            attempt.selected = True
        elif stored.event_type == "rollout.finalized" and attempt.selected:
            attempt.finalized = True
            self._members[attempt.group].add(attempt.rollout_id)

    # -- leases and finalization -------------------------------------------------------------

    def _complete(self, group: str) -> bool:
        return len(self._members[group]) >= self.settings.rollouts_per_group

    def _lease(self, group: str) -> bool:
        """Whether this shard holds ``group`` now, taking it if a slot is free (or an idle held
        group can be given back for it)."""
        if group in self.leases.held:
            return True
        if len(self.leases.held) >= self.max_groups:
            since = time.monotonic() - self.idle_s
            idle = sorted(g for g in self.leases.held if self._busy_at[g] <= since)
            if not idle:
                return False
            self._give_back(idle[0])
        if not self.leases.take(group):
            return False
        self._busy_at[group] = time.monotonic()
        return True

    def _give_back(self, group: str) -> None:
        self.leases.give_back(group)
        del self._busy_at[group]

    def _finalize(self, capture_key: str) -> bool:
        """Record the finalization of ``capture_key`` from its state read under the lease; False
        when another shard finalized it first."""
        state = self.log.load(capture_key)
        if state.opened is None or state.settled is None or state.selection is None:
            return False
        if state.finalized is not None:
            return False
        settings = self.settings
        decision = decide(
            state,
            self.blobs,
            forest_training=settings.forest_training,
            max_row_tokens=settings.max_row_tokens,
            media_rules=settings.media_rules,
        )
        event = finalization_event(
            state.opened.rollout_id,
            decision.forest,
            forest_training=settings.forest_training,
            max_row_tokens=settings.max_row_tokens,
            media_rules=settings.media_rules,
        )
        self.log.finalize(capture_key, event)
        self.finalized_here.append(capture_key)
        return True
