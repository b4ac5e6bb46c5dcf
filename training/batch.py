"""Training batches: rows of whole prompt groups, padded to the execution row multiple.

A batch holds logical rollouts (the unit of reward, advantage and scheduler steps) and their
physical rows. ``parent_indices`` is the single source of truth for the logical-to-physical
fan-out (``docs/forest.md``): row ``r`` belongs to logical rollout
``parent_indices[r]``, or is execution padding when it is ``-1``. Every consumer — advantage
broadcast, pooled diagnostics, loss masking — derives from it.

Padding is per prompt group (``docs/forest.md``): each group's row count is rounded
up to a multiple of the execution row multiple (data-parallel size x microbatch size for fixed
batches; the data-parallel size with sequence packing), so whole groups can be sharded without
splitting a rollout's advantage computation. A padding row is one ``pad_token_id`` token with no
loss, no logprob, no route and no media.

Two layouts of the same rows: the padded ``(R, L)`` tensors of ``TrainingBatch`` and the packed
``(N,)`` layout of ``PackedBatch`` with ``cu_seqlens`` for variable-length attention; packing keeps
rows as separate attention contexts and shares no prefix computation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grove.training.errors import BatchError
from grove.training.rows import ROUTE_MISSING_SENTINEL, RowMedia, RowTensors

__all__ = [
    "LogicalRollout",
    "PackedBatch",
    "TrainingBatch",
    "assemble_batch",
]


@dataclass(frozen=True, eq=False)
class LogicalRollout:
    """One logical rollout as the batch receives it (producer: the projector).

    ``rows`` are its forest rows as tensors, empty when the rollout is masked: it still counts as
    one logical rollout of its group (with zero advantage), but has nothing to train.
    """

    rollout_id: str
    group_id: str
    rows: tuple[RowTensors, ...]


@dataclass(frozen=True, eq=False)
class PackedBatch:
    """The batch's rows concatenated into one sequence (producer: ``TrainingBatch.packed``).

    ``input_ids``, ``position_ids`` (restarting at 0 per row), ``loss_mask``,
    ``generation_logprobs`` and ``token_rows`` (row index per token) are ``(N,)``; ``routes`` is
    ``(N, layers, top_k)`` (``(N, top_k)`` for routes stored without a layer axis) or None.
    ``cu_seqlens`` int32 ``(R + 1,)`` holds row boundaries; ``parent_indices`` is the batch's,
    ``(R,)``.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    token_rows: torch.Tensor
    routes: torch.Tensor | None
    cu_seqlens: torch.Tensor
    max_seqlen: int
    parent_indices: torch.Tensor


@dataclass(frozen=True, eq=False)
class TrainingBatch:
    """Rows of whole prompt groups for one optimizer step (producer: ``assemble_batch``;
    consumers: advantages, loss, the trainer, the ``batch.published`` event).

    Logical side, ``(N,)``: ``rollout_ids`` (owner index ``i`` is ``rollout_ids[i]``) and
    ``rollout_groups`` (index into ``group_ids``). Physical side, ``(R,)`` with ``R`` a multiple
    of ``row_multiple``: ``parent_indices`` (int64, -1 for padding), ``row_groups`` (int64, the
    group a row or padding row belongs to), ``row_lengths`` (int64). Padded ``(R, L)`` tensors,
    right-padded with ``pad_token_id``: ``input_ids`` int64, ``attention_mask`` bool,
    ``loss_mask`` bool, ``generation_logprobs`` float32; ``routes`` int32
    ``(R, L, layers, top_k)`` (``(R, L, top_k)`` for routes stored without a layer axis) or None
    (sentinel outside real tokens); ``media`` per row; ``row_call_ids`` per row (empty for
    padding).
    """

    rollout_ids: tuple[str, ...]
    rollout_groups: torch.Tensor
    group_ids: tuple[str, ...]
    parent_indices: torch.Tensor
    row_groups: torch.Tensor
    row_lengths: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    routes: torch.Tensor | None
    media: tuple[tuple[RowMedia, ...], ...]
    row_call_ids: tuple[tuple[str, ...], ...]
    row_multiple: int

    @property
    def num_rollouts(self) -> int:
        """Logical rollouts: batch cardinality, and the scheduler's step increment."""
        return len(self.rollout_ids)

    @property
    def num_rows(self) -> int:
        """Physical rows, padding included."""
        return int(self.parent_indices.shape[0])

    @property
    def num_padding_rows(self) -> int:
        """Execution padding rows."""
        return int((self.parent_indices < 0).sum())

    def token_owners(self) -> torch.Tensor:
        """``(R, L)`` int64: each real token's logical owner index, -1 on padding."""
        owners = self.parent_indices[:, None].expand_as(self.input_ids)
        return torch.where(self.attention_mask, owners, -1)

    def packed(self) -> PackedBatch:
        """The same rows in the packed layout, with ``cu_seqlens``."""
        mask = self.attention_mask
        positions = torch.arange(mask.shape[1]).expand_as(mask)
        rows = torch.arange(mask.shape[0])[:, None].expand_as(mask)
        cu_seqlens = torch.zeros(self.num_rows + 1, dtype=torch.int32)
        cu_seqlens[1:] = torch.cumsum(self.row_lengths, 0)
        return PackedBatch(
            input_ids=self.input_ids[mask],
            position_ids=positions[mask],
            loss_mask=self.loss_mask[mask],
            generation_logprobs=self.generation_logprobs[mask],
            token_rows=rows[mask],
            routes=self.routes[mask] if self.routes is not None else None,
            cu_seqlens=cu_seqlens,
            max_seqlen=int(self.row_lengths.max()),
            parent_indices=self.parent_indices,
        )


def assemble_batch(
    rollouts: Sequence[LogicalRollout], *, row_multiple: int, pad_token_id: int = 0
) -> TrainingBatch:
    """Lay out whole prompt groups, each padded to a multiple of ``row_multiple`` rows.

    ``rollouts`` lists every logical rollout of the step, each group's rollouts contiguous; a
    group with no rows at all has no valid layout and must be dropped first
    (``grove.training.advantages.group_decisions``). Logical order is the given order; rows follow
    their rollouts, padding ends each group.
    """
    if isinstance(row_multiple, bool) or not isinstance(row_multiple, int) or row_multiple < 1:
        raise BatchError(
            "row_multiple",
            f"the execution row multiple must be an integer >= 1, got {row_multiple!r}",
        )
    if not rollouts:
        raise BatchError("empty_batch", "a batch needs at least one logical rollout")
    group_ids: list[str] = []
    rollout_groups: list[int] = []
    seen_rollouts: set[str] = set()
    for rollout in rollouts:
        if rollout.rollout_id in seen_rollouts:
            raise BatchError("duplicate_rollout", f"rollout {rollout.rollout_id!r} appears twice")
        seen_rollouts.add(rollout.rollout_id)
        if not group_ids or group_ids[-1] != rollout.group_id:
            if rollout.group_id in group_ids:
                raise BatchError(
                    "group_not_contiguous",
                    f"rollouts of group {rollout.group_id!r} must be contiguous; a batch takes "
                    "whole prompt groups in order",
                )
            group_ids.append(rollout.group_id)
        rollout_groups.append(len(group_ids) - 1)
    rows: list[RowTensors | None] = []
    parents: list[int] = []
    row_groups: list[int] = []
    for group_index, group_id in enumerate(group_ids):
        members = [i for i, g in enumerate(rollout_groups) if g == group_index]
        group_rows = [(i, row) for i in members for row in rollouts[i].rows]
        if not group_rows:
            raise BatchError(
                "group_without_rows",
                f"group {group_id!r} has no trainable row (no valid layout); drop it before "
                "assembling the batch",
            )
        padding = -len(group_rows) % row_multiple
        rows += [row for _, row in group_rows] + [None] * padding
        parents += [i for i, _ in group_rows] + [-1] * padding
        row_groups += [group_index] * (len(group_rows) + padding)
    return _pad_rows(
        rows,
        rollout_ids=tuple(r.rollout_id for r in rollouts),
        rollout_groups=rollout_groups,
        group_ids=tuple(group_ids),
        parents=parents,
        row_groups=row_groups,
        row_multiple=row_multiple,
        pad_token_id=pad_token_id,
    )


def _pad_rows(
    rows: list[RowTensors | None],
    *,
    rollout_ids: tuple[str, ...],
    rollout_groups: list[int],
    group_ids: tuple[str, ...],
    parents: list[int],
    row_groups: list[int],
    row_multiple: int,
    pad_token_id: int,
) -> TrainingBatch:
    """Right-pad the rows into ``(R, L)`` tensors; ``None`` is an execution padding row."""
    real_rows = [row for row in rows if row is not None]
    routed = [row.routes for row in real_rows if row.routes is not None]
    top_ks = {tuple(r.shape[1:]) for r in routed}
    if routed and (len(routed) != len(real_rows) or len(top_ks) > 1):
        raise BatchError(
            "routes_inconsistent",
            "every row must carry routes of one ([layers,] top_k) shape, or none does; got "
            f"{sorted(top_ks)} on {len(routed)} of {len(real_rows)} rows",
        )
    pad_ids = torch.full((1,), pad_token_id, dtype=torch.int64)
    no_loss = torch.zeros(1, dtype=torch.bool)
    no_logprob = torch.zeros(1, dtype=torch.float32)
    lengths = torch.tensor([row.length if row is not None else 1 for row in rows])
    width = int(lengths.max())
    routes = None
    if routed:
        no_route = torch.full((1, *top_ks.pop()), ROUTE_MISSING_SENTINEL, dtype=torch.int32)
        routes = _padded(
            [r.routes if r and r.routes is not None else no_route for r in rows],
            ROUTE_MISSING_SENTINEL,
        )
    return TrainingBatch(
        rollout_ids=rollout_ids,
        rollout_groups=torch.tensor(rollout_groups, dtype=torch.int64),
        group_ids=group_ids,
        parent_indices=torch.tensor(parents, dtype=torch.int64),
        row_groups=torch.tensor(row_groups, dtype=torch.int64),
        row_lengths=lengths,
        input_ids=_padded([r.token_ids if r else pad_ids for r in rows], pad_token_id),
        attention_mask=torch.arange(width)[None, :] < lengths[:, None],
        loss_mask=_padded([r.loss_mask if r else no_loss for r in rows], False),
        generation_logprobs=_padded(
            [r.generation_logprobs if r else no_logprob for r in rows], 0.0
        ),
        routes=routes,
        media=tuple(row.media if row is not None else () for row in rows),
        row_call_ids=tuple(row.call_ids if row is not None else () for row in rows),
        row_multiple=row_multiple,
    )


def _padded(tensors: list[torch.Tensor], value: float | bool) -> torch.Tensor:
    """Stack rows of different lengths, right-padded with ``value``: ``(R, L, ...)``."""
    return torch.nn.utils.rnn.pad_sequence(tensors, batch_first=True, padding_value=value)
