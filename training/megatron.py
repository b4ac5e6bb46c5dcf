"""Packed forest rows as megatron-core inputs: one ``thd`` sequence, ``PackedSeqParams`` and back.

Megatron-core trains packed rows as one sequence of ``N`` tokens with ``qkv_format="thd"``:
attention stays inside each row because ``cu_seqlens`` marks the row boundaries, and positions
restart at 0 in every row, so each row keeps its own attention context (no prefix is shared
between rows: packing never shares prefix computation). Megatron's GPT convention differs from
Grove's row convention by one position:

- Grove (``grove.training.batch``): position ``t`` of a row holds token ``t``, its loss-mask bit and
its
  generation logprob (the logprob of token ``t`` given the tokens before it).
- Megatron: position ``t`` predicts ``labels[t]``, the next token; ``loss_mask[t]`` applies to that
  prediction. So ``labels[t] = token[t + 1]`` and ``loss_mask[t] = grove_mask[t + 1]`` within a
  row; a row's last position predicts nothing (label ``pad_token_id``, mask 0) — the shift never
  crosses a row boundary.

``pad_to_multiple`` pads every row to a multiple of its value (context parallelism needs
``2 x cp_size``; FP8 needs 16): offsets then come from ``cu_seqlens_padded`` and the real lengths
from ``cu_seqlens``, the megatron/Transformer Engine convention. ``unpack_to_rows`` maps per
position values (the logprob of each label) back to Grove's ``(R, L)`` row layout, so the same
loss (``grove.training.loss``) serves both learners.

Megatron-core is optional: only ``packed_seq_params`` imports it, and raises
``MegatronUnavailable`` when it is missing. On CPU, megatron-core 0.16.1 (the newest release for
Python 3.11; 0.17 and later need Python 3.12) cannot run a GPT forward pass at all, packed or not:
packed ``thd`` attention needs Transformer Engine's ``TEDotProductAttention`` (the local
``DotProductAttention`` asserts ``packed_seq_params is None``), and even unpacked, the local
attention allocates its score buffer on ``torch.cuda.current_device()``
(``parallel_state.get_global_memory_buffer``), rotary embeddings move ``inv_freq`` to CUDA, and
``model_parallel_cuda_manual_seed`` needs CUDA. The equivalence of packed and unpacked rows is
therefore tested on CPU with a transformers model given the block-diagonal mask these inputs
describe.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import torch

from grove.training.batch import PackedBatch
from grove.training.errors import BatchError, TrainingError

__all__ = [
    "MegatronPackedInputs",
    "MegatronUnavailable",
    "label_logprobs",
    "pack_for_megatron",
    "packed_seq_params",
    "unpack_to_rows",
]


class MegatronUnavailable(TrainingError, ImportError):
    """megatron-core is not importable in this environment."""

    def __init__(self, detail: str) -> None:
        super().__init__(
            "megatron_unavailable",
            f"megatron-core is required for the Megatron learner but cannot be imported "
            f"({detail}); install it (pip install megatron-core) or disable "
            "policy.megatron_cfg.enabled",
        )


@dataclass(frozen=True, eq=False)
class MegatronPackedInputs:
    """One micro batch of rows for a megatron-core GPT forward (producer: ``pack_for_megatron``;
    consumers: the Megatron learner and ``unpack_to_rows``).

    ``input_ids``, ``position_ids`` (restarting at 0 per row), ``labels`` (the next token of the
    same row) int64 and ``loss_mask``, ``generation_logprobs`` (of each label) float32 are
    ``(1, N)`` with ``N = cu_seqlens_padded[-1]``; ``owners`` int64 ``(1, N)`` is each position's
    logical owner, -1 on padding. ``cu_seqlens`` int32 ``(R + 1,)`` are the real row boundaries
    (cumulative lengths); ``cu_seqlens_padded`` int32 ``(R + 1,)`` the row offsets in the packed
    sequence, equal to ``cu_seqlens`` when ``pad_to_multiple`` is 1. ``max_seqlen`` is the longest
    padded row.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    owners: torch.Tensor
    cu_seqlens: torch.Tensor
    cu_seqlens_padded: torch.Tensor
    max_seqlen: int

    @property
    def rows(self) -> int:
        """Rows in the packed sequence."""
        return int(self.cu_seqlens.shape[0]) - 1

    @property
    def row_lengths(self) -> torch.Tensor:
        """int64 ``(R,)``: each row's real token count."""
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).to(torch.int64)


def _next_in_row(values: torch.Tensor, same_row: torch.Tensor, fill: float | int) -> torch.Tensor:
    """``values[t + 1]`` where ``t + 1`` is in the same row as ``t``, else ``fill``."""
    shifted = torch.where(same_row, values[1:], torch.full_like(values[1:], fill))
    return torch.cat([shifted, torch.full_like(values[:1], fill)])


def pack_for_megatron(
    packed: PackedBatch, *, pad_to_multiple: int = 1, pad_token_id: int = 0
) -> MegatronPackedInputs:
    """Megatron-core inputs for the rows of ``packed`` (``TrainingBatch.packed()``), each row
    padded to a multiple of ``pad_to_multiple`` tokens."""
    if (
        isinstance(pad_to_multiple, bool)
        or not isinstance(pad_to_multiple, int)
        or pad_to_multiple < 1
    ):
        raise BatchError(
            "pad_to_multiple", f"pad_to_multiple must be an integer >= 1, got {pad_to_multiple!r}"
        )
    lengths = (packed.cu_seqlens[1:] - packed.cu_seqlens[:-1]).to(torch.int64)  # (R,)
    if lengths.numel() == 0 or bool((lengths < 1).any()):
        raise BatchError(
            "row_lengths", f"every packed row needs at least one token, got {lengths.tolist()}"
        )
    padded_lengths = (lengths + pad_to_multiple - 1) // pad_to_multiple * pad_to_multiple
    offsets = torch.zeros(lengths.shape[0] + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(padded_lengths, 0)
    total = int(offsets[-1])
    same_row = packed.token_rows[:-1] == packed.token_rows[1:]  # (N_real - 1,)
    labels = _next_in_row(packed.input_ids, same_row, pad_token_id)
    loss_mask = _next_in_row(packed.loss_mask.to(torch.float32), same_row, 0.0)
    generation_logprobs = _next_in_row(packed.generation_logprobs.float(), same_row, 0.0)
    destination = offsets[packed.token_rows] + packed.position_ids  # (N_real,)
    row_of_slot = torch.repeat_interleave(torch.arange(lengths.shape[0]), padded_lengths)  # (N,)

    def scatter(values: torch.Tensor, fill: float | int) -> torch.Tensor:
        out = torch.full((total,), fill, dtype=values.dtype)
        out[destination] = values
        return out[None, :]

    return MegatronPackedInputs(
        input_ids=scatter(packed.input_ids, pad_token_id),
        position_ids=(torch.arange(total) - offsets[row_of_slot])[None, :],
        labels=scatter(labels, pad_token_id),
        loss_mask=scatter(loss_mask, 0.0),
        generation_logprobs=scatter(generation_logprobs, 0.0),
        owners=scatter(packed.parent_indices[packed.token_rows], -1),
        cu_seqlens=packed.cu_seqlens.to(torch.int32),
        cu_seqlens_padded=offsets.to(torch.int32),
        max_seqlen=int(padded_lengths.max()),
    )


def packed_seq_params(inputs: MegatronPackedInputs) -> Any:
    """megatron-core's ``PackedSeqParams`` (``qkv_format="thd"``) for ``inputs``; raises
    ``MegatronUnavailable`` when megatron-core is not installed."""
    try:
        with warnings.catch_warnings():
            # megatron-core warns at import time that Apex and Transformer Engine are absent.
            warnings.simplefilter("ignore", UserWarning)
            from megatron.core.packed_seq_params import PackedSeqParams
    except ImportError as error:
        raise MegatronUnavailable(str(error)) from error
    padded = not torch.equal(inputs.cu_seqlens, inputs.cu_seqlens_padded)
    return PackedSeqParams(
        qkv_format="thd",
        cu_seqlens_q=inputs.cu_seqlens,
        cu_seqlens_kv=inputs.cu_seqlens,
        cu_seqlens_q_padded=inputs.cu_seqlens_padded if padded else None,
        cu_seqlens_kv_padded=inputs.cu_seqlens_padded if padded else None,
        max_seqlen_q=inputs.max_seqlen,
        max_seqlen_kv=inputs.max_seqlen,
    )


def label_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``(1, N)``: log p(``labels[t]``) from logits ``(1, N, V)``, in at least float32."""
    if logits.ndim != 3 or tuple(logits.shape[:2]) != tuple(labels.shape):
        raise BatchError(
            "logits_shape",
            f"logits must be (1, N, V) for labels {tuple(labels.shape)}, got {tuple(logits.shape)}",
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits.log_softmax(-1).gather(-1, labels[..., None]).squeeze(-1)


def unpack_to_rows(
    values: torch.Tensor, inputs: MegatronPackedInputs, *, width: int | None = None
) -> torch.Tensor:
    """Per-position values ``(1, N)`` in Megatron's convention (position ``t`` scores
    ``labels[t]``) as Grove rows ``(R, width)``: row position ``j`` takes the value of packed
    position ``offset + j - 1``; position 0 and positions past the row's end hold 0.0.
    ``width`` defaults to the longest row."""
    if tuple(values.shape) != tuple(inputs.input_ids.shape):
        raise BatchError(
            "values_shape",
            f"values must be {tuple(inputs.input_ids.shape)}, got {tuple(values.shape)}",
        )
    lengths = inputs.row_lengths
    width = int(lengths.max()) if width is None else width
    if width < int(lengths.max()):
        raise BatchError(
            "row_width", f"width {width} is shorter than the longest row ({int(lengths.max())})"
        )
    columns = torch.arange(1, width)[None, :]  # (1, width - 1)
    inside = columns < lengths[:, None]  # (R, width - 1)
    source = (inputs.cu_seqlens_padded[:-1, None].to(torch.int64) + columns - 1).clamp(
        max=values.shape[1] - 1
    )
    gathered = torch.where(inside, values[0][source], torch.zeros((), dtype=values.dtype))
    return torch.nn.functional.pad(gathered, (1, 0), value=0.0)
