"""``compute_advantages`` across groups: a group with no voter leaves the next groups their
advantages, a masked rollout has no filter, one clip bound clamps alone, and the advantages are
float32 (``training/advantages.py``)."""

from __future__ import annotations

import pytest
import torch

from grove.training.advantages import AdvantageConfig, compute_advantages
from tests.unit.training.test_advantages import PLAIN, outcome


def test_a_group_without_a_voter_leaves_the_next_group_its_advantages() -> None:
    outcomes = [
        outcome("a", 1, group="g0", masked_reason="selection_not_closed"),
        outcome("b", 1, group="g1"),
        outcome("c", 0, group="g1"),
    ]

    result = compute_advantages(outcomes, PLAIN)

    assert result.advantages.tolist() == pytest.approx([0.0, 0.707107, -0.707107], abs=1e-6)


def test_a_masked_rollout_gets_no_filter_even_when_a_filter_would_apply() -> None:
    outcomes = [
        outcome("a", 1),
        outcome("b", 0, masked_reason="selection_not_closed", truncated=True),
    ]

    result = compute_advantages(outcomes, AdvantageConfig(overlong_filtering=True))

    assert result.filters == (None, None)
    assert result.trained.tolist() == [True, False]


def test_a_low_clip_bound_alone_clamps_the_advantages() -> None:
    config = AdvantageConfig(advantage_clip_low=-0.5, epsilon=1e-12)

    result = compute_advantages([outcome("a", 1), outcome("b", 0)], config)

    assert result.advantages.tolist() == pytest.approx([0.707107, -0.5], abs=1e-6)


def test_advantages_are_float32() -> None:
    result = compute_advantages([outcome("a", 1), outcome("b", 0)], PLAIN)

    assert result.advantages.dtype == torch.float32
