"""Sequence packing: a step's rows in token-budget bins, each bin one sequence of separate rows.

``policy.sequence_packing`` (``docs/train.md``, "Sequence packing"). A step's rows vary in length;
padded micro batches of fixed row counts compute every row to the longest one. Packing instead:

1. gives each row a length: its tokens up to and including its last loss token, at least 1
   (``grove.training.tree_logprobs.tree_row_lengths``; nothing after the last loss token can
   change a trained logprob in a causal model, and a padding row costs one token);
2. shares the rows among the data-parallel shards, ``R / shards`` rows each (the row count only
   needs to be a multiple of the data-parallel size), longest first to the shard with the fewest
   tokens, so the shards' token counts are balanced;
3. packs each shard's rows into bins of at most ``train_mb_tokens`` tokens by first-fit
   decreasing, then splits bins (the fullest bin with several rows gives up its shortest row)
   until every shard has the same number of bins, so every rank runs the same number of forward
   and backward passes;
4. runs each bin as ONE sequence ``(1, N)``: position ids restart at 0 in every row and a
   block-diagonal causal mask keeps each row's attention inside the row (under flash attention no
   mask is passed: it reads each row's span from the restarting position ids, variable-length),
   so every row keeps its own attention context (no prefix computation is shared between rows).
   Token ``t`` of a row is read from the logits at the row's own ``t - 1``, then gathered back to
   row coordinates
   ``(r, T)``: the loss, the diagnostics and every owned token counting once are unchanged.

The trainer sees the rows reordered (shard by shard, bin by bin: ``TokenBudgetBins`` is its
``RowLayout``), so each bin is a slice and each shard a contiguous range of equal row count, as
``grove.training.row_sharding.shard_rows`` cuts it. The model is a Hugging Face causal LM that
takes a 4-D attention mask (``sdpa`` or ``eager`` attention: Llama, Qwen2 and the embedded model)
or runs flash attention, which finds packed rows from the position ids alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch

from grove.training.errors import BatchError
from grove.training.trainer import StepBatch
from grove.training.tree_logprobs import tree_row_lengths

__all__ = [
    "PackedRows",
    "PackingPlan",
    "TokenBudgetBins",
    "bin_logprobs",
    "first_fit_decreasing",
    "pack_rows",
    "packed_logprobs",
    "plan_bins",
    "recompute_packed_logprobs",
    "reordered",
]


@dataclass(frozen=True, eq=False)
class PackedRows:
    """Rows laid end to end as one sequence (producer: ``pack_rows``).

    ``lengths`` int64 ``(R,)``; ``offsets`` int64 ``(R + 1,)``, where each row starts (the
    ``cu_seqlens`` of variable-length attention); ``position_ids`` int64 ``(N,)``, restarting at
    0 in every row; ``slot_rows`` int64 ``(N,)``, the row of each position.
    """

    lengths: torch.Tensor
    offsets: torch.Tensor
    position_ids: torch.Tensor
    slot_rows: torch.Tensor

    @property
    def tokens(self) -> int:
        """``N``: the packed sequence's length."""
        return int(self.offsets[-1])

    def attention_mask(self) -> torch.Tensor:
        """bool ``(N, N)``: position ``i`` may attend to ``j`` when both are in one row and
        ``j <= i`` (block-diagonal causal)."""
        same_row = self.slot_rows[:, None] == self.slot_rows[None, :]
        return same_row & torch.ones(self.tokens, self.tokens, dtype=torch.bool).tril()


def pack_rows(lengths: torch.Tensor) -> PackedRows:
    """The packed layout of rows of ``lengths`` tokens (each >= 1), in order."""
    lengths = lengths.to(torch.int64)
    if lengths.ndim != 1 or lengths.numel() == 0 or bool((lengths < 1).any()):
        raise BatchError(
            "row_lengths", f"every packed row needs at least one token, got {lengths.tolist()}"
        )
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    slot_rows = torch.repeat_interleave(torch.arange(lengths.shape[0]), lengths)  # (N,)
    return PackedRows(
        lengths=lengths,
        offsets=offsets,
        position_ids=torch.arange(int(offsets[-1])) - offsets[slot_rows],
        slot_rows=slot_rows,
    )


def first_fit_decreasing(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Bins of row indices whose lengths sum to at most ``budget``: rows longest first (ties in
    index order), each into the first bin it fits, else a new one. Rows keep index order within
    a bin. Raises ``BatchError`` for a row longer than the budget."""
    if budget < 1:
        raise BatchError("bin_budget", f"a bin's token budget must be >= 1, got {budget}")
    too_long = [(row, length) for row, length in enumerate(lengths) if length > budget]
    if too_long:
        row, length = too_long[0]
        raise BatchError(
            "row_over_bin_budget",
            f"row {row} has {length} tokens, more than a bin's budget of {budget}: raise "
            "policy.sequence_packing.train_mb_tokens (and logprob_mb_tokens) to at least "
            "policy.max_total_sequence_length",
        )
    bins: list[list[int]] = []
    loads: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        for index, load in enumerate(loads):
            if load + lengths[row] <= budget:
                bins[index].append(row)
                loads[index] += lengths[row]
                break
        else:
            bins.append([row])
            loads.append(lengths[row])
    return [sorted(rows) for rows in bins]


@dataclass(frozen=True)
class PackingPlan:
    """A step's bins in execution order, ``shards`` shards of ``bins_per_shard`` bins each, each
    bin a tuple of row indices of the original batch (producer: ``plan_bins``; consumer:
    ``TokenBudgetBins``)."""

    bins: tuple[tuple[int, ...], ...]
    shards: int

    @property
    def bins_per_shard(self) -> int:
        """Every shard's bin count (the same on each)."""
        return len(self.bins) // self.shards

    def order(self) -> torch.Tensor:
        """int64 ``(R,)``: the original row index of each row of the reordered batch."""
        return torch.tensor([row for rows in self.bins for row in rows], dtype=torch.int64)

    def slices(self) -> list[slice]:
        """Each bin as a slice of the reordered batch."""
        slices, start = [], 0
        for rows in self.bins:
            slices.append(slice(start, start + len(rows)))
            start += len(rows)
        return slices


def plan_bins(lengths: Sequence[int], *, budget: int, shards: int) -> PackingPlan:
    """The bins of rows of ``lengths`` over ``shards`` data-parallel shards (the module's steps
    2 and 3). Raises ``BatchError`` when the row count is not a multiple of ``shards``."""
    rows = len(lengths)
    if shards < 1 or rows < 1 or rows % shards:
        raise BatchError(
            "rows_per_rank",
            f"a step's {rows} rows cannot be shared equally among {shards} data-parallel ranks: "
            "with sequence packing the projector pads every prompt group to a multiple of "
            "policy.data_parallel_size rows",
        )
    per_shard = rows // shards
    members: list[list[int]] = [[] for _ in range(shards)]
    tokens = [0] * shards
    for row in sorted(range(rows), key=lambda r: (-lengths[r], r)):
        shard = min(
            (s for s in range(shards) if len(members[s]) < per_shard),
            key=lambda s: (tokens[s], s),
        )
        members[shard].append(row)
        tokens[shard] += lengths[row]
    shard_bins = []
    for shard_rows in members:
        local = first_fit_decreasing([lengths[row] for row in shard_rows], budget)
        shard_bins.append([sorted(shard_rows[i] for i in rows_) for rows_ in local])
    target = max(len(bins) for bins in shard_bins)
    for bins in shard_bins:
        while len(bins) < target:  # always possible: a shard holds per_shard >= target rows
            fullest = max((b for b in bins if len(b) > 1), key=lambda b: sum(lengths[r] for r in b))
            shortest = min(fullest, key=lambda r: (lengths[r], -r))
            fullest.remove(shortest)
            bins.append([shortest])
    return PackingPlan(
        bins=tuple(tuple(rows_) for bins in shard_bins for rows_ in bins), shards=shards
    )


def reordered(batch: StepBatch, order: torch.Tensor) -> StepBatch:
    """``batch`` with its rows in ``order`` (a permutation of row indices); its logical side
    (owners' indices, rollouts) is unchanged."""
    return replace(
        batch,
        token_ids=batch.token_ids[order],
        loss_mask=batch.loss_mask[order],
        generation_logprobs=batch.generation_logprobs[order],
        advantages=batch.advantages[order],
        owners=batch.owners[order],
        row_mask=None if batch.row_mask is None else batch.row_mask[order],
        routes=None if batch.routes is None else batch.routes[order],
        media=tuple(batch.media[row] for row in order.tolist()) if batch.media else (),
    )


@dataclass(frozen=True)
class TokenBudgetBins:
    """The trainer's ``RowLayout`` for ``policy.sequence_packing``: the step's rows reordered into
    the bins of ``plan_bins`` (``tokens``: ``train_mb_tokens``; ``shards``: the data-parallel
    size), and each bin as a micro batch slice. The row micro batch size is not read."""

    tokens: int
    shards: int = 1

    def __call__(self, batch: StepBatch, micro_batch_size: int) -> tuple[StepBatch, list[slice]]:
        """The reordered batch and its bins (see the class)."""
        lengths = tree_row_lengths(batch.loss_mask).tolist()
        plan = plan_bins(lengths, budget=self.tokens, shards=self.shards)
        return reordered(batch, plan.order()), plan.slices()


def bin_logprobs(
    model: torch.nn.Module, token_ids: torch.Tensor, lengths: torch.Tensor
) -> torch.Tensor:
    """The logprobs ``(r, T)`` of the first ``lengths[i]`` tokens of each row of ``token_ids``
    (``(r, T)``), computed as one packed sequence (the module's step 4), differentiable, in at
    least float32; position 0 and positions from a row's length on hold 0.0."""
    attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
    layout = pack_rows(lengths)
    inside = torch.arange(token_ids.shape[1])[None, :] < layout.lengths[:, None]  # (r, T)
    flat = token_ids[inside.to(token_ids.device)]  # (N,), row by row: the packed order
    param = next(model.parameters())
    mask: torch.Tensor | None = None  # flash attention: variable-length, from the position ids
    if attention is None or not str(attention).startswith("flash"):
        allowed = layout.attention_mask()[None, None]  # (1, 1, N, N)
        if attention == "sdpa":
            mask = allowed
        else:  # eager adds the mask to the scores
            dtype = param.dtype if param.dtype.is_floating_point else torch.float32
            mask = torch.zeros(allowed.shape, dtype=dtype).masked_fill_(
                ~allowed, torch.finfo(dtype).min
            )
    output = model(
        flat[None].to(param.device),
        attention_mask=None if mask is None else mask.to(param.device),
        position_ids=layout.position_ids[None].to(param.device),
        use_cache=False,
    )
    logits = output.logits if hasattr(output, "logits") else output  # (1, N, V)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape[:2]) != (1, layout.tokens):
        raise BatchError(
            "model_output",
            "sequence packing needs a model that returns logits (1, N, V) for input_ids (1, N) "
            f"with a 4-D attention mask; got {type(logits).__name__} for {layout.tokens} tokens",
        )
    logits = logits[0].to(torch.promote_types(logits.dtype, torch.float32))  # (N, V)
    tokens = flat.to(logits.device)
    predicted = logits[:-1].log_softmax(-1).gather(-1, tokens[1:, None]).squeeze(-1)  # (N-1,)
    packed = torch.nn.functional.pad(predicted, (1, 0), value=0.0)  # (N,)
    packed = torch.where(layout.position_ids.to(packed.device) == 0, 0.0, packed)  # row starts
    return packed.new_zeros(inside.shape).masked_scatter(inside.to(packed.device), packed)


def packed_logprobs(model: torch.nn.Module, batch: StepBatch, rows: slice) -> torch.Tensor:
    """The trainer's ``LogprobFunction`` for ``policy.sequence_packing``: the rows of one bin as
    one packed sequence (``bin_logprobs``), each row up to its last loss token."""
    if batch.routes is not None or any(media for media in batch.media[rows]):
        raise BatchError(
            "packing_inputs",
            "policy.sequence_packing neither replays routed experts nor feeds media yet: these "
            "rows carry routes or images; turn policy.sequence_packing off for this model",
        )
    return bin_logprobs(model, batch.token_ids[rows], tree_row_lengths(batch.loss_mask[rows]))


@torch.no_grad()
def recompute_packed_logprobs(
    model: torch.nn.Module, token_ids: torch.Tensor, loss_mask: torch.Tensor, *, tokens: int
) -> torch.Tensor:
    """The logprob-only recompute ``(R, T)`` in bins of at most ``tokens`` tokens
    (``policy.sequence_packing.logprob_mb_tokens``), each row up to its last loss token, in eval
    mode; the model's train/eval mode is restored afterwards."""
    lengths = tree_row_lengths(loss_mask)
    result: torch.Tensor | None = None
    was_training = model.training
    model.eval()
    try:
        for rows in first_fit_decreasing(lengths.tolist(), tokens):
            index = torch.tensor(rows, dtype=torch.int64)
            part = bin_logprobs(model, token_ids[index], lengths[index])
            if result is None:
                result = part.new_zeros(token_ids.shape)
            result[index.to(part.device)] = part
    finally:
        model.train(was_training)
    assert result is not None  # a batch has at least one row
    return result
