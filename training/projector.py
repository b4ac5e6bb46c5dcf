"""The projector: follows the ledger, finalizes selected rollouts, publishes training batches.

It reads the ledger with the gap-free reader and, for each attempt that is settled and has a
selection, reconstructs its forest from the calls' delta blobs (sizes and digests verified, each
row checked against the calls' recorded chain digests) and records ``rollout.finalized``:
trainable with its paths and owned calls, or masked with a reason (capture incomplete, a failed
or pending call, a missing or corrupt blob, routes or media that do not fit a row, no owned
generated token, selection not closed, ...; ``docs/forest.md``, "Failures and drops"). Rows are
built as tensors before the decision is recorded, so a ``RowError`` masks its rollout rather
than escaping ``poll`` or ``batch_for_step``. Two settings can mask an otherwise trainable
rollout as well: with ``forest_training`` off, a forest of more than one path
(``forest_training_disabled``); with ``max_row_tokens``, a forest with a longer row
(``row_too_long``). The whole rollout is masked in every case, never part of its history.

Complete prompt groups (every logical rollout of the group finalized) are published in order of
completion, ``groups_per_step`` groups per optimizer step, as ``batch.published`` on the training
stream with the rollout ids, row ids, padding ids and the ledger position read so far; a complete
group none of whose rollouts has a row (every one masked: no valid input layout) is dropped,
never published (it has no valid input layout, ``docs/forest.md``). The step
number is the training stream's version, appended with an expected version, so two projectors
cannot publish the same step; a rollout published once is never published again. Everything the
projector knows is rebuilt from the ledger, so after a crash or resume it rebuilds the batch of an
already published step exactly instead of assembling a new one: each rollout trains in one step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ledger.attempt import AttemptLog, AttemptState, CallStatus
from ledger.errors import WrongExpectedVersion
from ledger.events import BatchPublished, LedgerPosition, RolloutFinalized
from ledger.store import EventStore, StoredEvent
from storage import BlobRef, BlobStore, UnusableBlobError, row_chain_digests
from training.advantages import RolloutOutcome
from training.batch import LogicalRollout, TrainingBatch, assemble_batch
from training.errors import BatchError, RowError
from training.forest import MASK_REASONS, CallRecord, Forest, MaskReason, build_forest
from training.rows import CallExtras, RowTensors, rollout_rows
from training.selection import CapturedCall, completion_mask_reason

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
    """

    rollouts_per_group: int
    groups_per_step: int
    row_multiple: int = 1
    pad_token_id: int = 0
    training_stream: str = "training"
    capture_prefix: str = ""
    forest_training: bool = True
    max_row_tokens: int | None = None

    def __post_init__(self) -> None:
        for name in ("rollouts_per_group", "groups_per_step", "row_multiple"):
            if getattr(self, name) < 1:
                raise BatchError(name, f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_row_tokens is not None and self.max_row_tokens < 1:
            raise BatchError(
                "max_row_tokens", f"max_row_tokens must be >= 1 or None, got {self.max_row_tokens}"
            )


@dataclass(frozen=True, eq=False)
class FinalizedRollout:
    """One logical rollout after finalization: its forest, reward, and rows as tensors."""

    capture_key: str
    rollout_id: str
    group_id: str
    reward: float
    forest: Forest
    rollout: LogicalRollout

    @property
    def outcome(self) -> RolloutOutcome:
        """The advantage stage's view of this rollout (no trainer diagnostics yet)."""
        return RolloutOutcome.from_forest(self.rollout_id, self.group_id, self.reward, self.forest)


@dataclass(frozen=True, eq=False)
class PublishedBatch:
    """The rows of one optimizer step, as published (or re-built) from the ledger."""

    step: int
    batch: TrainingBatch
    rollouts: tuple[FinalizedRollout, ...]
    position: LedgerPosition
    rebuilt: bool

    @property
    def outcomes(self) -> list[RolloutOutcome]:
        """One outcome per logical rollout, in batch order."""
        return [r.outcome for r in self.rollouts]


def captured_calls(state: AttemptState) -> list[CapturedCall]:
    """The attempt's calls as selection policies see them, in intent order.

    A commit recorded after the attempt settled (late) counts as pending: it never trains. A
    committed call the harness rejected stays committed with ``failure_reason``
    ``rejected_by_harness`` (``CapturedCall.rejected``): a rejection is not a failure, so
    ``all_captured`` keeps it as an abandoned retry, while ``returned_history`` never matches it.
    """
    records = []
    for call in state.calls.values():
        committed = call.committed
        status = CallStatus.PENDING.value if call.late else call.status.value
        records.append(
            CapturedCall(
                call_id=call.call_id,
                parent_id=call.parent_call_id,
                status=status,
                response_id=committed.response_id if committed else None,
                output_fingerprint=committed.output_fingerprint if committed else None,
                finish_reason=committed.finish_reason if committed else None,
                failure_reason=call.failure.reason if call.failure else None,
            )
        )
    return records


@dataclass
class _Progress:
    """What the projector has learned from the ledger so far."""

    mark: LedgerPosition = field(default_factory=lambda: LedgerPosition(position=0))
    events_read: int = 0
    dirty: set[str] = field(default_factory=set)
    finalized: dict[str, FinalizedRollout] = field(default_factory=dict)  # by rollout id
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> rollout ids
    complete: list[str] = field(default_factory=list)  # groups, in order of completion
    published: dict[int, BatchPublished] = field(default_factory=dict)  # step -> event
    published_rollouts: set[str] = field(default_factory=set)


class Projector:
    """Turns settled, selected attempts into finalized rollouts and published batches."""

    def __init__(self, store: EventStore, blobs: BlobStore, settings: ProjectorSettings) -> None:
        self.store = store
        self.blobs = blobs
        self.settings = settings
        self.log = AttemptLog(store)
        self._progress = _Progress()
        # Forests decided in this process, with their rows, kept until their finalized event is
        # read back.
        self._decided: dict[str, _Decision] = {}

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
        """Complete prompt groups none of whose rollouts has a row (no valid input layout), in
        order of completion: dropped, never published, so no step's metrics count them."""
        progress = self._progress
        return tuple(
            group
            for group in progress.complete
            if not any(progress.finalized[r].rollout.rows for r in progress.groups[group])
        )

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
        if stored.event_type == RolloutFinalized.type:
            self._join_group(stored.stream_id)
        elif stored.event_type in ("attempt.settled", "rollout.selected"):
            progress.dirty.add(stored.stream_id)

    def _maybe_finalize(self, capture_key: str) -> None:
        """Record the finalization of a settled, selected attempt (once per attempt)."""
        state = self.log.load(capture_key)
        if state.opened is None or state.settled is None or state.selection is None:
            return
        if state.finalized is None:
            self._record_finalization(state)

    def _join_group(self, capture_key: str) -> None:
        """A ``rollout.finalized`` was read: the rollout joins its group (first attempt wins)."""
        progress = self._progress
        state = self.log.load(capture_key)
        assert state.opened is not None
        if state.opened.rollout_id in progress.finalized:
            return
        rollout = self._reconstruct(state)
        progress.finalized[rollout.rollout_id] = rollout
        members = progress.groups.setdefault(rollout.group_id, [])
        members.append(rollout.rollout_id)
        if len(members) == self.settings.rollouts_per_group:
            progress.complete.append(rollout.group_id)

    # -- finalization ------------------------------------------------------------------------

    def _decide(self, state: AttemptState) -> _Decision:
        return _decide(
            state,
            self.blobs,
            forest_training=self.settings.forest_training,
            max_row_tokens=self.settings.max_row_tokens,
        )

    def _record_finalization(self, state: AttemptState) -> None:
        assert state.opened is not None
        decision = self._decide(state)
        self._decided[state.capture_key] = decision
        forest = decision.forest
        event = finalization_event(
            state.opened.rollout_id,
            forest,
            forest_training=self.settings.forest_training,
            max_row_tokens=self.settings.max_row_tokens,
        )
        self.log.finalize(state.capture_key, event)

    def _reconstruct(self, state: AttemptState) -> FinalizedRollout:
        """The finalized rollout with its rows, checked against the recorded decision."""
        assert state.opened is not None and state.selection is not None
        assert state.finalized is not None
        decision = self._decided.pop(state.capture_key, None) or self._decide(state)
        forest, rows = decision.forest, decision.rows
        recorded = state.finalized
        paths = tuple(tuple(row.call_ids) for row in forest.rows)
        if (recorded.trainable, recorded.paths) != (forest.trainable, paths):
            # The blobs or events changed since the decision (or the code, or the settings did):
            # never train on it. A recorded mask keeps its reason (its unselected blobs may
            # since have been cleaned); otherwise today's reason, or blob_invalid.
            kept = recorded.masked_reason if recorded.masked_reason in MASK_REASONS else None
            forest = _masked(forest, kept or forest.masked_reason or MaskReason.BLOB_INVALID)
            rows = ()
        return FinalizedRollout(
            capture_key=state.capture_key,
            rollout_id=state.opened.rollout_id,
            group_id=state.opened.prompt_group,
            reward=state.selection.reward,
            forest=forest,
            rollout=LogicalRollout(state.opened.rollout_id, state.opened.prompt_group, rows),
        )

    # -- publication -------------------------------------------------------------------------

    def batch_for_step(self, step: int, *, groups: int | None = None) -> PublishedBatch | None:
        """The batch of ``step``: re-built when already published, else newly published when
        enough complete groups wait (``groups``, default ``groups_per_step``: fewer when the
        caller knows some of the step's groups were dropped); None when it cannot be formed yet."""
        wanted = self.settings.groups_per_step if groups is None else groups
        if not 1 <= wanted <= self.settings.groups_per_step:
            raise BatchError(
                "groups",
                f"a step publishes 1 to {self.settings.groups_per_step} prompt groups, "
                f"asked for {wanted}",
            )
        progress = self._progress
        if step in progress.published:
            return self._rebuild(progress.published[step])
        if step != len(progress.published):
            raise BatchError(
                "step",
                f"step {step} cannot be published before step {len(progress.published)}",
            )
        waiting = [
            g
            for g in progress.complete
            if not set(progress.groups[g]) & progress.published_rollouts
            and any(progress.finalized[r].rollout.rows for r in progress.groups[g])
        ]
        if len(waiting) < wanted:
            return None
        chosen = waiting[:wanted]
        rollouts = [progress.finalized[r] for g in chosen for r in progress.groups[g]]
        batch = self._assemble(rollouts)
        event = BatchPublished(
            step=step,
            rollout_ids=tuple(r.rollout_id for r in rollouts),
            row_ids=tuple(
                f"{r.rollout_id}/{i}" for r in rollouts for i in range(len(r.rollout.rows))
            ),
            padding_row_ids=tuple(f"step-{step}/pad-{i}" for i in range(batch.num_padding_rows)),
            ledger_position=progress.mark,
        )
        try:
            self.store.append(self.settings.training_stream, [event], expected_version=step)
        except WrongExpectedVersion:
            self.poll()  # another projector published this step: take its batch
            return self.batch_for_step(step)
        progress.published[step] = event
        progress.published_rollouts.update(event.rollout_ids)
        return PublishedBatch(step, batch, tuple(rollouts), progress.mark, rebuilt=False)

    def _rebuild(self, event: BatchPublished) -> PublishedBatch:
        missing = [r for r in event.rollout_ids if r not in self._progress.finalized]
        if missing:
            raise BatchError(
                "published_rollout_missing",
                f"step {event.step} was published with rollouts {missing[:3]} that the ledger "
                "does not show as finalized; the ledger is inconsistent (replay it to see why)",
            )
        rollouts = [self._progress.finalized[r] for r in event.rollout_ids]
        return PublishedBatch(
            event.step, self._assemble(rollouts), tuple(rollouts), event.ledger_position, True
        )

    def _assemble(self, rollouts: Sequence[FinalizedRollout]) -> TrainingBatch:
        return assemble_batch(
            [r.rollout for r in rollouts],
            row_multiple=self.settings.row_multiple,
            pad_token_id=self.settings.pad_token_id,
        )


def _masked(forest: Forest, reason: str) -> Forest:
    return Forest([], [], MaskReason(reason), forest.selected, forest.terminal, forest.truncated)


@dataclass(frozen=True, eq=False)
class _Decision:
    """A finalization decision with what training needs of it: the forest (masked or not), its
    calls' extras and, when it trains, its rows as tensors."""

    forest: Forest
    extras: dict[str, CallExtras]
    rows: tuple[RowTensors, ...]


def finalization_forest(
    state: AttemptState,
    blobs: BlobStore,
    *,
    forest_training: bool = True,
    max_row_tokens: int | None = None,
) -> tuple[Forest, dict[str, CallExtras]]:
    """The forest the projector decides for a settled, selected attempt, and its calls' extras.

    Tokens come from the selected calls' blobs (sizes and digests verified, each row checked
    against the recorded chain digests); any failed check masks the forest with its reason; a
    forest that passes them all is then held to the settings (``setting_mask_reason``). The
    projector records ``rollout.finalized`` from it; ``grove replay --verify`` and ``grove show``
    call it on the attempt's state as it stood when that decision was recorded, with the
    projector's ``forest_training`` and ``max_row_tokens``: the decision depends on nothing else.
    The checks, in order: the ledger's lifecycle (``ledger_contradiction``), capture completion
    (``completion_mask_reason``, then calls still pending when the attempt settled), the blobs,
    the forest's own rules, the recorded chain digests, the rows as tensors (a ``RowError``:
    ``blob_invalid``), at least one owned generated token (``no_trainable_tokens``), then the
    settings (``setting_mask_reason``).
    """
    decision = _decide(state, blobs, forest_training=forest_training, max_row_tokens=max_row_tokens)
    return decision.forest, decision.extras


def _decide(
    state: AttemptState,
    blobs: BlobStore,
    *,
    forest_training: bool,
    max_row_tokens: int | None,
) -> _Decision:
    """``finalization_forest``'s decision, with the rows of a trainable forest as tensors."""
    assert state.selection is not None
    selection = state.selection
    selected = list(selection.call_ids)
    mask = (
        MaskReason.LEDGER_CONTRADICTION
        if state.contradictions
        else completion_mask_reason(captured_calls(state), selected)
    )
    if state.settled is not None and state.settled.pending_call_ids and mask is None:
        mask = MaskReason.CAPTURE_PENDING
    terminal = next(
        (
            c.call_id
            for c in state.calls.values()
            if c.committed and c.committed.response_id == selection.terminal_response_id
        ),
        None,
    )
    records, extras, blob_mask = _records(state, selected, blobs)
    forest = build_forest(records, selected, terminal=terminal)
    mask = mask or blob_mask or forest.masked_reason or _chain_mismatch(state, forest)
    rows: tuple[RowTensors, ...] = ()
    if mask is None:
        try:
            rows = tuple(rollout_rows(forest, extras))
        except RowError as error:
            mask = MaskReason(error.mask_reason)
    if mask is None and not any(1 in row.loss_mask for row in forest.rows):
        mask = MaskReason.NO_TRAINABLE_TOKENS
    mask = mask or setting_mask_reason(
        forest, forest_training=forest_training, max_row_tokens=max_row_tokens
    )
    if mask is not None:
        if forest.masked_reason != mask:
            forest = _masked(forest, mask)
        rows = ()
    return _Decision(forest, extras, rows)


def setting_mask_reason(
    forest: Forest, *, forest_training: bool = True, max_row_tokens: int | None = None
) -> MaskReason | None:
    """Why the projector's settings keep a forest from training, or None.

    ``forest_training_disabled`` when forest training is off and the forest has more than one
    path; else ``row_too_long`` when a row has more than ``max_row_tokens`` tokens (exactly
    ``max_row_tokens`` trains). A masked forest (no rows) passes.
    """
    if not forest_training and len(forest.rows) > 1:
        return MaskReason.FOREST_TRAINING_DISABLED
    if max_row_tokens is not None and any(len(r.token_ids) > max_row_tokens for r in forest.rows):
        return MaskReason.ROW_TOO_LONG
    return None


def finalization_event(
    rollout_id: str,
    forest: Forest,
    *,
    forest_training: bool = True,
    max_row_tokens: int | None = None,
) -> RolloutFinalized:
    """The ``rollout.finalized`` decision for ``forest``, made under the given settings: its
    paths and owned calls, or why it is masked."""
    return RolloutFinalized(
        rollout_id=rollout_id,
        trainable=forest.trainable,
        masked_reason=None if forest.trainable else str(forest.masked_reason),
        paths=tuple(tuple(row.call_ids) for row in forest.rows),
        owned=tuple(tuple(row.owned_call_ids) for row in forest.rows),
        forest_training=forest_training,
        max_row_tokens=max_row_tokens,
    )


def _records(
    state: AttemptState, selected: Sequence[str], blobs: BlobStore
) -> tuple[list[CallRecord], dict[str, CallExtras], str | None]:
    """Call records for the forest: tokens from the blobs of the selected calls."""
    wanted = set(selected)
    records, extras = [], {}
    for call in state.calls.values():
        committed = call.committed
        status = call.status.value
        if call.late:
            status = CallStatus.PENDING.value  # acknowledged after settling: never trains
        if committed is None or call.call_id not in wanted or call.late:
            records.append(CallRecord(call.call_id, call.parent_call_id, [], [], [], status))
            continue
        ref = BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        try:
            delta = blobs.get_delta(ref)
        except UnusableBlobError:
            return [], {}, MaskReason.BLOB_INVALID
        prompt, generated = delta.prompt_delta.tolist(), delta.generated.tolist()
        records.append(
            CallRecord(
                call.call_id,
                call.parent_call_id,
                prompt,
                generated,
                delta.logprobs.tolist(),
                status,
                committed.finish_reason,
            )
        )
        extras[call.call_id] = CallExtras(routes=delta.routes, media=delta.media)
    return records, extras, None


def _chain_mismatch(state: AttemptState, forest: Forest) -> str | None:
    """``blob_invalid`` when a row's tokens do not hash to its calls' recorded chain."""
    for row in forest.rows:
        lengths = [(s.generated_start - s.start, s.end - s.generated_start) for s in row.segments]
        recorded = [state.calls[c].committed.chain_digest for c in row.call_ids]
        if row_chain_digests(row.token_ids, lengths) != recorded:
            return MaskReason.BLOB_INVALID
    return None
