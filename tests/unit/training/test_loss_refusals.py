"""What the loss refuses, in full, and the boundary values it still accepts
(``training/loss.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from grove.training.errors import BatchError
from grove.training.loss import ClipRange, clipped_policy_gradient_loss, retained_token_mask


def loss_of(
    generation: torch.Tensor,
    advantages: torch.Tensor,
    retained: torch.Tensor,
    step_retained_tokens: int = 1,
) -> None:
    """Run the loss on these inputs with trainer logprobs of zero."""
    clipped_policy_gradient_loss(
        torch.zeros_like(generation),
        generation,
        advantages,
        retained,
        step_retained_tokens=step_retained_tokens,
    )


@pytest.mark.parametrize(
    ("low", "high"), [(1.0, 0.2), (-0.1, 0.2), (0.2, -0.1)], ids=["low_1", "low_neg", "high_neg"]
)
def test_a_clip_range_outside_its_bounds_is_refused_with_both_values(
    low: float, high: float
) -> None:
    with pytest.raises(BatchError) as raised:
        ClipRange(low=low, high=high)

    assert str(raised.value) == (
        "Batch rule 'clip_range' violated: the clip range needs 0 <= low < 1 and high >= 0, "
        f"got low={low}, high={high}"
    )


@pytest.mark.parametrize(
    ("low", "high"), [(0.0, 0.0), (0.999, 0.0)], ids=["both_zero", "low_below_one"]
)
def test_the_boundary_values_of_a_clip_range_are_accepted(low: float, high: float) -> None:
    clip = ClipRange(low=low, high=high)

    assert (clip.low, clip.high) == (low, high)


def test_per_token_tensors_of_another_rank_are_refused_naming_every_shape() -> None:
    with pytest.raises(BatchError) as raised:
        retained_token_mask(torch.ones(3), torch.zeros(3, dtype=torch.long))

    assert str(raised.value) == (
        "Batch rule 'row_shapes' violated: per-token tensors must all be [rows, tokens]: "
        "{'loss_mask': (3,)}"
    )


def test_per_token_tensors_of_different_shapes_are_refused_naming_every_shape() -> None:
    with pytest.raises(BatchError) as raised:
        loss_of(torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 3))

    assert str(raised.value) == (
        "Batch rule 'row_shapes' violated: per-token tensors must all be [rows, tokens]: "
        "{'trainer_logprobs': (1, 2), 'generation_logprobs': (1, 2), 'retained': (1, 3)}"
    )


def test_a_row_mask_of_another_length_is_refused_naming_both_lengths() -> None:
    with pytest.raises(BatchError) as raised:
        retained_token_mask(
            torch.ones(2, 3), torch.zeros(2, dtype=torch.long), torch.ones(3, dtype=torch.bool)
        )

    assert str(raised.value) == (
        "Batch rule 'row_shapes' violated: row_mask must be [rows] = [2], got [3]"
    )


def test_a_negative_step_token_count_is_refused_with_its_value() -> None:
    with pytest.raises(BatchError) as raised:
        loss_of(torch.zeros(1, 2), torch.zeros(1), torch.ones(1, 2), step_retained_tokens=-1)

    assert str(raised.value) == (
        "Batch rule 'retained_tokens' violated: the step's retained token count is negative: -1"
    )


def test_a_step_token_count_of_zero_is_accepted() -> None:
    result = clipped_policy_gradient_loss(
        torch.zeros(1, 2),
        torch.zeros(1, 2),
        torch.ones(1),
        torch.zeros(1, 2, dtype=torch.bool),
        step_retained_tokens=0,
    )

    assert (result.loss.item(), result.retained_tokens) == (0.0, 0)


def test_a_retained_non_finite_generation_logprob_is_refused_as_a_corrupt_capture() -> None:
    generation = torch.tensor([[0.0, math.nan]])

    with pytest.raises(BatchError) as raised:
        loss_of(generation, torch.zeros(1), torch.ones(1, 2))

    assert str(raised.value) == (
        "Batch rule 'finite_generation_logprobs' violated: a retained token has a non-finite "
        "generation logprob; the capture is corrupt"
    )
