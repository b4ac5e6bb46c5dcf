"""The projector: follows the ledger, finalizes selected rollouts, publishes training batches.

It reads the ledger with the gap-free reader and, for each attempt that is settled and has a
selection, records ``rollout.finalized``: trainable with its paths and owned calls, or masked with
a reason (``grove.training.finalization``; ``docs/forest.md``, "Failures and drops").

A prompt group is complete when every one of its logical rollouts is finalized. Each complete group
is then kept or dropped by the group rules (``grove.training.groups.decide_group``: an attempt Grove
abandoned, no valid input layout, too few verified rollouts, calls too far apart in policy version
or too far behind the step). A dropped group is never published. A step publishes
``groups_per_step`` kept groups in order of completion — or exactly the groups its caller names,
fewer when its drop budget allows (an in-process harness, whose step is the groups it played) — as
``batch.published`` on the training stream with the rollout ids, row ids, padding ids and the
ledger position read so far. Each dropped group is counted once, in the first step published after
the projector read its completion at which it is dropped (``PublishedBatch.dropped``). The step
number is the training stream's version, appended with an expected version, so two projectors
cannot publish the same step; a rollout published once is never published again. Everything the
projector knows is rebuilt from the ledger, so after a crash or resume it rebuilds the batch of an
already published step exactly — its drops included — instead of assembling a new one: each
rollout trains in one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.errors import WrongExpectedVersion
from grove.ledger.events import AttemptOpened, BatchPublished, LedgerPosition, RolloutFinalized
from grove.ledger.store import EventStore, StoredEvent
from grove.storage import BlobStore
from grove.training.advantages import GroupDecision, RolloutOutcome
from grove.training.batch import LogicalRollout, TrainingBatch, assemble_batch
from grove.training.errors import BatchError
from grove.training.finalization import (
    Decision,
    call_policy_versions,
    captured_calls,
    decide,
    finalization_event,
    finalization_forest,
    masked_forest,
    setting_mask_reason,
)
from grove.training.forest import MASK_REASONS, Forest, MaskReason
from grove.training.groups import (
    DropReason,
    GroupMember,
    GroupRules,
    abandonment_reason,
    decide_group,
)
from grove.training.media_checks import MediaRules

__all__ = [
    "FinalizedRollout",
    "Projector",
    "ProjectorSettings",
    "PublishedBatch",
    "captured_calls",
    "finalization_event",
    "finalization_forest",
    "setting_mask_reason",
]


@dataclass(frozen=True)
class ProjectorSettings:
    """How rollouts become batches: group size, groups per step, row multiple, padding token;
    the training stream batches are published on, and the prefix of the capture keys (attempt
    streams) this projector follows (empty: every attempt in the ledger).

    ``forest_training`` (``token_capture.forest_training``): False trains one row per logical
    rollout and masks a forest of several paths (``forest_training_disabled``).
    ``max_row_tokens`` (``policy.max_total_sequence_length``): None for no limit, else >= 1; a
    rollout with a longer row is masked (``row_too_long``). Both decide ``rollout.finalized``,
    so ``grove replay --verify`` must pass the same values to ``finalization_forest``.
    ``min_valid_fraction`` (``token_capture.min_valid_fraction_per_group``) and
    ``max_policy_lag`` (``async_rl.max_policy_lag``) are the group rules; None turns each off.
    ``media_rules``: the trained model's image token and merge size (``media_rules`` of its
    configuration); with them each image of a rollout is checked before its decision is
    recorded (``training/media_checks.py``), None checks none (a text model).
    """

    rollouts_per_group: int
    groups_per_step: int
    row_multiple: int = 1
    pad_token_id: int = 0
    training_stream: str = "training"
    capture_prefix: str = ""
    forest_training: bool = True
    max_row_tokens: int | None = None
    min_valid_fraction: float | None = None
    max_policy_lag: int | None = None
    media_rules: MediaRules | None = None

    def __post_init__(self) -> None:
        for name in ("rollouts_per_group", "groups_per_step", "row_multiple"):
            if getattr(self, name) < 1:
                raise BatchError(name, f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_row_tokens is not None and self.max_row_tokens < 1:
            raise BatchError(
                "max_row_tokens", f"max_row_tokens must be >= 1 or None, got {self.max_row_tokens}"
            )

    @property
    def group_rules(self) -> GroupRules:
        """The group rules these settings name."""
        return GroupRules(self.min_valid_fraction, self.max_policy_lag)


@dataclass(frozen=True, eq=False)
class FinalizedRollout:
    """One logical rollout after finalization: its forest, reward, and rows as tensors.

    ``abandoned`` is why Grove abandoned its attempt (None when its harness returned);
    ``policy_versions`` the known policy versions of the calls its rows train, ascending;
    ``environment_masked`` whether its harness flagged it as one the environment could not score.
    """

    capture_key: str
    rollout_id: str
    group_id: str
    reward: float
    forest: Forest
    rollout: LogicalRollout
    abandoned: DropReason | None = None
    policy_versions: tuple[int, ...] = ()
    environment_masked: bool = False

    @property
    def outcome(self) -> RolloutOutcome:
        """The advantage stage's view of this rollout (no trainer diagnostics yet); the
        harness's environment mask (``rollout.selected``) filters it (``environment``)."""
        return RolloutOutcome.from_forest(
            self.rollout_id,
            self.group_id,
            self.reward,
            self.forest,
            env_masked=self.environment_masked,
        )

    @property
    def member(self) -> GroupMember:
        """The group rules' view of this rollout."""
        return GroupMember(self.outcome, self.abandoned, self.policy_versions)


@dataclass(frozen=True, eq=False)
class PublishedBatch:
    """The rows of one optimizer step, as published (or re-built) from the ledger, and the
    complete prompt groups dropped for it (``dropped``: each counted in this one step)."""

    step: int
    batch: TrainingBatch
    rollouts: tuple[FinalizedRollout, ...]
    position: LedgerPosition
    rebuilt: bool
    dropped: tuple[GroupDecision, ...] = ()
    dropped_rollouts: tuple[FinalizedRollout, ...] = ()

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        """One outcome per logical rollout, in batch order."""
        return [r.outcome for r in self.rollouts]


@dataclass
class _Progress:
    """What the projector has learned from the ledger so far."""

    mark: LedgerPosition = field(default_factory=lambda: LedgerPosition(position=0))
    events_read: int = 0
    dirty: set[str] = field(default_factory=set)
    unselected: dict[str, None] = field(default_factory=dict)  # opened attempts, in order
    finalized: dict[str, FinalizedRollout] = field(default_factory=dict)  # by rollout id
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> rollout ids
    complete: list[str] = field(default_factory=list)  # groups, in order of completion
    completed_at: dict[str, int] = field(default_factory=dict)  # group -> ledger position
    open: dict[str, None] = field(default_factory=dict)  # complete, not published nor counted
    published: dict[int, BatchPublished] = field(default_factory=dict)  # step -> event
    published_rollouts: set[str] = field(default_factory=set)
    drops: list[tuple[GroupDecision, ...]] = field(default_factory=list)  # by step


class Projector:
    """Turns settled, selected attempts into finalized rollouts and published batches."""

    def __init__(
        self,
        store: EventStore,
        blobs: BlobStore,
        settings: ProjectorSettings,
        *,
        finalize: bool = True,
    ) -> None:
        self.store = store
        self.blobs = blobs
        self.settings = settings
        # False: projector shards record the finalizations (training/projector_shards.py); this one
        # only reads them, and publishes.
        self.finalize = finalize
        self.log = AttemptLog(store)
        self._progress = _Progress()
        # Forests decided in this process, with their rows, kept until their finalized event is
        # read back.
        self._decided: dict[str, Decision] = {}

    @property
    def position(self) -> LedgerPosition:
        """The ledger position read so far."""
        return self._progress.mark

    @property
    def events_read(self) -> int:
        """How many ledger events this projector has read (all streams)."""
        return self._progress.events_read

    @property
    def dropped_groups(self) -> tuple[str, ...]:
        """Complete prompt groups that a rule independent of the step drops (an abandoned
        attempt, no valid layout, too few verified rollouts, calls too far apart in policy
        version), in order of completion: never published."""
        return tuple(g for g in self._progress.complete if not self._decision(g, None).kept)

    @property
    def unselected_attempts(self) -> tuple[str, ...]:
        """Capture keys of the attempts opened without a selection yet, in order of opening."""
        return tuple(self._progress.unselected)

    @property
    def published_steps(self) -> int:
        """How many steps the training stream holds."""
        return len(self._progress.published)

    def step_rewards(self) -> list[float]:
        """The mean reward of each published step's logical rollouts, in step order."""
        progress = self._progress
        rewards = []
        for step in sorted(progress.published):
            ids = progress.published[step].rollout_ids
            values = [progress.finalized[r].reward for r in ids if r in progress.finalized]
            rewards.append(sum(values) / len(values) if values else 0.0)
        return rewards

    def group_decision(self, group_id: str, step: int) -> GroupDecision | None:
        """Whether the complete group ``group_id`` may train at ``step``; None while some of its
        rollouts are not finalized."""
        if group_id not in self._progress.completed_at:
            return None
        return self._decision(group_id, step)

    # -- following the ledger ----------------------------------------------------------------

    def poll(self, limit: int = 1000) -> int:
        """Read committed events not yet seen; finalize the attempts they make ready.

        Group membership and completion order follow the ``rollout.finalized`` events in ledger
        order, so a projector rebuilt from the ledger after a crash sees the same order.
        """
        seen = 0
        while True:
            read = self._read(limit)
            seen += read
            dirty = sorted(self._progress.dirty)
            self._progress.dirty.clear()
            for capture_key in dirty:
                self._maybe_finalize(capture_key)
            if not read and not dirty:
                return seen

    def _read(self, limit: int) -> int:
        progress = self._progress
        seen = 0
        while True:
            batch = self.store.read_after(progress.mark, limit)
            for stored in batch.events:
                self._observe(stored)
            seen += len(batch.events)
            progress.events_read += len(batch.events)
            progress.mark = batch.mark
            if len(batch.events) < limit:
                return seen

    def _observe(self, stored: StoredEvent) -> None:
        progress = self._progress
        if stored.stream_id == self.settings.training_stream:
            event = stored.decode()
            if isinstance(event, BatchPublished):
                progress.published[event.step] = event
                progress.published_rollouts.update(event.rollout_ids)
            return
        if not stored.stream_id.startswith(self.settings.capture_prefix):
            return
        if stored.event_type == AttemptOpened.type:
            progress.unselected[stored.stream_id] = None
        elif stored.event_type == RolloutFinalized.type:
            self._join_group(stored.stream_id, stored.position)
        elif stored.event_type in ("attempt.settled", "rollout.selected"):
            if stored.event_type == "rollout.selected":
                progress.unselected.pop(stored.stream_id, None)
            progress.dirty.add(stored.stream_id)

    def _maybe_finalize(self, capture_key: str) -> None:
        """Record the finalization of a settled, selected attempt (once per attempt)."""
        state = self.log.load(capture_key)
        if state.opened is None or state.settled is None or state.selection is None:
            return
        if state.finalized is None and self.finalize:
            self._record_finalization(state)

    def _join_group(self, capture_key: str, position: int) -> None:
        """A ``rollout.finalized`` was read: the rollout joins its group (first attempt wins)."""
        progress = self._progress
        state = self.log.load(capture_key)
        if state.opened is None or state.finalized is None:
            return  # the fold left it out (never opened or never selected): a contradiction
        if state.opened.rollout_id in progress.finalized:
            return
        rollout = self._reconstruct(state)
        progress.finalized[rollout.rollout_id] = rollout
        members = progress.groups.setdefault(rollout.group_id, [])
        members.append(rollout.rollout_id)
        if len(members) == self.settings.rollouts_per_group:
            progress.complete.append(rollout.group_id)
            progress.completed_at[rollout.group_id] = position
            progress.open[rollout.group_id] = None

    # -- finalization ------------------------------------------------------------------------

    def _decide(self, state: AttemptState) -> Decision:
        return decide(
            state,
            self.blobs,
            forest_training=self.settings.forest_training,
            max_row_tokens=self.settings.max_row_tokens,
            media_rules=self.settings.media_rules,
        )

    def _record_finalization(self, state: AttemptState) -> None:
        opened = state.recorded_opening()
        decision = self._decide(state)
        self._decided[state.capture_key] = decision
        forest = decision.forest
        event = finalization_event(
            opened.rollout_id,
            forest,
            forest_training=self.settings.forest_training,
            max_row_tokens=self.settings.max_row_tokens,
            media_rules=self.settings.media_rules,
        )
        self.log.finalize(state.capture_key, event)

    def _reconstruct(self, state: AttemptState) -> FinalizedRollout:
        """The finalized rollout with its rows, checked against the recorded decision."""
        opened, selection = state.recorded_opening(), state.recorded_selection()
        recorded = state.recorded_finalization()
        decision = self._decided.pop(state.capture_key, None) or self._decide(state)
        forest, rows = decision.forest, decision.rows
        paths = tuple(tuple(row.call_ids) for row in forest.rows)
        if (recorded.trainable, recorded.paths) != (forest.trainable, paths):
            # The blobs or events changed since the decision (or the code, or the settings did):
            # never train on it. A recorded mask keeps its reason (its unselected blobs may
            # since have been cleaned); otherwise today's reason, or blob_invalid.
            kept = recorded.masked_reason if recorded.masked_reason in MASK_REASONS else None
            forest = masked_forest(forest, kept or forest.masked_reason or MaskReason.BLOB_INVALID)
            rows = ()
        return FinalizedRollout(
            capture_key=state.capture_key,
            rollout_id=opened.rollout_id,
            group_id=opened.prompt_group,
            reward=selection.reward,
            forest=forest,
            rollout=LogicalRollout(opened.rollout_id, opened.prompt_group, rows),
            abandoned=abandonment_reason(selection.policy, selection.call_ids, selection.result),
            policy_versions=call_policy_versions(
                state, [c for row in forest.rows for c in row.call_ids]
            ),
            environment_masked=selection.environment_masked,
        )

    # -- groups ------------------------------------------------------------------------------

    def _decision(self, group_id: str, step: int | None) -> GroupDecision:
        progress = self._progress
        members = [progress.finalized[r].member for r in progress.groups[group_id]]
        return decide_group(group_id, members, self.settings.group_rules, step)

    def _published(self, group_id: str) -> bool:
        return bool(set(self._progress.groups[group_id]) & self._progress.published_rollouts)

    def _dropped_for(self, step: int, position: int) -> tuple[GroupDecision, ...]:
        """The groups counted as dropped at ``step``, published with the reader at ``position``:
        complete by then, never published, not counted before, and dropped at ``step``. (A group
        published at a later step was kept at every earlier one: a group the rules drop at one
        step they drop at every later step too.)"""
        candidates = [g for g in self._open() if self._progress.completed_at[g] <= position]
        decisions = (self._decision(g, step) for g in candidates)
        return tuple(d for d in decisions if not d.kept)

    def _open(self) -> list[str]:
        """The complete groups neither published nor counted as dropped, in order of completion
        (a group leaves them for good, so each step looks at few groups)."""
        progress = self._progress
        for group in [g for g in progress.open if self._published(g)]:
            del progress.open[group]
        return list(progress.open)

    def _count_drops(self, step: int, dropped: tuple[GroupDecision, ...]) -> None:
        progress = self._progress
        if len(progress.drops) != step:
            raise BatchError(
                "step_order",
                f"the drops of step {step} must follow those of steps 0..{step - 1}; "
                f"{len(progress.drops)} steps are counted",
            )
        progress.drops.append(dropped)
        for decision in dropped:
            progress.open.pop(decision.group_id, None)

    def _count_drops_before(self, step: int) -> None:
        """Count the drops of every published step before ``step`` not counted yet, in order."""
        progress = self._progress
        for earlier in range(len(progress.drops), step):
            position = progress.published[earlier].ledger_position.position
            self._count_drops(earlier, self._dropped_for(earlier, position))

    # -- publication -------------------------------------------------------------------------

    def batch_for_step(
        self, step: int, *, groups: Sequence[str] | None = None
    ) -> PublishedBatch | None:
        """The batch of ``step``: re-built when already published, else newly published.

        Without ``groups`` the step takes the first ``groups_per_step`` complete groups in order
        of completion that the group rules keep, and is None until enough wait. ``groups`` names
        the step's groups instead (1 to ``groups_per_step``, each complete and kept: a
        ``BatchError`` otherwise), for a caller that decided which groups form the step.
        """
        progress = self._progress
        if step in progress.published:
            return self._rebuild(progress.published[step])
        if step != len(progress.published):
            raise BatchError(
                "step",
                f"step {step} cannot be published before step {len(progress.published)}",
            )
        self._count_drops_before(step)
        dropped = self._dropped_for(step, progress.mark.position)
        chosen = self._chosen(step, groups, {d.group_id for d in dropped})
        if chosen is None:
            return None
        rollouts = [progress.finalized[r] for g in chosen for r in progress.groups[g]]
        batch = self.assemble(rollouts)
        event = BatchPublished(
            step=step,
            rollout_ids=tuple(r.rollout_id for r in rollouts),
            row_ids=tuple(
                f"{r.rollout_id}/{i}" for r in rollouts for i in range(len(r.rollout.rows))
            ),
            padding_row_ids=tuple(f"step-{step}/pad-{i}" for i in range(batch.num_padding_rows)),
            ledger_position=progress.mark,
            dropped_rollout_ids=tuple(r.rollout_id for r in self._members(dropped)),
        )
        try:
            self.store.append(self.settings.training_stream, [event], expected_version=step)
        except WrongExpectedVersion:
            self.poll()  # another projector published this step: take its batch
            return self.batch_for_step(step)
        progress.published[step] = event
        progress.published_rollouts.update(event.rollout_ids)
        self._count_drops(step, dropped)
        return PublishedBatch(
            step,
            batch,
            tuple(rollouts),
            progress.mark,
            rebuilt=False,
            dropped=dropped,
            dropped_rollouts=self._members(dropped),
        )

    def _members(self, decisions: Sequence[GroupDecision]) -> tuple[FinalizedRollout, ...]:
        """The finalized rollouts of the groups ``decisions`` name, group by group."""
        progress = self._progress
        return tuple(progress.finalized[r] for d in decisions for r in progress.groups[d.group_id])

    def _chosen(
        self, step: int, groups: Sequence[str] | None, dropped: set[str]
    ) -> list[str] | None:
        """The groups ``step`` publishes, or None when too few complete kept groups wait."""
        waiting = [g for g in self._open() if g not in dropped]
        if groups is None:
            wanted = self.settings.groups_per_step
            return waiting[:wanted] if len(waiting) >= wanted else None
        if not 1 <= len(groups) <= self.settings.groups_per_step:
            raise BatchError(
                "groups",
                f"a step publishes 1 to {self.settings.groups_per_step} prompt groups, "
                f"asked for {len(groups)}",
            )
        unfit = [g for g in groups if g not in waiting]
        if unfit or len(set(groups)) != len(groups):
            raise BatchError(
                "groups",
                f"step {step} can publish only complete prompt groups that are kept and not yet "
                f"published, once each; asked for {list(groups)}, of which {unfit} are not",
            )
        return list(groups)

    def _rebuild(self, event: BatchPublished) -> PublishedBatch:
        missing = [r for r in event.rollout_ids if r not in self._progress.finalized]
        if missing:
            raise BatchError(
                "published_rollout_missing",
                f"step {event.step} was published with rollouts {missing[:3]} that the ledger "
                "does not show as finalized; the ledger is inconsistent (replay it to see why)",
            )
        self._count_drops_before(event.step + 1)
        rollouts = [self._progress.finalized[r] for r in event.rollout_ids]
        return PublishedBatch(
            event.step,
            self.assemble(rollouts),
            tuple(rollouts),
            event.ledger_position,
            True,
            self._progress.drops[event.step],
            self._members(self._progress.drops[event.step]),
        )

    def assemble(self, rollouts: Sequence[FinalizedRollout]) -> TrainingBatch:
        """``rollouts``' rows as one batch, padded to the row multiple with the padding token."""
        return assemble_batch(
            [r.rollout for r in rollouts],
            row_multiple=self.settings.row_multiple,
            pad_token_id=self.settings.pad_token_id,
        )
