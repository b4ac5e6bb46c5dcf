"""The Megatron packing adapter: hand-worked layouts; packed = unpacked logprobs on a real model."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from grove.training.batch import assemble_batch
from grove.training.errors import BatchError
from grove.training.megatron import (
    MegatronPackedInputs,
    MegatronUnavailable,
    label_logprobs,
    pack_for_megatron,
    packed_seq_params,
    unpack_to_rows,
)
from grove.training.trainer import causal_token_logprobs
from tests.unit.trainer.tiny_lm import forest_rollout, tiny_absolute_position_lm, tiny_causal_lm


def _require_megatron_core() -> None:
    """Skip without megatron-core (a test extra), except under ``CI=true``, where it fails."""
    try:
        import megatron.core.packed_seq_params  # noqa: F401
    except ImportError as error:
        reason = f"megatron-core is not installed ({error}): run `make test`, which installs it"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the megatron-core tests: {reason}")
        pytest.skip(reason)


# Rollout a was rewritten: rows [1 2 3 4 5] (loss on 4 5) and [6 7 8 9] (loss on 8 9).
REWRITTEN = [forest_rollout("a", rewrite=True)]


def _inputs(pad_to_multiple: int = 1) -> MegatronPackedInputs:
    batch = assemble_batch(REWRITTEN, row_multiple=1)
    return pack_for_megatron(batch.packed(), pad_to_multiple=pad_to_multiple)


def test_rows_pack_into_one_thd_sequence_with_labels_shifted_within_each_row() -> None:
    inputs = _inputs()
    assert inputs.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7, 8, 9]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]]
    # The label of a row's last token is padding: the shift never crosses a row boundary.
    assert inputs.labels.tolist() == [[2, 3, 4, 5, 0, 7, 8, 9, 0]]
    assert inputs.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 1, 1, 0]]
    assert inputs.generation_logprobs[0].tolist() == pytest.approx(
        [0, 0, -0.5, -0.7, 0, 0, -0.2, -0.9, 0], abs=1e-7
    )
    assert inputs.owners.tolist() == [[0] * 9]
    assert inputs.cu_seqlens.tolist() == inputs.cu_seqlens_padded.tolist() == [0, 5, 9]
    assert inputs.cu_seqlens.dtype == torch.int32
    assert inputs.max_seqlen == 5


def test_rows_padded_to_a_multiple_take_their_offsets_from_cu_seqlens_padded() -> None:
    inputs = _inputs(pad_to_multiple=4)
    assert inputs.input_ids.tolist() == [[1, 2, 3, 4, 5, 0, 0, 0, 6, 7, 8, 9]]
    assert inputs.position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3]]
    assert inputs.labels.tolist() == [[2, 3, 4, 5, 0, 0, 0, 0, 7, 8, 9, 0]]
    assert inputs.loss_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0]]
    assert inputs.owners.tolist() == [[0, 0, 0, 0, 0, -1, -1, -1, 0, 0, 0, 0]]
    assert inputs.cu_seqlens.tolist() == [0, 5, 9]
    assert inputs.cu_seqlens_padded.tolist() == [0, 8, 12]
    assert inputs.max_seqlen == 8


def test_execution_padding_rows_are_packed_with_owner_minus_one_and_no_loss() -> None:
    batch = assemble_batch(REWRITTEN, row_multiple=4)  # 2 rows + 2 one-token padding rows
    inputs = pack_for_megatron(batch.packed())
    assert inputs.cu_seqlens.tolist() == [0, 5, 9, 10, 11]
    assert inputs.owners.tolist()[0][9:] == [-1, -1]
    assert inputs.loss_mask.tolist()[0][9:] == [0.0, 0.0]


def test_unpack_to_rows_restores_the_row_convention() -> None:
    # Packed position t scores label t; in rows, position j holds the score of token j.
    inputs = _inputs(pad_to_multiple=4)
    values = torch.arange(12, dtype=torch.float32)[None, :] + 100
    rows = unpack_to_rows(values, inputs, width=6)
    assert rows.tolist() == [
        [0, 100, 101, 102, 103, 0],
        [0, 108, 109, 110, 0, 0],
    ]


def test_unpacked_generation_logprobs_equal_the_rows() -> None:
    batch = assemble_batch(REWRITTEN, row_multiple=1)
    inputs = pack_for_megatron(batch.packed(), pad_to_multiple=4)
    unpacked = unpack_to_rows(inputs.generation_logprobs, inputs, width=batch.input_ids.shape[1])
    assert torch.equal(unpacked, batch.generation_logprobs)


def _block_causal_mask(inputs: MegatronPackedInputs) -> torch.Tensor:
    """The attention the thd inputs describe: causal within each (padded) row, nothing across."""
    total = inputs.input_ids.shape[1]
    row = torch.repeat_interleave(
        torch.arange(inputs.rows),
        (inputs.cu_seqlens_padded[1:] - inputs.cu_seqlens_padded[:-1]).long(),
    )
    allowed = (row[:, None] == row[None, :]) & torch.ones(total, total, dtype=torch.bool).tril()
    return torch.where(allowed, 0.0, float("-inf"))[None, None]  # (1, 1, N, N)


@pytest.mark.parametrize("pad_to_multiple", [1, 4])
@pytest.mark.parametrize("build", [tiny_causal_lm, tiny_absolute_position_lm])
def test_packed_logprobs_equal_unpacked_rows_on_a_real_model(build, pad_to_multiple: int) -> None:
    # Qwen2's rotary positions are relative; GPT-2's learned ones also check the position ids.
    batch = assemble_batch(
        [forest_rollout("a", rewrite=True), forest_rollout("b", rewrite=False)], row_multiple=4
    )
    model = build(seed=0).eval()
    inputs = pack_for_megatron(batch.packed(), pad_to_multiple=pad_to_multiple)
    with torch.no_grad():
        logits = model(
            input_ids=inputs.input_ids,
            position_ids=inputs.position_ids,
            attention_mask=_block_causal_mask(inputs),
        ).logits
        packed = unpack_to_rows(
            label_logprobs(logits, inputs.labels), inputs, width=batch.input_ids.shape[1]
        )
        unpacked = causal_token_logprobs(model, batch.input_ids)
    real = batch.attention_mask
    torch.testing.assert_close(packed[real], unpacked[real], rtol=0, atol=1e-5)


def test_pad_to_multiple_below_one_raises() -> None:
    batch = assemble_batch(REWRITTEN, row_multiple=1)
    with pytest.raises(BatchError, match="pad_to_multiple must be an integer >= 1, got 0"):
        pack_for_megatron(batch.packed(), pad_to_multiple=0)


def test_label_logprobs_with_mismatched_shapes_raises() -> None:
    with pytest.raises(BatchError, match=r"logits must be \(1, N, V\)"):
        label_logprobs(torch.zeros(1, 3, 5), torch.zeros(1, 4, dtype=torch.long))


def test_unpack_narrower_than_the_longest_row_raises() -> None:
    with pytest.raises(BatchError, match=r"width 3 is shorter than the longest row \(5\)"):
        unpack_to_rows(torch.zeros(1, 9), _inputs(), width=3)


def test_packed_seq_params_without_megatron_core_raises_what_to_do(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "megatron.core.packed_seq_params", None)
    with pytest.raises(MegatronUnavailable, match="pip install megatron-core"):
        packed_seq_params(_inputs())


def test_packed_seq_params_describe_thd_rows() -> None:
    _require_megatron_core()
    params = packed_seq_params(_inputs())
    assert params.qkv_format == "thd"
    assert params.cu_seqlens_q.tolist() == params.cu_seqlens_kv.tolist() == [0, 5, 9]
    assert params.cu_seqlens_q_padded is None and params.cu_seqlens_kv_padded is None
    assert (params.max_seqlen_q, params.max_seqlen_kv) == (5, 5)


def test_packed_seq_params_of_padded_rows_carry_padded_offsets() -> None:
    _require_megatron_core()
    params = packed_seq_params(_inputs(pad_to_multiple=4))
    assert params.cu_seqlens_q.tolist() == [0, 5, 9]
    assert params.cu_seqlens_q_padded.tolist() == params.cu_seqlens_kv_padded.tolist() == [0, 8, 12]
    assert (params.max_seqlen_q, params.max_seqlen_kv) == (8, 8)
