"""Sequence packing (training/sequence_packing.py): hand-worked bins, and packed training equal to
the unpacked layout's loss, gradients and TMPE on forests with compaction, branches and padding."""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import pytest
import torch
from transformers import LlamaForCausalLM

from grove.training.errors import BatchError
from grove.training.row_sharding import SingleProcess
from grove.training.sequence_packing import (
    TokenBudgetBins,
    bin_logprobs,
    first_fit_decreasing,
    pack_rows,
    packed_logprobs,
    plan_bins,
    recompute_packed_logprobs,
)
from grove.training.trainer import StepBatch, StepReport, Trainer, row_logprobs
from grove.training.tree_logprobs import tree_row_lengths
from tests.unit.trainer.tiny_lm import sgd_trainer, tiny_causal_lm, tiny_decoder
from tests.unit.training.test_tree_logprobs import FAMILY, computed, family_batch


def tiny_llama(*, seed: int) -> LlamaForCausalLM:
    """The tiny Llama (``tiny_decoder``), sdpa attention."""
    return cast(LlamaForCausalLM, tiny_decoder("llama", seed=seed, attn_implementation="sdpa"))


def test_first_fit_decreasing_puts_each_row_in_the_first_bin_with_room() -> None:
    # Longest first: 7 -> bin 0; 5 -> bin 1; 4 -> bin 1 (0 has 3 left); 3 -> bin 0; 2 -> bin 2.
    assert first_fit_decreasing([3, 7, 2, 5, 4], 10) == [[0, 1], [3, 4], [2]]


def test_a_row_longer_than_the_budget_is_refused_with_what_to_do() -> None:
    with pytest.raises(BatchError, match=r"row 1 has 12 tokens, more than a bin's budget of 10"):
        first_fit_decreasing([3, 12], 10)


def test_shards_take_equal_row_counts_and_balanced_tokens() -> None:
    # Longest first to the shard with fewer tokens: 8 -> s0, 7 -> s1, 3 -> s1, 2 -> s0 (each
    # shard now holds 2 rows); s0 = {0: 8, 3: 2} = 10 tokens, s1 = {1: 7, 2: 3} = 10 tokens.
    plan = plan_bins([8, 7, 3, 2], budget=10, shards=2)
    assert plan.bins == ((0, 3), (1, 2))
    assert plan.bins_per_shard == 1


def test_every_shard_gets_the_same_number_of_bins() -> None:
    # s0 = rows {0: 6, 3: 1} fits one bin of 8; s1 = rows {1: 5, 2: 4} needs two: s0's bin gives
    # up its shortest row, so both ranks run two passes.
    plan = plan_bins([6, 5, 4, 1], budget=8, shards=2)
    assert plan.bins == ((0,), (3,), (1,), (2,))
    assert plan.order().tolist() == [0, 3, 1, 2]
    assert plan.slices() == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)]


def test_a_row_count_not_a_multiple_of_the_shards_is_refused() -> None:
    with pytest.raises(BatchError, match="a step's 3 rows cannot be shared equally among 2"):
        plan_bins([1, 2, 3], budget=8, shards=2)


def test_packed_positions_restart_in_every_row() -> None:
    layout = pack_rows(torch.tensor([3, 2]))
    assert layout.offsets.tolist() == [0, 3, 5]
    assert layout.position_ids.tolist() == [0, 1, 2, 0, 1]
    assert layout.attention_mask().int().tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 1, 1],
    ]


@pytest.mark.parametrize("build", [tiny_causal_lm, tiny_llama])
def test_packed_logprobs_equal_row_logprobs_on_the_family(
    build: Callable[..., torch.nn.Module],
) -> None:
    batch = family_batch(FAMILY)
    model = build(seed=0)
    everything = slice(0, batch.rows)

    rows = row_logprobs(model, batch, everything)
    packed = packed_logprobs(model, batch, everything)

    assert packed.shape == rows.shape
    assert float((packed - rows).detach()[computed(batch)].abs().max()) < 1e-6
    assert not packed[~computed(batch)].any()


def test_eager_attention_takes_the_additive_mask() -> None:
    batch = family_batch(FAMILY)
    model = tiny_causal_lm(seed=0)
    model.set_attn_implementation("eager")
    lengths = tree_row_lengths(batch.loss_mask)

    packed = bin_logprobs(model, batch.token_ids, lengths)
    rows = row_logprobs(model, batch, slice(0, batch.rows))

    assert float((packed - rows).detach()[computed(batch)].abs().max()) < 1e-6


def _train(batch: StepBatch, *, packed: bool, shards: int) -> tuple[Trainer, StepReport]:
    model = tiny_causal_lm(seed=0)
    trainer = sgd_trainer(
        model,
        batch,
        max_grad_norm=None,
        logprobs=packed_logprobs if packed else row_logprobs,
        layout=TokenBudgetBins(tokens=24, shards=shards) if packed else None,
        ranks=SingleProcess(shards),
    )
    return trainer, trainer.train_step(batch)


@pytest.mark.parametrize("shards", [1, 2])
def test_packed_training_gives_the_unpacked_loss_gradients_and_tmpe(shards: int) -> None:
    # Seven forest shapes and the walkthrough (compaction roots, branches), each group padded
    # to a multiple of 2 rows: padding rows too.
    batch = family_batch(FAMILY, row_multiple=2)
    assert batch.padding_rows > 0
    rows_trainer, rows_report = _train(batch, packed=False, shards=shards)
    packed_trainer, packed_report = _train(batch, packed=True, shards=shards)

    assert packed_report.loss == pytest.approx(rows_report.loss, abs=1e-6)
    assert packed_report.retained_tokens == rows_report.retained_tokens
    for name in ("token_mult_prob_error", "max_token_mult_prob_error", "gen_kl_error"):
        assert getattr(packed_report.diagnostics, name) == pytest.approx(
            getattr(rows_report.diagnostics, name), abs=1e-6
        )
    for row_param, packed_param in zip(
        rows_trainer.model.parameters(), packed_trainer.model.parameters(), strict=True
    ):
        torch.testing.assert_close(packed_param.grad, row_param.grad, rtol=0, atol=1e-6)


def test_packed_training_runs_one_pass_per_bin() -> None:
    batch = family_batch(FAMILY, row_multiple=2)
    lengths = tree_row_lengths(batch.loss_mask)
    passes: list[tuple[int, ...]] = []
    model = tiny_causal_lm(seed=0)
    model.register_forward_hook(lambda _m, args, _o: passes.append(tuple(args[0].shape)))
    trainer = sgd_trainer(model, batch, logprobs=packed_logprobs, layout=TokenBudgetBins(tokens=24))
    trainer.train_step(batch)

    bins = first_fit_decreasing(lengths.tolist(), 24)
    assert passes == [(1, int(lengths[rows].sum())) for rows in bins]


def test_recompute_in_logprob_bins_equals_row_logprobs() -> None:
    batch = family_batch(FAMILY)
    model = tiny_causal_lm(seed=0)

    packed = recompute_packed_logprobs(model, batch.token_ids, batch.loss_mask, tokens=32)
    with torch.no_grad():
        rows = row_logprobs(model.eval(), batch, slice(0, batch.rows))

    assert float((packed - rows)[computed(batch)].abs().max()) < 1e-6
