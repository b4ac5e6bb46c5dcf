"""Batch assembly: per-group padding, parent indices, padded and packed layouts."""

from __future__ import annotations

import pytest
import torch

from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import BatchError
from grove.training.forest import CallRecord, build_forest
from grove.training.rows import CallExtras, RowTensors, rollout_rows


def rows_of(*lengths: int, routed: bool = False) -> tuple[RowTensors, ...]:
    """One rollout whose rows are independent roots of 1 prompt + ``n - 1`` generated tokens."""
    calls = [
        CallRecord(f"r{i}", None, [7], list(range(10 * i, 10 * i + n - 1)), [-0.5] * (n - 1))
        for i, n in enumerate(lengths)
    ]
    extras = (
        {
            c.call_id: CallExtras(
                routes=torch.ones(len(c.generated_tokens) + 1, 2, dtype=torch.int32)
            )
            for c in calls
        }
        if routed
        else None
    )
    return tuple(rollout_rows(build_forest(calls, [c.call_id for c in calls]), extras))


def rollout(rollout_id: str, group_id: str, *lengths: int, routed: bool = False) -> LogicalRollout:
    return LogicalRollout(rollout_id, group_id, rows_of(*lengths, routed=routed))


def two_groups() -> list[LogicalRollout]:
    """g0: r0 with two rows, r1 with one; g1: r2 masked (no rows), r3 with three rows."""
    return [
        rollout("r0", "g0", 3, 2),
        rollout("r1", "g0", 4),
        rollout("r2", "g1"),
        rollout("r3", "g1", 2, 2, 5),
    ]


def test_each_group_is_padded_to_the_row_multiple_with_owner_minus_one() -> None:
    batch = assemble_batch(two_groups(), row_multiple=2)

    # g0: 3 rows + 1 padding; g1: 3 rows + 1 padding
    assert batch.parent_indices.tolist() == [0, 0, 1, -1, 3, 3, 3, -1]
    assert batch.row_groups.tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert batch.num_rows == 8
    assert batch.num_padding_rows == 2
    assert batch.num_rows % batch.row_multiple == 0


def test_logical_rollouts_keep_masked_members_and_count_once() -> None:
    batch = assemble_batch(two_groups(), row_multiple=2)

    assert batch.rollout_ids == ("r0", "r1", "r2", "r3")
    assert batch.num_rollouts == 4
    assert batch.group_ids == ("g0", "g1")
    assert batch.rollout_groups.tolist() == [0, 0, 1, 1]


def test_row_multiple_of_one_adds_no_padding() -> None:
    batch = assemble_batch(two_groups(), row_multiple=1)

    assert batch.parent_indices.tolist() == [0, 0, 1, 3, 3, 3]


def test_padding_rows_are_fully_masked_single_pad_tokens() -> None:
    batch = assemble_batch(two_groups(), row_multiple=4, pad_token_id=99)
    padding = batch.parent_indices < 0

    assert padding.sum() == 2
    assert batch.row_lengths[padding].tolist() == [1, 1]
    assert (batch.input_ids[padding] == 99).all()
    assert not batch.loss_mask[padding].any()
    assert (batch.generation_logprobs[padding] == 0).all()
    assert batch.attention_mask[padding].sum(dim=1).tolist() == [1, 1]
    assert all(
        batch.media[i] == () and batch.row_call_ids[i] == ()
        for i in torch.nonzero(padding)[:, 0].tolist()
    )


def test_real_rows_are_copied_exactly_and_right_padded() -> None:
    rollouts = two_groups()
    batch = assemble_batch(rollouts, row_multiple=2, pad_token_id=0)
    row = rollouts[1].rows[0]

    assert batch.input_ids[2, :4].tolist() == row.token_ids.tolist()
    assert batch.loss_mask[2, :4].tolist() == row.loss_mask.tolist()
    assert batch.generation_logprobs[2, :4].tolist() == row.generation_logprobs.tolist()
    assert batch.input_ids.shape == (8, 5)
    assert batch.attention_mask[2].tolist() == [True, True, True, True, False]
    assert batch.row_call_ids[2] == ("r0",)


def test_token_owners_mark_padding_rows_and_positions() -> None:
    batch = assemble_batch([rollout("r0", "g0", 3, 2)], row_multiple=3)

    assert batch.token_owners().tolist() == [[0, 0, 0], [0, 0, -1], [-1, -1, -1]]


def test_packed_layout_concatenates_rows_with_cu_seqlens() -> None:
    batch = assemble_batch(two_groups(), row_multiple=2)
    packed = batch.packed()

    assert packed.cu_seqlens.tolist() == [0, 3, 5, 9, 10, 12, 14, 19, 20]
    assert packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 5
    assert packed.position_ids[:5].tolist() == [0, 1, 2, 0, 1]
    assert packed.input_ids.shape == (20,)
    assert packed.token_rows[:6].tolist() == [0, 0, 0, 1, 1, 2]
    for index in range(batch.num_rows):
        start, end = packed.cu_seqlens[index].item(), packed.cu_seqlens[index + 1].item()
        length = batch.row_lengths[index].item()
        assert packed.input_ids[start:end].tolist() == batch.input_ids[index, :length].tolist()
        assert packed.loss_mask[start:end].tolist() == batch.loss_mask[index, :length].tolist()
    assert packed.parent_indices is batch.parent_indices


def test_routes_are_padded_with_the_sentinel() -> None:
    batch = assemble_batch([rollout("r0", "g0", 3, 2, routed=True)], row_multiple=3)

    assert batch.routes is not None
    assert batch.routes.shape == (3, 3, 2)
    assert batch.routes[1].tolist() == [[1, 1], [-1, -1], [-1, -1]]
    assert batch.routes[2].tolist() == [[-1, -1]] * 3
    assert batch.packed().routes.shape == (6, 2)  # type: ignore[union-attr]


@pytest.mark.parametrize("multiple", [0, -2, 1.5, True])
def test_invalid_row_multiple_raises(multiple: object) -> None:
    with pytest.raises(BatchError, match="row_multiple"):
        assemble_batch(two_groups(), row_multiple=multiple)  # type: ignore[arg-type]


def test_empty_batch_raises() -> None:
    with pytest.raises(BatchError, match="empty_batch"):
        assemble_batch([], row_multiple=1)


def test_duplicate_rollout_raises() -> None:
    with pytest.raises(BatchError, match=r"duplicate_rollout.*'r0'"):
        assemble_batch([rollout("r0", "g0", 2), rollout("r0", "g0", 2)], row_multiple=1)


def test_interleaved_groups_raise() -> None:
    rollouts = [rollout("r0", "g0", 2), rollout("r1", "g1", 2), rollout("r2", "g0", 2)]

    with pytest.raises(BatchError, match=r"group_not_contiguous.*'g0'"):
        assemble_batch(rollouts, row_multiple=1)


def test_group_without_any_row_raises() -> None:
    with pytest.raises(BatchError, match=r"group_without_rows.*'g1'.*drop it"):
        assemble_batch([rollout("r0", "g0", 2), rollout("r1", "g1")], row_multiple=1)


def test_rows_with_and_without_routes_raise() -> None:
    rollouts = [rollout("r0", "g0", 2, routed=True), rollout("r1", "g0", 2)]

    with pytest.raises(BatchError, match=r"routes_inconsistent.*1 of 2 rows"):
        assemble_batch(rollouts, row_multiple=1)
