"""Finalization: the decision the projector records for a settled, selected attempt.

``finalization_forest`` reconstructs the attempt's forest from the selected calls' delta blobs
(sizes and digests verified, each row checked against the calls' recorded chain digests) and
decides: trainable with its paths and owned calls, or masked with a reason (capture incomplete, a
failed or pending call, a missing or corrupt blob, routes or media that do not fit a row, no owned
generated token, selection not closed, ...; ``docs/forest.md``, "Failures and drops"). Rows are
built as tensors before the decision, and their images held to the model's media rules when given
(``media_invalid``, ``training/media_checks.py``), so a ``RowError`` masks its rollout rather than
escaping.
Two settings can mask an otherwise trainable rollout as well: with ``forest_training`` off, a
forest of more than one path (``forest_training_disabled``); with ``max_row_tokens``, a forest with
a longer row (``row_too_long``). The whole rollout is masked in every case, never part of its
history. ``finalization_event`` is the ``rollout.finalized`` the projector records from it;
``grove replay --verify`` and ``grove show`` run the same code on the recorded state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grove.ledger.attempt import AttemptState, CallState, CallStatus
from grove.ledger.events import CallCommitted, RolloutFinalized, SourceCall
from grove.storage import BlobRef, BlobStore, MediaTensor, UnusableBlobError, row_chain_digests
from grove.training.errors import RowError
from grove.training.forest import CallRecord, Forest, ForestRow, MaskReason, build_forest
from grove.training.media_checks import MediaRules, check_row_media
from grove.training.rows import CallExtras, MediaItem, RowTensors, rollout_rows
from grove.training.selection import CapturedCall, completion_mask_reason, source_id

__all__ = [
    "Decision",
    "call_policy_versions",
    "captured_calls",
    "decide",
    "finalization_event",
    "finalization_forest",
    "masked_forest",
    "recorded_media_rules",
    "setting_mask_reason",
    "source_id",
]


def captured_calls(state: AttemptState) -> list[CapturedCall]:
    """The attempt's calls as selection policies see them, in intent order.

    A fork's source chain comes first, as committed calls named ``source_id`` (their answers
    open a fork's returned history; their tokens are context only, ``docs/fork.md``).
    A commit recorded after the attempt settled (late) counts as pending: it never trains. A
    committed call the harness rejected stays committed with ``failure_reason``
    ``rejected_by_harness`` (``CapturedCall.rejected``): a rejection is not a failure, so
    ``all_captured`` keeps it as an abandoned retry, while ``returned_history`` never matches it.
    """
    records = _source_captured_calls(_fork_chain(state))
    for call in state.calls.values():
        committed = call.committed
        status = CallStatus.PENDING.value if call.late else call.status.value
        records.append(
            CapturedCall(
                call_id=call.call_id,
                parent_id=_parent_id(call),
                status=status,
                response_id=committed.response_id if committed else None,
                output_fingerprint=committed.output_fingerprint if committed else None,
                finish_reason=committed.finish_reason if committed else None,
                failure_reason=call.failure.reason if call.failure else None,
            )
        )
    return records


def call_policy_versions(state: AttemptState, call_ids: Sequence[str]) -> tuple[int, ...]:
    """The known policy versions of ``call_ids``, ascending and distinct: each call's generation
    version (``call.committed``), else the version served at its admission (``call.intended``);
    a call that records neither adds nothing."""
    versions = set()
    for call_id in call_ids:
        call = state.calls.get(call_id)
        if call is None:
            continue  # a fork's source call (``source_id``): context, its own attempt's

        committed = call.committed.policy_version if call.committed else None
        version = committed if committed is not None else call.intended.policy_version
        if version is not None:
            versions.add(version)
    return tuple(sorted(versions))


def masked_forest(forest: Forest, reason: str) -> Forest:
    """``forest`` with no rows, masked with ``reason`` (its selection, terminal and truncation
    kept)."""
    return Forest([], [], MaskReason(reason), forest.selected, forest.terminal, forest.truncated)


@dataclass(frozen=True, eq=False)
class Decision:
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
    media_rules: MediaRules | None = None,
) -> tuple[Forest, dict[str, CallExtras]]:
    """The forest the projector decides for a settled, selected attempt, and its calls' extras.

    Tokens come from the selected calls' blobs (sizes and digests verified, each row checked
    against the recorded chain digests); any failed check masks the forest with its reason; a
    forest that passes them all is then held to the settings (``setting_mask_reason``). The
    projector records ``rollout.finalized`` from it; ``grove replay --verify`` and ``grove show``
    call it on the attempt's state as it stood when that decision was recorded, with the
    projector's ``forest_training``, ``max_row_tokens`` and ``media_rules`` (all three recorded
    on the event): the decision depends on nothing else.
    The checks, in order: the ledger's lifecycle (``ledger_contradiction``), capture completion
    (``completion_mask_reason``, then calls still pending when the attempt settled), the blobs,
    the forest's own rules, the recorded chain digests, the rows as tensors (a ``RowError``:
    ``blob_invalid``, or ``route_missing`` for a route missing inside a row), with
    ``media_rules`` the rows' images held to the model's rules (``media_invalid``,
    ``training/media_checks.py``),
    at least one owned generated token (``no_trainable_tokens``), then the settings
    (``setting_mask_reason``).
    """
    decision = decide(
        state,
        blobs,
        forest_training=forest_training,
        max_row_tokens=max_row_tokens,
        media_rules=media_rules,
    )
    return decision.forest, decision.extras


def decide(
    state: AttemptState,
    blobs: BlobStore,
    *,
    forest_training: bool,
    max_row_tokens: int | None,
    media_rules: MediaRules | None = None,
) -> Decision:
    """``finalization_forest``'s decision, with the rows of a trainable forest as tensors."""
    selection = state.recorded_selection()
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
    chain = _forked_chain(state, selected)
    context = [source_id(c.capture_key, c.call_id) for c in chain]
    selected = [c for c in selected if c not in context]  # source calls a history returned
    records, extras, blob_mask = _records(state, selected, blobs)
    source_records, source_extras, source_mask = _source_records(chain, blobs)
    extras.update(source_extras)
    forest = build_forest(
        [*records, *source_records], [*context, *selected], terminal=terminal, context=context
    )
    digests = {source_id(c.capture_key, c.call_id): c.chain_digest for c in chain}
    mask = (
        mask
        or blob_mask
        or source_mask
        or forest.masked_reason
        or _chain_mismatch(state, forest, extras, digests)
    )
    rows: tuple[RowTensors, ...] = ()
    if mask is None:
        try:
            rows = tuple(rollout_rows(forest, extras))
            if media_rules is not None:
                check_row_media(rows, media_rules)
        except RowError as error:
            mask = MaskReason(error.mask_reason)
    if mask is None and not any(_owns_tokens(row) for row in forest.rows):
        mask = MaskReason.NO_TRAINABLE_TOKENS
    mask = mask or setting_mask_reason(
        forest, forest_training=forest_training, max_row_tokens=max_row_tokens
    )
    if mask is not None:
        if forest.masked_reason != mask:
            forest = masked_forest(forest, mask)
        rows = ()
    return Decision(forest, extras, rows)


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
    if max_row_tokens is not None and any(r.length > max_row_tokens for r in forest.rows):
        return MaskReason.ROW_TOO_LONG
    return None


def finalization_event(
    rollout_id: str,
    forest: Forest,
    *,
    forest_training: bool = True,
    max_row_tokens: int | None = None,
    media_rules: MediaRules | None = None,
) -> RolloutFinalized:
    """The ``rollout.finalized`` decision for ``forest``, made under the given settings (the
    media rules recorded as ``media_image_token_id`` and ``media_merge_size``): its paths and
    owned calls, or why it is masked."""
    return RolloutFinalized(
        rollout_id=rollout_id,
        trainable=forest.trainable,
        masked_reason=None if forest.trainable else str(forest.masked_reason),
        paths=tuple(tuple(row.call_ids) for row in forest.rows),
        owned=tuple(tuple(row.owned_call_ids) for row in forest.rows),
        forest_training=forest_training,
        max_row_tokens=max_row_tokens,
        media_image_token_id=media_rules.image_token_id if media_rules else None,
        media_merge_size=media_rules.merge_size if media_rules else None,
    )


def recorded_media_rules(event: RolloutFinalized) -> MediaRules | None:
    """The media rules ``event``'s decision held its images to (None: none were checked)."""
    if event.media_image_token_id is None or event.media_merge_size is None:
        return None
    return MediaRules(event.media_image_token_id, event.media_merge_size)


def _records(
    state: AttemptState, selected: Sequence[str], blobs: BlobStore
) -> tuple[list[CallRecord], dict[str, CallExtras], MaskReason | None]:
    """Call records for the forest: tokens from the blobs of the selected calls."""
    wanted = set(selected)
    records, extras = [], {}
    for call in state.calls.values():
        committed = call.committed
        status = call.status.value
        if call.late:
            status = CallStatus.PENDING.value  # acknowledged after settling: never trains
        parent = _parent_id(call)
        if committed is None or call.call_id not in wanted or call.late:
            records.append(CallRecord(call.call_id, parent, [], [], [], status))
            continue
        try:
            record, extra = _blob_record(call.call_id, parent, blobs, committed, status)
        except UnusableBlobError:
            return [], {}, MaskReason.BLOB_INVALID
        records.append(record)
        extras[call.call_id] = extra
    return records, extras, None


def _source_captured_calls(chain: Sequence[SourceCall]) -> list[CapturedCall]:
    """A fork's source chain as committed calls named ``source_id``, each the parent of the
    next."""
    records: list[CapturedCall] = []
    for source in chain:
        records.append(
            CapturedCall(
                call_id=source_id(source.capture_key, source.call_id),
                parent_id=records[-1].call_id if records else None,
                status=CallStatus.COMMITTED.value,
                response_id=source.response_id,
                output_fingerprint=source.output_fingerprint,
                finish_reason=source.finish_reason,
            )
        )
    return records


def _parent_id(call: CallState) -> str | None:
    """The id of ``call``'s parent as a fork's rows name it: ``source_id`` for a parent in the
    fork source, the parent's own call id otherwise."""
    source, parent = call.intended.source_capture_key, call.parent_call_id
    return parent if source is None or parent is None else source_id(source, parent)


def _fork_chain(state: AttemptState) -> tuple[SourceCall, ...]:
    """The source chain of a fork (none for an attempt that forks nothing)."""
    opened = state.opened
    return () if opened is None or opened.fork_from is None else opened.fork_from.chain


def _forked_chain(state: AttemptState, selected: Sequence[str]) -> tuple[SourceCall, ...]:
    """The source chain a fork's selected calls continue (none when no selected call has a
    parent in the fork source, or the attempt forks nothing)."""
    continues = any(
        call_id in state.calls and state.calls[call_id].intended.source_capture_key is not None
        for call_id in selected
    )
    return _fork_chain(state) if continues else ()


def _source_records(
    chain: Sequence[SourceCall], blobs: BlobStore
) -> tuple[list[CallRecord], dict[str, CallExtras], MaskReason | None]:
    """Call records of a fork's source chain, from the blobs its opening recorded."""
    records, extras = [], {}
    parent: str | None = None
    for call in chain:
        call_id = source_id(call.capture_key, call.call_id)
        try:
            record, extra = _blob_record(call_id, parent, blobs, call)
        except UnusableBlobError:
            return [], {}, MaskReason.BLOB_INVALID
        records.append(record)
        extras[call_id] = extra
        parent = call_id
    return records, extras, None


def _blob_record(
    call_id: str,
    parent: str | None,
    blobs: BlobStore,
    committed: CallCommitted | SourceCall,
    status: str = CallStatus.COMMITTED.value,
) -> tuple[CallRecord, CallExtras]:
    """A committed call's record and extras from its delta blob (``UnusableBlobError``: missing
    or corrupt)."""
    delta = blobs.get_delta(
        BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
    )
    record = CallRecord.from_arrays(  # over the tensors: the forest reads lengths, never lists
        call_id,
        parent,
        delta.prompt_delta,
        delta.generated,
        delta.logprobs,
        status,
        committed.finish_reason,
    )
    extra = CallExtras(
        routes=delta.routes,
        media=_media_items(delta.media),
        # The same tokens as tensors: rows are concatenated from them (training/rows.py).
        prompt_tokens=delta.prompt_delta,
        generated_tokens=delta.generated,
        logprobs=delta.logprobs,
    )
    return record, extra


def _media_items(media: Sequence[MediaTensor]) -> tuple[MediaItem, ...]:
    """A decoded blob's media (descriptor and pixels) as rows take them; for an image,
    ``frames`` x ``height`` x ``width`` is its processor's patch grid (``docs/media.md``)."""
    return tuple(
        MediaItem(
            media_id=item.descriptor.media_id,
            kind=item.descriptor.kind,
            token_start=item.descriptor.token_start,
            token_end=item.descriptor.token_end,
            height=item.descriptor.height,
            width=item.descriptor.width,
            frames=item.descriptor.frames,
            pixels=item.pixels,
            digest=item.descriptor.digest,
        )
        for item in media
    )


def _owns_tokens(row: ForestRow) -> bool:
    """Whether the row owns a generated token (its loss mask has a 1)."""
    return any(s.owned and s.end > s.generated_start for s in row.segments)


def _chain_mismatch(
    state: AttemptState,
    forest: Forest,
    extras: dict[str, CallExtras],
    source_digests: dict[str, str],
) -> MaskReason | None:
    """``blob_invalid`` when a row's tokens do not hash to its calls' recorded chain (a fork's
    source calls: the digests its opening recorded, ``source_digests``)."""
    for row in forest.rows:
        lengths = [(s.generated_start - s.start, s.end - s.generated_start) for s in row.segments]
        recorded = []
        for call_id in row.call_ids:
            if call_id in source_digests:
                recorded.append(source_digests[call_id])
                continue
            committed = state.calls[call_id].committed
            assert committed is not None  # a trainable forest's rows: selected, committed calls
            recorded.append(committed.chain_digest)
        if row_chain_digests(_row_token_ids(row, extras), lengths) != recorded:
            return MaskReason.BLOB_INVALID
    return None


def _row_token_ids(row: ForestRow, extras: dict[str, CallExtras]) -> torch.Tensor | list[int]:
    """The row's token ids from its calls' token tensors (its lists when a call has none)."""
    pieces: list[torch.Tensor] = []
    for call_id in row.call_ids:
        extra = extras.get(call_id)
        if extra is None or extra.prompt_tokens is None or extra.generated_tokens is None:
            return row.token_ids
        pieces += [extra.prompt_tokens, extra.generated_tokens]
    return torch.cat(pieces)
