"""Data-parallel sharding of a step's rows (``training/row_sharding.py``): equal contiguous shards
of a batch padded per prompt group, and one process that trains every shard as the ranks would."""

from __future__ import annotations

import pytest
import torch

from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import BatchError
from grove.training.loss import clipped_policy_gradient_loss, retained_token_mask
from grove.training.row_sharding import SingleProcess, shard_micro_batches, shard_rows
from grove.training.rows import RowTensors
from grove.training.trainer import StepBatch, Trainer, causal_token_logprobs
from tests.unit.trainer.tiny_lm import synthetic_step_batch, tiny_causal_lm


def _row(token: int) -> RowTensors:
    """A three-token row whose last token is owned."""
    return RowTensors(
        token_ids=torch.tensor([token, token + 1, token + 2]),
        loss_mask=torch.tensor([False, False, True]),
        generation_logprobs=torch.tensor([0.0, 0.0, -0.5]),
        routes=None,
        media=(),
        call_ids=("c",),
        owned_call_ids=("c",),
    )


def _rollout(group: str, index: int, rows: int) -> LogicalRollout:
    return LogicalRollout(f"{group}r{index}", group, tuple(_row(10 * index) for _ in range(rows)))


def test_six_rollouts_in_thirteen_rows_are_padded_to_four_equal_rank_shards() -> None:
    # g0: rollouts of 2, 2 and 3 rows (7 -> padded to 8); g1: 2, 2 and 2 rows (6 -> 8). Four
    # ranks x micro batch 1: the row multiple is 4; 13 real rows and 3 padding rows, 4 a rank.
    rollouts = [_rollout("g0", 0, 2), _rollout("g0", 1, 2), _rollout("g0", 2, 3)]
    rollouts += [_rollout("g1", 3, 2), _rollout("g1", 4, 2), _rollout("g1", 5, 2)]
    batch = assemble_batch(rollouts, row_multiple=4 * 1)

    shards = shard_rows(batch.num_rows, world_size=4)

    assert (batch.num_rollouts, batch.num_rows - batch.num_padding_rows) == (6, 13)
    assert batch.num_padding_rows == 3
    assert shards == (range(0, 4), range(4, 8), range(8, 12), range(12, 16))
    owners = [batch.parent_indices[s.start : s.stop].tolist() for s in shards]
    assert owners == [[0, 0, 1, 1], [2, 2, 2, -1], [3, 3, 4, 4], [5, 5, -1, -1]]


def test_rows_that_ranks_cannot_share_equally_are_refused() -> None:
    with pytest.raises(BatchError, match="6 rows cannot be shared equally among 4") as caught:
        shard_rows(6, world_size=4)
    assert caught.value.rule == "rows_per_rank"


def test_a_micro_batch_belongs_to_the_rank_whose_shard_holds_its_first_row() -> None:
    # Rows 0-7 over two ranks; a plan that keeps rows 2-5 together puts them on rank 0.
    planned = [slice(0, 2), slice(2, 6), slice(6, 8)]
    first, second = shard_rows(8, world_size=2)

    assert shard_micro_batches(planned, first) == [slice(0, 2), slice(2, 6)]
    assert shard_micro_batches(planned, second) == [slice(6, 8)]


def _step(batch: StepBatch, ranks: SingleProcess) -> tuple[list[torch.Tensor], float]:
    """One step of the tiny model on ``batch``: the gradients it took (left on the parameters)
    and its loss."""
    model = tiny_causal_lm(seed=0)
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=1.0),
        global_batch_rollouts=batch.logical_rollouts,
        micro_batch_size=1,
        max_grad_norm=None,
        ranks=ranks,
    )
    report = trainer.train_step(batch)
    return [p.grad for p in model.parameters()], report.loss


def _shard_gradient(batch: StepBatch, rows: range) -> list[torch.Tensor]:
    """The gradient one rank accumulates over its rows, one micro batch a row, each micro
    batch's loss over the whole step's retained tokens."""
    model = tiny_causal_lm(seed=0)
    retained = retained_token_mask(batch.loss_mask, batch.owners)
    for row in rows:
        part = slice(row, row + 1)
        clipped_policy_gradient_loss(
            causal_token_logprobs(model, batch.token_ids[part]),
            batch.generation_logprobs[part],
            batch.advantages[part],
            retained[part],
            step_retained_tokens=int(retained.sum()),
        ).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_one_process_adds_each_shards_gradient_in_rank_order() -> None:
    torch.manual_seed(6)
    batch = synthetic_step_batch(rows_per_rollout=[3, 3, 3, 3], padding_rows=0, length=16)
    first = _shard_gradient(batch, range(0, 6))
    second = _shard_gradient(batch, range(6, 12))
    one_sum = _shard_gradient(batch, range(0, 12))

    grads, _ = _step(batch, SingleProcess(2))

    # Rank 0's gradient sum plus rank 1's, as two ranks' all-reduce adds them: the same floats,
    # where accumulating all twelve rows in one sum rounds differently for this draw.
    assert all(torch.equal(g, a + b) for g, a, b in zip(grads, first, second, strict=True))
    assert not all(torch.equal(g, w) for g, w in zip(grads, one_sum, strict=True))


def test_one_process_of_two_shards_takes_the_one_shard_step_up_to_rounding() -> None:
    torch.manual_seed(6)
    batch = synthetic_step_batch(rows_per_rollout=[1, 2, 1], padding_rows=0, length=12)

    two, loss_two = _step(batch, SingleProcess(2))
    one, loss_one = _step(batch, SingleProcess(1))

    assert loss_two == pytest.approx(loss_one, abs=1e-7)
    torch.testing.assert_close(
        torch.cat([g.flatten() for g in two]),
        torch.cat([g.flatten() for g in one]),
        rtol=0,
        atol=1e-6,
    )
