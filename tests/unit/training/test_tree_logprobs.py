"""Tree-packed training (training/tree_logprobs.py) gives the row-wise logprobs, loss and
gradients on every forest of the hidden-shape family."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import BatchError
from grove.training.forest import Forest
from grove.training.rows import rollout_rows
from grove.training.trainer import StepBatch, Trainer, row_logprobs
from grove.training.tree_logprobs import owner_micro_batches, tree_logprobs, tree_row_lengths
from tests.unit.trainer.tiny_lm import synthetic_step_batch, tiny_causal_lm
from tests.unit.training.tree_shapes import all_forests, shape_forest


def family_batch(forests: list[Forest], *, row_multiple: int = 2, seed: int = 0) -> StepBatch:
    """One logical rollout per forest, each its own prompt group, random advantages."""
    rollouts = [
        LogicalRollout(f"r{i}", f"g{i}", tuple(rollout_rows(forest)))
        for i, forest in enumerate(forests)
    ]
    batch = assemble_batch(rollouts, row_multiple=row_multiple)
    generator = torch.Generator().manual_seed(seed)
    advantages = torch.randn(len(forests), generator=generator)
    owners = batch.parent_indices
    return StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=torch.where(owners >= 0, advantages[owners.clamp(min=0)], 0.0),
        owners=owners,
        logical_rollouts=len(forests),
    )


FAMILY = list(all_forests().values())


def computed(batch: StepBatch) -> torch.Tensor:
    """bool (R, T): the positions tree packing computes (up to each row's last loss token)."""
    lengths = tree_row_lengths(batch.loss_mask)
    return torch.arange(batch.token_ids.shape[1])[None, :] < lengths[:, None]


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float64, 1e-10)])
def test_tree_logprobs_equal_row_logprobs_on_the_family(
    dtype: torch.dtype, tolerance: float
) -> None:
    batch = family_batch(FAMILY)
    model = tiny_causal_lm(seed=0, dtype=dtype)
    everything = slice(0, batch.rows)

    rows = row_logprobs(model, batch, everything)
    tree = tree_logprobs(model, batch, everything)

    assert tree.shape == rows.shape and tree.dtype == rows.dtype
    assert float((tree - rows).detach()[computed(batch)].abs().max()) < tolerance


def test_eager_attention_takes_the_additive_mask_and_gives_the_same_logprobs() -> None:
    batch = family_batch(FAMILY)
    model = tiny_causal_lm(seed=0)  # eager attention takes its softmax in float32 anyway
    model.set_attn_implementation("eager")
    everything = slice(0, batch.rows)

    rows = row_logprobs(model, batch, everything)
    tree = tree_logprobs(model, batch, everything)

    assert model.config._attn_implementation == "eager"
    assert float((tree - rows).detach()[computed(batch)].abs().max()) < 1e-5


def test_positions_after_a_rows_last_loss_token_hold_zero() -> None:
    batch = family_batch(FAMILY)
    tree = tree_logprobs(tiny_causal_lm(seed=0), batch, slice(0, batch.rows))

    assert not tree[~computed(batch)].any()
    assert not tree[:, 0].any()


def test_rows_that_share_nothing_run_as_plain_causal_rows() -> None:
    chains = [shape_forest([None, 0, 1], prompt_base=base) for base in (3, 4, 5)]
    batch = family_batch(chains, row_multiple=1)
    model = tiny_causal_lm(seed=0, dtype=torch.float64)

    rows = row_logprobs(model, batch, slice(0, 3))
    tree = tree_logprobs(model, batch, slice(0, 3))

    torch.testing.assert_close(tree, rows, rtol=0, atol=0)


def train_once(batch: StepBatch, *, tree: bool, micro_batch_size: int) -> tuple[Trainer, object]:
    model = tiny_causal_lm(seed=0, dtype=torch.float64)
    trainer = Trainer(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        global_batch_rollouts=batch.logical_rollouts,
        micro_batch_size=micro_batch_size,
        max_grad_norm=None,
        logprobs=tree_logprobs if tree else row_logprobs,
        micro_batches=owner_micro_batches if tree else None,
    )
    return trainer, trainer.train_step(batch)


def test_tree_training_gives_the_row_wise_loss_and_gradients() -> None:
    batch = family_batch(FAMILY)
    rows_trainer, rows_report = train_once(batch, tree=False, micro_batch_size=4)
    tree_trainer, tree_report = train_once(batch, tree=True, micro_batch_size=4)

    assert tree_report.loss == pytest.approx(rows_report.loss, abs=1e-12)
    for row_param, tree_param in zip(
        rows_trainer.model.parameters(), tree_trainer.model.parameters(), strict=True
    ):
        torch.testing.assert_close(tree_param.grad, row_param.grad, rtol=0, atol=1e-10)
        torch.testing.assert_close(tree_param, row_param, rtol=0, atol=1e-10)


def test_tree_loss_counts_every_owned_generated_token_once() -> None:
    batch = family_batch(FAMILY)
    _, rows_report = train_once(batch, tree=False, micro_batch_size=2)
    _, tree_report = train_once(batch, tree=True, micro_batch_size=2)

    # Every selected call generates 2 tokens, owned once: 1 + 6 + 3 + 6 + 9 + 5 + 6 calls of
    # the seven shapes = 72 tokens; the walkthrough owns 2 + 2 + 1 + 2 = 7 without the rejected
    # call and 9 with it.
    assert rows_report.retained_tokens == tree_report.retained_tokens == 72 + 7 + 9
    assert tree_report.diagnostics.token_mult_prob_error == pytest.approx(
        rows_report.diagnostics.token_mult_prob_error, rel=1e-12
    )


def test_owner_micro_batches_keep_each_rollouts_rows_together() -> None:
    batch = synthetic_step_batch(rows_per_rollout=[3, 1, 2])  # owners 0 0 0 | 1 | 2 2

    assert owner_micro_batches(batch, 2) == [slice(0, 3), slice(3, 4), slice(4, 6)]
    assert owner_micro_batches(batch, 4) == [slice(0, 4), slice(4, 6)]
    assert owner_micro_batches(batch, 6) == [slice(0, 6)]


def test_owner_micro_batches_put_padding_rows_with_the_rows_before_them() -> None:
    batch = family_batch([shape_forest([None, 0, 0]), shape_forest([None])], row_multiple=4)

    assert batch.owners.tolist() == [0, 0, -1, -1, 1, -1, -1, -1]
    assert owner_micro_batches(batch, 2) == [slice(0, 4), slice(4, 8)]
    assert owner_micro_batches(batch, 3) == [slice(0, 8)]


def test_rows_with_routes_are_refused_with_what_to_do() -> None:
    batch = family_batch(FAMILY[:1])
    routed = dataclasses.replace(batch, routes=torch.zeros(*batch.token_ids.shape, 2))

    with pytest.raises(BatchError, match=r"turn policy\.tree_packing off"):
        tree_logprobs(tiny_causal_lm(seed=0), routed, slice(0, batch.rows))
