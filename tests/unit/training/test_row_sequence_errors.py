"""Per physical row sequence errors (``grove.training.loss.row_sequence_errors``) beside the per
rollout decision of ``grpo.seq_logprob_error_threshold`` (``docs/metrics.md``).

A rollout's pooled error is the token-weighted mean of its rows' errors, so a rollout of two rows
can be kept while one of its rows is above the threshold: the case every test here builds.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from grove.training.batch import LogicalRollout
from grove.training.forest import CallRecord, build_forest
from grove.training.loss import row_sequence_errors
from grove.training.projector import FinalizedRollout
from grove.training.rows import rollout_rows
from grove.training.trainer import causal_token_logprobs
from tests.unit.config.steps import (
    GENERATED,
    PROMPT,
    own_logprobs,
    published,
    rollout,
    training_run,
)

LN4 = math.log(4.0)
"""A log ratio of TMPE 4 (to float32 rounding: ``ROUNDING``)."""
ROUNDING = 1e-7


def test_a_row_above_the_threshold_is_counted_though_its_rollout_pools_below_it() -> None:
    # Rollout 0 has rows 0 (three owned tokens, error 1 each) and 1 (one token off by ln 4:
    # error 4); pooled (3 x 1 + 4) / 4 = 1.75, below the threshold 2. Row 2 is rollout 1's (one
    # token, error 1); row 3 is padding (owner -1), whose wild logprob counts nowhere.
    trainer = torch.zeros(4, 3)
    generation = torch.tensor([[0.0] * 3, [LN4, 0.0, 0.0], [0.0] * 3, [9.0] * 3])
    loss_mask = torch.tensor([[True] * 3, [True, False, False], [True, False, False], [False] * 3])
    owners = torch.tensor([0, 0, 1, -1])

    errors = row_sequence_errors(
        trainer, generation, loss_mask, owners, row_mask=None, threshold=2.0
    )

    # rows 0, 1, 2: errors 1, 4, 1; mean 2
    assert (errors.rows, errors.over_threshold) == (3, 1)
    assert (errors.max, errors.mean) == pytest.approx((4.0, 2.0), rel=ROUNDING)


def test_rows_excluded_by_the_row_mask_are_left_out() -> None:
    trainer = torch.zeros(2, 1)
    generation = torch.tensor([[LN4], [0.0]])  # errors 4 and 1
    loss_mask = torch.ones(2, 1, dtype=torch.bool)
    owners = torch.tensor([0, 1])

    errors = row_sequence_errors(
        trainer, generation, loss_mask, owners, row_mask=torch.tensor([False, True]), threshold=2.0
    )

    assert (errors.max, errors.mean, errors.rows, errors.over_threshold) == (1.0, 1.0, 1, 0)


def test_a_step_without_a_retained_token_reports_error_one_and_no_row() -> None:
    errors = row_sequence_errors(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.zeros(1, 2, dtype=torch.bool),
        torch.tensor([0]),
        row_mask=None,
        threshold=2.0,
    )

    assert errors.metrics() == {
        "train/row_seq_logprob_error_max": 1.0,
        "train/row_seq_logprob_error_mean": 1.0,
        "train/rows_over_seq_logprob_error_threshold": 0.0,
    }


def _rewritten_rollout(
    rollout_id: str, reward: float, first: list[float], second: list[float]
) -> FinalizedRollout:
    """A rollout whose second call rewrote its context: rows ``PROMPT + GENERATED`` (three owned
    tokens) and ``[4, 11]`` (one), with these generation logprobs."""
    answer = CallRecord("c0", None, PROMPT, GENERATED, first)
    rewritten = CallRecord("c1", None, [4], [11], second)
    forest = build_forest([answer, rewritten], ["c0", "c1"], terminal="c1")
    rows = tuple(rollout_rows(forest))
    assert len(rows) == 2
    return FinalizedRollout(
        rollout_id, rollout_id, "g0", reward, forest, LogicalRollout(rollout_id, "g0", rows)
    )


def test_a_training_step_reports_the_kept_rollouts_row_above_the_threshold(
    tmp_path: Path,
) -> None:
    training = training_run(tmp_path, {"grpo": {"seq_logprob_error_threshold": 2.0}})
    mine = own_logprobs(training.model)
    with torch.no_grad():
        (eleven,) = causal_token_logprobs(training.model, torch.tensor([[4, 11]]))[0, 1:].tolist()
    # r0's second row is off by ln 4 (error 4) and its first agrees (error 1 on three tokens):
    # pooled 1.75, below 2, so r0 trains. r1 is rewritten too and agrees; r2 and r3 are one row.
    rollouts = [
        _rewritten_rollout("r0", 1.0, mine, [eleven - LN4]),
        _rewritten_rollout("r1", 0.0, mine, [eleven]),
        rollout("r2", 1.0, mine),
        rollout("r3", 0.0, mine),
    ]

    metrics = training.train(published(training, rollouts)).metrics

    assert metrics["forest/masked_rows"] == 0.0  # the rollout decision kept r0
    assert metrics["train/rows_over_seq_logprob_error_threshold"] == 1.0
    assert metrics["train/row_seq_logprob_error_max"] == pytest.approx(4.0, rel=1e-5)
    # rows: r0 (1, 4), r1 (1, 1), r2 (1), r3 (1): mean 9 / 6 = 1.5
    assert metrics["train/row_seq_logprob_error_mean"] == pytest.approx(1.5, rel=1e-5)
