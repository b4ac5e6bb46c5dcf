"""The GRPO loss and its diagnostics, on values worked out by hand (float64 throughout)."""

from __future__ import annotations

import math

import pytest
import torch

from grove.training.errors import BatchError
from grove.training.loss import (
    ClipRange,
    clipped_policy_gradient_loss,
    retained_token_mask,
    token_diagnostics,
)

LN = math.log


def _tensor(values: list) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _loss(trainer, generation, advantages, loss_mask, owners, row_mask=None):
    retained = retained_token_mask(
        torch.tensor(loss_mask),
        torch.tensor(owners),
        None if row_mask is None else torch.tensor(row_mask),
    )
    return clipped_policy_gradient_loss(
        trainer,
        _tensor(generation),
        _tensor(advantages),
        retained,
        step_retained_tokens=int(retained.sum()),
    )


def test_loss_of_unclipped_tokens_is_minus_advantage_times_ratio_over_retained_tokens() -> None:
    # token 1: ratio 0.6/0.5 = 1.2 (inside [0.8, 1.2]) -> -1.2; token 2: 0.4/0.5 = 0.8 -> -0.8;
    # position 0 is prompt. Loss = (-1.2 - 0.8) / 2 = -1.0.
    result = _loss(
        _tensor([[0.0, LN(0.6), LN(0.4)]]),
        [[0.0, LN(0.5), LN(0.5)]],
        [1.0],
        [[0, 1, 1]],
        [0],
    )
    assert result.loss.item() == pytest.approx(-1.0, abs=1e-12)
    assert result.retained_tokens == 2
    assert result.clipped_tokens == 0


def test_loss_clips_the_ratio_in_the_direction_of_the_advantage() -> None:
    # ratio 0.6/0.4 = 1.5. A=+2: max(-3.0, -2*1.2) = -2.4 (clipped binds).
    # A=-1: max(1.5, 1.2) = 1.5 (unclipped binds). ratio 0.2/0.4 = 0.5, A=-1: max(0.5, 0.8) = 0.8.
    # Sum 1.9 - 2.4 = -0.1... per token: [-2.4], [1.5, 0.8] -> (-2.4 + 1.5 + 0.8) / 3 = -0.1/3.
    result = _loss(
        _tensor([[0.0, LN(0.6), 0.0], [0.0, LN(0.6), LN(0.2)]]),
        [[0.0, LN(0.4), 0.0], [0.0, LN(0.4), LN(0.4)]],
        [2.0, -1.0],
        [[0, 1, 0], [0, 1, 1]],
        [0, 1],
    )
    assert result.loss.item() == pytest.approx(-0.1 / 3, abs=1e-12)
    assert result.clipped_tokens == 2


def test_loss_gradient_is_zero_where_the_clip_binds_and_minus_advantage_ratio_elsewhere() -> None:
    trainer = _tensor([[0.0, LN(0.6), LN(0.6)]]).requires_grad_()
    # token 1: A=1, ratio 1.2 (unclipped, d/dlogp = -A*ratio/N = -1.2/2); token 2: ratio 1.5 > 1.2
    # with A=1: the clipped branch binds, gradient 0.
    generation = [[0.0, LN(0.5), LN(0.4)]]
    _loss(trainer, generation, [1.0], [[0, 1, 1]], [0]).loss.backward()
    assert trainer.grad.tolist()[0] == pytest.approx([0.0, -0.6, 0.0], abs=1e-12)


def test_padding_rows_contribute_nothing_even_with_nan_logprobs() -> None:
    real = _loss(_tensor([[0.0, LN(0.6)]]), [[0.0, LN(0.5)]], [1.0], [[0, 1]], [0])
    trainer = _tensor([[0.0, LN(0.6)], [math.nan, math.nan]]).requires_grad_()
    padded = _loss(
        trainer, [[0.0, LN(0.5)], [math.nan, math.nan]], [1.0, 0.0], [[0, 1], [1, 1]], [0, -1]
    )
    padded.loss.backward()
    assert padded.loss.item() == real.loss.item()
    assert padded.retained_tokens == 1
    assert trainer.grad[1].tolist() == [0.0, 0.0]


def test_masked_rows_contribute_nothing_to_loss_or_normalization() -> None:
    # Row 1 (same owner) is excluded by the row mask: loss = -1.2 / 1, not (-1.2 - 0.8) / 2.
    result = _loss(
        _tensor([[0.0, LN(0.6)], [0.0, LN(0.4)]]),
        [[0.0, LN(0.5)], [0.0, LN(0.5)]],
        [1.0, 1.0],
        [[0, 1], [0, 1]],
        [0, 0],
        row_mask=[True, False],
    )
    assert result.loss.item() == pytest.approx(-1.2, abs=1e-12)
    assert result.retained_tokens == 1


def test_loss_is_normalized_by_retained_tokens_not_by_rows() -> None:
    # Row 0 retains 1 token (ratio 1.2), row 1 retains 3 (ratio 1.0), A=1 everywhere:
    # token mean (-1.2 - 3) / 4 = -1.05, where a mean of row means would give (-1.2 - 1) / 2 = -1.1.
    result = _loss(
        _tensor([[0.0, LN(0.6), 0.0, 0.0], [0.0, LN(0.5), LN(0.5), LN(0.5)]]),
        [[0.0, LN(0.5), 0.0, 0.0], [0.0, LN(0.5), LN(0.5), LN(0.5)]],
        [1.0, 1.0],
        [[0, 1, 0, 0], [0, 1, 1, 1]],
        [0, 1],
    )
    assert result.loss.item() == pytest.approx(-1.05, abs=1e-12)


def test_micro_batch_losses_sum_to_the_whole_step_loss() -> None:
    torch.manual_seed(0)
    trainer = torch.randn(4, 5, dtype=torch.float64) - 2.0
    generation = trainer + 0.1 * torch.randn(4, 5, dtype=torch.float64)
    advantages = _tensor([0.5, -1.0, 2.0, 0.0])
    retained = torch.rand(4, 5) > 0.4
    total = int(retained.sum())
    whole = clipped_policy_gradient_loss(
        trainer, generation, advantages, retained, step_retained_tokens=total
    )
    parts = sum(
        clipped_policy_gradient_loss(
            trainer[s], generation[s], advantages[s], retained[s], step_retained_tokens=total
        ).loss
        for s in (slice(0, 1), slice(1, 4))
    )
    assert parts.item() == pytest.approx(whole.loss.item(), abs=1e-14)


def test_step_with_no_retained_token_has_zero_loss() -> None:
    result = _loss(_tensor([[0.0, -1.0]]), [[0.0, -1.0]], [1.0], [[0, 0]], [0])
    assert result.loss.item() == 0.0
    assert result.retained_tokens == 0


def test_non_finite_generation_logprob_on_a_retained_token_raises() -> None:
    with pytest.raises(BatchError, match="non-finite generation logprob"):
        _loss(_tensor([[0.0, -1.0]]), [[0.0, -math.inf]], [1.0], [[0, 1]], [0])


def test_mismatched_shapes_raise_batch_error() -> None:
    with pytest.raises(BatchError, match=r"advantages must be \[rows\] = \[1\]"):
        clipped_policy_gradient_loss(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.zeros(2),
            torch.ones(1, 2),
            step_retained_tokens=2,
        )


def test_clip_range_outside_its_bounds_raises() -> None:
    with pytest.raises(BatchError, match="0 <= low < 1"):
        ClipRange(low=1.0, high=0.2)


@pytest.mark.parametrize(
    ("clip", "expected_loss", "expected_clipped"),
    [
        # default [0.8, 1.2]: row 0 ratio 1.5, A=+1: max(-1.5, -1.2) = -1.2; row 1 ratio 0.5,
        # A=-1: max(0.5, 0.8) = 0.8. Loss (-1.2 + 0.8) / 2 = -0.2, both tokens clipped.
        (ClipRange(), -0.2, 2),
        # loss_fn.ratio_clip_min = ratio_clip_max = 0.6: [0.4, 1.6] holds both ratios, nothing
        # clips: (-1.5 + 0.5) / 2 = -0.5.
        (ClipRange(low=0.6, high=0.6), -0.5, 0),
        # ratio_clip_min 0.1, ratio_clip_max 0.4: [0.9, 1.4]: (-1.4 + 0.9) / 2 = -0.25.
        (ClipRange(low=0.1, high=0.4), -0.25, 2),
        # ratio_clip_min 0.6, ratio_clip_max 0.2: [0.4, 1.2]: (-1.2 + 0.5) / 2 = -0.35.
        (ClipRange(low=0.6, high=0.2), -0.35, 1),
    ],
)
def test_the_clip_range_decides_the_loss_where_ratios_leave_the_default_interval(
    clip: ClipRange, expected_loss: float, expected_clipped: int
) -> None:
    trainer = _tensor([[0.0, LN(0.6)], [0.0, LN(0.2)]])  # ratios 0.6/0.4 = 1.5 and 0.2/0.4 = 0.5
    generation = _tensor([[0.0, LN(0.4)], [0.0, LN(0.4)]])
    retained = retained_token_mask(torch.tensor([[0, 1], [0, 1]]), torch.tensor([0, 1]))

    result = clipped_policy_gradient_loss(
        trainer, generation, _tensor([1.0, -1.0]), retained, step_retained_tokens=2, clip=clip
    )

    assert result.loss.item() == pytest.approx(expected_loss, abs=1e-12)
    assert result.clipped_tokens == expected_clipped


def _diagnostics(row_mask=None):
    # Rollout 0 owns row 0 (one token, logr = ln 2) and row 1 (two tokens, logr = 0);
    # rollout 1 owns nothing; row 2 is padding with a huge error that must not count.
    trainer = _tensor([[0.0, LN(0.8)], [-1.0, -1.0], [0.0, 5.0]])
    generation = _tensor([[0.0, LN(0.4)], [-1.0, -1.0], [0.0, -5.0]])
    return token_diagnostics(
        trainer,
        generation,
        torch.tensor([[0, 1], [1, 1], [1, 1]]),
        torch.tensor([0, 0, -1]),
        logical_rollouts=2,
        row_mask=row_mask,
    )


def test_token_mult_prob_error_is_mean_and_max_of_exp_abs_logprob_difference() -> None:
    # TMPE per token: exp(ln 2) = 2, exp(0) = 1, 1 -> mean 4/3, max 2.
    diagnostics = _diagnostics()
    assert diagnostics.token_mult_prob_error == pytest.approx(4 / 3, abs=1e-12)
    assert diagnostics.max_token_mult_prob_error == pytest.approx(2.0, abs=1e-12)
    assert diagnostics.diagnostic_tokens == 3


def test_gen_kl_error_is_the_k3_estimator_of_kl_generation_to_trainer() -> None:
    # k3 with logr = ln 2: exp(ln 2) - 1 - ln 2 = 1 - ln 2; with logr = 0: 0. Mean (1 - ln 2) / 3.
    assert _diagnostics().gen_kl_error == pytest.approx((1 - LN(2)) / 3, abs=1e-12)


def test_rollout_tmpe_pools_owned_tokens_with_equal_weight_across_rows() -> None:
    # Token-weighted (2 + 1 + 1) / 3 = 4/3, not the mean of row means (2 + 1) / 2 = 1.5.
    diagnostics = _diagnostics()
    assert diagnostics.rollout_token_mult_prob_error[0] == pytest.approx(4 / 3, abs=1e-12)


def test_rollout_without_owned_tokens_has_no_pooled_error() -> None:
    diagnostics = _diagnostics()
    assert diagnostics.rollout_token_mult_prob_error[1] is None


def test_masked_rows_leave_step_diagnostics_but_stay_in_the_rollout_pool() -> None:
    diagnostics = _diagnostics(row_mask=torch.tensor([False, True, True]))
    assert diagnostics.token_mult_prob_error == pytest.approx(1.0, abs=1e-12)
    assert diagnostics.max_token_mult_prob_error == pytest.approx(1.0, abs=1e-12)
    assert diagnostics.rollout_token_mult_prob_error[0] == pytest.approx(4 / 3, abs=1e-12)


def test_non_finite_logprobs_are_left_out_of_diagnostics() -> None:
    diagnostics = token_diagnostics(
        _tensor([[0.0, -math.inf, LN(0.8)]]),
        _tensor([[0.0, -1.0, LN(0.4)]]),
        torch.tensor([[0, 1, 1]]),
        torch.tensor([0]),
        logical_rollouts=1,
    )
    assert diagnostics.token_mult_prob_error == pytest.approx(2.0, abs=1e-12)
    assert diagnostics.diagnostic_tokens == 1


def test_owner_index_beyond_the_logical_rollouts_raises() -> None:
    with pytest.raises(BatchError, match="owner index 3 is outside the 2 logical rollouts"):
        token_diagnostics(
            torch.zeros(1, 2),
            torch.zeros(1, 2),
            torch.ones(1, 2),
            torch.tensor([3]),
            logical_rollouts=2,
        )
