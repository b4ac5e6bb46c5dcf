"""Tree-packed logprobs: a micro batch's rows computed as token trees, shared prefixes once.

The trainer's ``LogprobFunction`` for ``policy.tree_packing`` (``docs/forest.md``, "Tree
layout"). For the rows of a micro batch:

1. Each row is cut after its last loss token (at least one token is kept): nothing after it can
   change a trained token's logprob in a causal model, so it is never computed.
2. Rows are grouped by their first token (rows that begin differently share nothing) and each
   group is laid out as one token tree (``grove.training.tree.pack_tree``): every distinct prefix
   once, depth-first, with position ids along each path.
3. The trees run as one batch of sequences, right-padded, each with its ancestor mask as a 4-D
   attention mask (boolean for ``sdpa`` attention; additive for ``eager``: 0 where a token may
   attend, the dtype's minimum elsewhere; a padding token sees only itself) and its position
   ids. When no group shares anything (every row is its own tree, e.g. chains) the rows run as
   plain causal sequences, as ``row_logprobs`` does.
4. Token ``i``'s logprob is read from the logits at its *parent* (not at ``i - 1``, which in the
   packed order may be another branch), then gathered back to row coordinates: the result is
   ``(r, T)`` like ``row_logprobs``, so the loss, diagnostics and every owned token counting once
   are unchanged. Position 0 and positions after a row's last loss token hold 0.0 (the loss and
   the diagnostics read loss tokens only).

The model is a Hugging Face causal LM called as ``model(input_ids, attention_mask=,
position_ids=, use_cache=False)``, which takes a 4-D mask as given (Llama- and Qwen2-style
models with the ``sdpa`` or ``eager`` attention do). Micro batches must keep the rows that share
work together: ``owner_micro_batches`` splits a step by whole logical rollouts.
"""

from __future__ import annotations

import torch

from grove.training.errors import BatchError
from grove.training.trainer import StepBatch, causal_token_logprobs
from grove.training.tree import TreeLayout, pack_tree

__all__ = ["micro_batch_trees", "owner_micro_batches", "tree_logprobs", "tree_row_lengths"]


def owner_micro_batches(batch: StepBatch, micro_batch_size: int) -> list[slice]:
    """Micro batches of whole logical rollouts, in order: consecutive rollouts join one while its
    rows stay within ``micro_batch_size`` (a rollout with more rows has a micro batch of its
    own); execution padding rows, which compute nothing, join the micro batch before them."""
    if micro_batch_size < 1:
        raise BatchError(
            "micro_batch_size", f"micro batch size must be >= 1, got {micro_batch_size}"
        )
    owners = batch.owners.tolist()
    slices: list[slice] = []
    start = 0
    rows_in_batch = 0
    run_start = 0
    while run_start < len(owners):
        run_end = run_start
        while run_end < len(owners) and owners[run_end] == owners[run_start]:
            run_end += 1
        weight = 0 if owners[run_start] < 0 else run_end - run_start
        if rows_in_batch and weight and rows_in_batch + weight > micro_batch_size:
            slices.append(slice(start, run_start))
            start, rows_in_batch = run_start, 0
        rows_in_batch += weight
        run_start = run_end
    slices.append(slice(start, len(owners)))
    return slices


def tree_row_lengths(loss_mask: torch.Tensor) -> torch.Tensor:
    """int64 ``(r,)``: each row's tokens up to and including its last loss token, at least 1."""
    columns = torch.arange(1, loss_mask.shape[1] + 1)
    return torch.where(loss_mask, columns, 0).amax(dim=1).clamp(min=1)


def tree_logprobs(model: torch.nn.Module, batch: StepBatch, rows: slice) -> torch.Tensor:
    """The ``LogprobFunction`` of ``policy.tree_packing``: the rows' logprobs ``(r, T)`` computed
    on their token trees (see the module), differentiable, in at least float32."""
    _refuse_unsupported(batch, rows)
    token_ids = batch.token_ids[rows]  # (r, T)
    layouts, members = micro_batch_trees(batch, rows)
    if all(layout.tokens == layout.row_tokens for layout in layouts):
        lengths = tree_row_lengths(batch.loss_mask[rows]).tolist()
        return _causal_rows(model, token_ids, lengths)
    return _tree_rows(model, token_ids, layouts, members)


def micro_batch_trees(batch: StepBatch, rows: slice) -> tuple[list[TreeLayout], list[list[int]]]:
    """The token trees of a micro batch's rows, each row cut after its last loss token: one tree
    per first token, and the rows (indices within the slice) each tree lays out, in order."""
    token_ids = batch.token_ids[rows]  # (r, T)
    lengths = tree_row_lengths(batch.loss_mask[rows]).tolist()
    groups: dict[int, list[int]] = {}
    for row, first in enumerate(token_ids[:, 0].tolist()):
        groups.setdefault(first, []).append(row)
    members = list(groups.values())
    layouts = [pack_tree([token_ids[row, : lengths[row]] for row in group]) for group in members]
    return layouts, members


def _causal_rows(
    model: torch.nn.Module, token_ids: torch.Tensor, lengths: list[int]
) -> torch.Tensor:
    """Nothing is shared: the rows as plain causal sequences, cut at their longest length."""
    width = max(lengths)
    logprobs = causal_token_logprobs(model, token_ids[:, :width])  # (r, width)
    kept = (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).to(logprobs.device)
    logprobs = torch.where(kept, logprobs, 0.0)
    return torch.nn.functional.pad(logprobs, (0, token_ids.shape[1] - width), value=0.0)


def _tree_rows(
    model: torch.nn.Module,
    token_ids: torch.Tensor,
    layouts: list[TreeLayout],
    members: list[list[int]],
) -> torch.Tensor:
    """Run the trees as one padded batch of sequences and gather each row's logprobs."""
    trees, width = len(layouts), max(layout.tokens for layout in layouts)
    dtype = _parameter_dtype(model)
    input_ids = torch.zeros(trees, width, dtype=torch.int64)
    position_ids = torch.zeros(trees, width, dtype=torch.int64)
    allowed = torch.eye(width, dtype=torch.bool).repeat(trees, 1, 1)  # padding sees itself
    parents = torch.empty(0, dtype=torch.int64)
    packed_parts = []
    for tree, layout in enumerate(layouts):
        size = layout.tokens
        input_ids[tree, :size] = layout.token_ids
        position_ids[tree, :size] = layout.position_ids
        allowed[tree, :size, :size] = layout.attention_mask()
        # Flat index of each token's parent logits; a root token reads its own (zeroed below).
        parent = torch.where(layout.parents >= 0, layout.parents, torch.arange(size))
        parents = torch.cat([parents, tree * width + parent])
        packed_parts.append(layout.token_ids)
    mask = _attention_mask(model, allowed[:, None], dtype)  # (B, 1, N, N)
    device = _parameter_device(model)
    output = model(
        input_ids.to(device),
        attention_mask=mask.to(device),
        position_ids=position_ids.to(device),
        use_cache=False,
    )
    logits = output.logits if hasattr(output, "logits") else output  # (B, N, V)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape[:2]) != (trees, width):
        raise BatchError(
            "model_output",
            "tree packing needs a model that returns logits (B, N, V) for input_ids (B, N) with "
            f"a 4-D attention mask; got {type(logits).__name__} for input {(trees, width)}",
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    packed_tokens = torch.cat(packed_parts).to(logits.device)
    predicted = logits.flatten(0, 1)[parents.to(logits.device)].log_softmax(dim=-1)  # (N, V)
    packed = predicted.gather(-1, packed_tokens[:, None]).squeeze(-1)  # (N,)
    is_root = torch.cat([layout.parents < 0 for layout in layouts]).to(logits.device)
    packed = torch.where(is_root, 0.0, packed)
    packed = torch.cat([packed, packed.new_zeros(1)])  # index N: "no token"
    rows, columns = token_ids.shape
    index = torch.full((rows, columns), packed.shape[0] - 1, dtype=torch.int64)
    offset = 0
    for layout, group in zip(layouts, members, strict=True):
        for slot, row in enumerate(group):
            positions = layout.row_positions[slot]
            index[row, : positions.shape[0]] = positions + offset
        offset += layout.tokens
    return packed[index.to(packed.device)]  # (r, T)


def _attention_mask(
    model: torch.nn.Module, allowed: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The 4-D mask as the model's attention takes it: boolean for ``sdpa`` (its kernels read
    it without an additive copy), else additive (0 where allowed, the dtype's minimum elsewhere:
    ``eager`` adds the mask to the scores)."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == "sdpa":
        return allowed
    mask = torch.zeros(allowed.shape, dtype=dtype)
    return mask.masked_fill_(~allowed, torch.finfo(dtype).min)


def _parameter_dtype(model: torch.nn.Module) -> torch.dtype:
    for parameter in model.parameters():
        if parameter.dtype.is_floating_point:
            return parameter.dtype
    return torch.get_default_dtype()


def _parameter_device(model: torch.nn.Module) -> torch.device:
    for parameter in model.parameters():
        return parameter.device
    return torch.device("cpu")


def _refuse_unsupported(batch: StepBatch, rows: slice) -> None:
    if batch.routes is not None:
        raise BatchError(
            "tree_packing_routes",
            "policy.tree_packing cannot replay routed experts yet: these rows carry routes; turn "
            "policy.tree_packing off for a mixture-of-experts model",
        )
    if any(media for media in batch.media[rows]):
        raise BatchError(
            "tree_packing_media",
            "policy.tree_packing cannot feed media yet: these rows carry images; turn "
            "policy.tree_packing off for a vision-language model",
        )
