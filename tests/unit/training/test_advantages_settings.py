"""The rules of ``AdvantageConfig``: each refusal's whole message, and the boundary value each rule
still accepts (``training/advantages.py``)."""

from __future__ import annotations

import math

import pytest

from grove.training.advantages import AdvantageConfig, MaskedRewardPolicy, compute_advantages
from grove.training.errors import AdvantageError
from tests.unit.training.test_advantages import PLAIN, outcome


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"advantage_clip_low": 1.0, "advantage_clip_high": 0.0},
            "Advantage rule 'clip_interval' violated: advantage_clip_low 1.0 must not exceed "
            "advantage_clip_high 0.0",
        ),
        (
            {"masked_reward_policy": "keep"},
            "Advantage rule 'masked_reward_policy' violated: masked_reward_policy must be "
            "'exclude' or 'include', got 'keep'",
        ),
        (
            {"min_valid_fraction_per_group": 0.0},
            "Advantage rule 'min_valid_fraction' violated: min_valid_fraction_per_group must be "
            "in (0, 1], got 0.0",
        ),
        (
            {"seq_logprob_error_threshold": 0.9},
            "Advantage rule 'logprob_error_threshold' violated: seq_logprob_error_threshold must "
            "be >= 1 (the error's minimum), got 0.9",
        ),
        ({"epsilon": 0.0}, "Advantage rule 'epsilon' violated: epsilon must be > 0, got 0.0"),
    ],
    ids=["clip_interval", "masked_reward_policy", "min_valid_fraction", "threshold", "epsilon"],
)
def test_each_advantage_refusal_names_its_rule_and_the_value(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(AdvantageError) as raised:
        AdvantageConfig(**fields)  # type: ignore[arg-type]

    assert str(raised.value) == message


@pytest.mark.parametrize(
    "fields",
    [
        {"advantage_clip_low": 0.5, "advantage_clip_high": 0.5},
        {"advantage_clip_low": 1.0},
        {"advantage_clip_high": -1.0},
        {"masked_reward_policy": MaskedRewardPolicy.INCLUDE},
        {"min_valid_fraction_per_group": 1.0},
        {"seq_logprob_error_threshold": 1.0},
        {"epsilon": 1e-12},
    ],
    ids=[
        "clip_low_equal_to_high",
        "clip_low_alone",
        "clip_high_alone",
        "include",
        "fraction_one",
        "threshold_one",
        "tiny_epsilon",
    ],
)
def test_the_boundary_value_of_each_advantage_rule_is_accepted(fields: dict[str, object]) -> None:
    config = AdvantageConfig(**fields)  # type: ignore[arg-type]

    assert {name: getattr(config, name) for name in fields} == fields


def test_a_rollout_given_twice_is_refused_saying_each_appears_once() -> None:
    with pytest.raises(AdvantageError) as raised:
        compute_advantages([outcome("a", 1), outcome("a", 0)], PLAIN)

    assert str(raised.value) == (
        "Advantage rule 'duplicate_rollout' violated: each logical rollout must appear once"
    )


def test_a_non_finite_reward_is_refused_quoting_the_rewards() -> None:
    with pytest.raises(AdvantageError) as raised:
        compute_advantages([outcome("a", 1.0), outcome("b", math.inf)], PLAIN)

    assert str(raised.value) == (
        "Advantage rule 'reward' violated: rewards must be finite, got [1.0, inf]"
    )
