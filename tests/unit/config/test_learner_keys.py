"""What each learner key changes in a training step (``grove/train/training_run.py``).

Every test builds ``TrainingRun`` — the consuming side of ``grove train`` — from a configuration
(``tests/unit/config/steps.py``) and changes one key: advantages come from
``compute_advantages`` with the run's own advantage settings, a whole step from
``TrainingRun.train`` on rollouts laid out as the projector publishes them, an optimizer step from
the run's own trainer. Values worked out by hand are in the comments.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grove.config import ConfigurationError, load_config
from grove.training.advantages import RolloutOutcome, compute_advantages
from grove.training.errors import BatchError
from tests.unit.config.steps import (
    forward_passes,
    own_logprobs,
    published,
    ratio_batch,
    rollout,
    rows_batch,
    training_run,
)

ONE_WINNER = (1.0, 0.0, 0.0, 0.0)
"""Rewards of a group of four: mean 0.25, unbiased std sqrt((0.75² + 3 x 0.25²) / 3) = 0.5."""


def _advantages(
    directory: Path, grpo: dict, rewards: tuple[float, ...], truncated: tuple[int, ...] = ()
) -> list[float]:
    training = training_run(directory, {"grpo": grpo})
    outcomes = [
        RolloutOutcome(f"r{i}", "g0", reward, truncated=i in truncated)
        for i, reward in enumerate(rewards)
    ]
    return compute_advantages(outcomes, training.advantages).advantages.tolist()


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _grad_norm(model: torch.nn.Module) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))


# -- advantages ----------------------------------------------------------------------------------


def test_normalize_rewards_divides_advantages_by_the_group_std(tmp_path: Path) -> None:
    normalized = _advantages(tmp_path / "on", {}, ONE_WINNER)
    centred = _advantages(tmp_path / "off", {"normalize_rewards": False}, ONE_WINNER)

    # (r - 0.25) / 0.5, and r - 0.25
    assert normalized == pytest.approx([1.5, -0.5, -0.5, -0.5], abs=1e-5)
    assert centred == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_leave_one_out_baseline_changes_advantages(tmp_path: Path) -> None:
    centred = {"normalize_rewards": False}
    loo = _advantages(tmp_path / "loo", {**centred, "use_leave_one_out_baseline": True}, ONE_WINNER)
    mean = _advantages(tmp_path / "mean", centred, ONE_WINNER)

    # each rollout against the mean of the other three: 1 - 0, 0 - 1/3
    assert loo == pytest.approx([1.0, -1 / 3, -1 / 3, -1 / 3])
    assert mean == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_advantage_clip_high_caps_each_rollouts_advantage(tmp_path: Path) -> None:
    capped = _advantages(tmp_path, {"advantage_clip_high": 1.0}, ONE_WINNER)

    assert capped == pytest.approx([1.0, -0.5, -0.5, -0.5], abs=1e-5)  # 1.5 capped at 1.0


def test_advantage_clip_low_floors_each_rollouts_advantage(tmp_path: Path) -> None:
    floored = _advantages(tmp_path, {"advantage_clip_low": -0.25}, ONE_WINNER)

    assert floored == pytest.approx([1.5, -0.25, -0.25, -0.25], abs=1e-5)  # -0.5 floored


def test_masked_reward_policy_include_keeps_a_filtered_rollouts_reward_in_the_baseline(
    tmp_path: Path,
) -> None:
    # rollout 0 was truncated and is filtered (overlong_filtering); it trains nothing either way
    rewards, filtered = (
        (1.0, 1.0, 0.0, 0.0),
        {"overlong_filtering": True, "normalize_rewards": False},
    )
    excluded = _advantages(tmp_path / "exclude", filtered, rewards, truncated=(0,))
    included = _advantages(
        tmp_path / "include", {**filtered, "masked_reward_policy": "include"}, rewards, (0,)
    )

    # baseline over rollouts 1..3: 1/3; over all four: 1/2
    assert excluded == pytest.approx([0.0, 2 / 3, -1 / 3, -1 / 3])
    assert included == pytest.approx([0.0, 0.5, -0.5, -0.5])


def test_overlong_filtering_excludes_a_rollout_that_hit_the_length_limit(tmp_path: Path) -> None:
    def step(directory: Path, overlong_filtering: bool) -> dict[str, float]:
        training = training_run(directory, {"grpo": {"overlong_filtering": overlong_filtering}})
        mine = own_logprobs(training.model)
        rollouts = [rollout("r0", 1.0, mine, finish_reason="length")]
        rollouts += [rollout(f"r{i}", 0.0, mine) for i in (1, 2, 3)]
        return training.train(published(training, rollouts)).metrics

    filtered = step(tmp_path / "on", True)
    kept = step(tmp_path / "off", False)

    assert (filtered["forest/masked_rows"], filtered["train/retained_tokens"]) == (1.0, 9.0)
    assert (kept["forest/masked_rows"], kept["train/retained_tokens"]) == (0.0, 12.0)


def test_seq_logprob_error_threshold_excludes_a_rollout_the_trainer_disagrees_with(
    tmp_path: Path,
) -> None:
    def step(directory: Path, threshold: float | None) -> dict[str, float]:
        training = training_run(directory, {"grpo": {"seq_logprob_error_threshold": threshold}})
        mine = own_logprobs(training.model)  # about -6.2 each: pooled error 1
        # rollout 0 was sampled with logprob 0: error exp(about 6.2), about 500
        rollouts = [rollout("r0", 1.0, [0.0, 0.0, 0.0])]
        rollouts += [rollout(f"r{i}", 0.0, mine) for i in (1, 2, 3)]
        return training.train(published(training, rollouts)).metrics

    judged = step(tmp_path / "on", 2.0)
    trusted = step(tmp_path / "off", None)

    assert (judged["forest/masked_rows"], judged["train/retained_tokens"]) == (1.0, 9.0)
    assert (trusted["forest/masked_rows"], trusted["train/retained_tokens"]) == (0.0, 12.0)


TWO_GROUPS = {
    "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
    "policy": {"train_global_batch_size": 4},
}
"""A step of two prompt groups, ``a`` and ``b``, of two rollouts each."""


def _two_group_step(directory: Path, *overrides: dict) -> dict[str, float]:
    """One step of groups ``a`` (both rollouts verified) and ``b`` (rollout ``b0`` masked)."""
    training = training_run(directory, TWO_GROUPS, *overrides)
    mine = own_logprobs(training.model)
    rollouts = [rollout("a0", 1.0, mine, group="a"), rollout("a1", 0.0, mine, group="a")]
    rollouts += [rollout("b0", 1.0, mine, group="b", masked=True)]
    rollouts += [rollout("b1", 0.0, mine, group="b")]
    return training.train(published(training, rollouts)).metrics


def test_min_valid_fraction_per_group_drops_a_group_with_too_few_verified_rollouts(
    tmp_path: Path,
) -> None:
    def dropped(directory: Path, fraction: float | None) -> float:
        metrics = _two_group_step(
            directory,
            {"token_capture": {"min_valid_fraction_per_group": fraction}},
            {"async_rl": {"rollout_failure": {"min_step_batch_fraction": 0.5}}},
        )
        return metrics["dropped_prompt_groups"]

    # group b has 1 of 2 rollouts verified: 0.5
    assert dropped(tmp_path / "strict", 1.0) == 1.0
    assert dropped(tmp_path / "half", 0.5) == 0.0
    assert dropped(tmp_path / "off", None) == 0.0


def test_min_step_batch_fraction_stops_a_step_that_retains_too_few_prompt_groups(
    tmp_path: Path,
) -> None:
    drops_b = {"token_capture": {"min_valid_fraction_per_group": 1.0}}

    def step(directory: Path, fraction: float) -> dict[str, float]:
        failure = {"async_rl": {"rollout_failure": {"min_step_batch_fraction": fraction}}}
        return _two_group_step(directory, drops_b, failure)

    # dropping group b leaves 2 of 4 logical rollouts: enough for 0.5, below 1.0's floor of 4
    assert step(tmp_path / "half", 0.5)["dropped_prompt_groups"] == 1.0
    with pytest.raises(BatchError) as stopped:
        step(tmp_path / "all", 1.0)
    assert stopped.value.rule == "min_step_batch_fraction"
    assert stopped.value.detail.startswith(
        "step 0: dropped prompt groups b (below_min_valid_fraction) leave 2 of 4 logical "
        "rollouts, below the floor of 4 (async_rl.rollout_failure.min_step_batch_fraction): "
        "training stops."
    )


def test_a_group_below_min_valid_fraction_is_taken_out_of_the_batch_before_it_trains(
    tmp_path: Path,
) -> None:
    # a batch holding group b (1 of 2 verified) was published, as an earlier Grove would
    dropped = _two_group_step(
        tmp_path,
        {"token_capture": {"min_valid_fraction_per_group": 1.0}},
        {"async_rl": {"rollout_failure": {"min_step_batch_fraction": 0.5}}},
    )

    # group a alone: 2 rollouts, 2 rows of 3 owned generated tokens; b's rows are gone
    assert (dropped["logical_rollouts"], dropped["forest/rows"]) == (2.0, 2.0)
    assert (dropped["train/retained_tokens"], dropped["forest/masked_rows"]) == (6.0, 0.0)
    assert dropped["dropped_prompt_groups/below_min_valid_fraction"] == 1.0
    assert dropped["scheduler_step_increment"] == 2.0


def test_a_step_that_retains_no_group_never_reaches_the_optimizer(tmp_path: Path) -> None:
    training = training_run(
        tmp_path,
        TWO_GROUPS,
        {"token_capture": {"min_valid_fraction_per_group": 1.0}},
        {"async_rl": {"rollout_failure": {"min_step_batch_fraction": 0.25}}},  # floor: 1
    )
    mine = own_logprobs(training.model)
    rollouts = [
        rollout(f"{g}{i}", float(i), mine, group=g, masked=i == 0) for g in "ab" for i in (0, 1)
    ]
    before = _parameters(training.model)

    with pytest.raises(BatchError, match=r"leave 0 of 4 logical rollouts, below the floor of 1"):
        training.train(published(training, rollouts))
    assert (training.step, training.trainer.optimizer.state) == (0, {})
    assert all(torch.equal(a, b) for a, b in zip(before, training.model.parameters(), strict=True))


# -- loss ----------------------------------------------------------------------------------------


def test_ratio_clip_max_caps_the_ratio_of_a_positive_advantage(tmp_path: Path) -> None:
    def step(directory: Path, clip: float) -> tuple[float, int]:
        training = training_run(directory, {"loss_fn": {"ratio_clip_max": clip}})
        report = training.trainer.train_step(ratio_batch(training.model, ratio=1.5, advantage=1.0))
        return report.loss, report.clipped_tokens

    # per token max(-1 x 1.5, -1 x clamp(1.5, 0.8, 1 + eps)): -1.2 with eps 0.2, -1.5 with 0.6
    assert step(tmp_path / "narrow", 0.2) == (pytest.approx(-1.2, rel=1e-5), 12)
    assert step(tmp_path / "wide", 0.6) == (pytest.approx(-1.5, rel=1e-5), 0)


def test_ratio_clip_min_floors_the_ratio_of_a_negative_advantage(tmp_path: Path) -> None:
    def step(directory: Path, clip: float) -> tuple[float, int]:
        training = training_run(directory, {"loss_fn": {"ratio_clip_min": clip}})
        report = training.trainer.train_step(ratio_batch(training.model, ratio=0.5, advantage=-1.0))
        return report.loss, report.clipped_tokens

    # per token max(0.5, clamp(0.5, 1 - eps, 1.2)): 0.8 with eps 0.2, 0.5 with 0.6
    assert step(tmp_path / "narrow", 0.2) == (pytest.approx(0.8, rel=1e-5), 12)
    assert step(tmp_path / "wide", 0.6) == (pytest.approx(0.5, rel=1e-5), 0)


# -- optimizer -----------------------------------------------------------------------------------


def test_learning_rate_is_the_size_of_the_first_adam_step(tmp_path: Path) -> None:
    def largest_change(directory: Path, rate: float) -> tuple[float, float]:
        training = training_run(directory, {"policy": {"learning_rate": rate}})
        before = _parameters(training.model)
        report = training.trainer.train_step(rows_batch(4))
        after = _parameters(training.model)
        change = max(float((a - b).abs().max()) for a, b in zip(after, before, strict=True))
        return report.learning_rate, change

    # Adam's first step moves a parameter by lr x g / (|g| + 1e-8): lr where |g| >> 1e-8
    assert largest_change(tmp_path / "small", 1e-3) == (1e-3, pytest.approx(1e-3, rel=1e-3))
    assert largest_change(tmp_path / "large", 1e-2) == (1e-2, pytest.approx(1e-2, rel=1e-3))


def test_weight_decay_shrinks_every_weight_on_a_step_without_gradient(tmp_path: Path) -> None:
    def step(directory: Path, decay: float) -> list[tuple[torch.Tensor, torch.Tensor]]:
        training = training_run(
            directory, {"policy": {"learning_rate": 0.1, "weight_decay": decay}}
        )
        before = _parameters(training.model)
        training.trainer.train_step(rows_batch(4, advantage=0.0))  # zero loss, zero gradient
        return list(zip(_parameters(training.model), before, strict=True))

    # AdamW multiplies each weight by 1 - lr x weight_decay = 1 - 0.1 x 0.5 = 0.95
    decayed = step(tmp_path / "decay", 0.5)
    assert all(torch.allclose(after, 0.95 * before, rtol=1e-6, atol=0) for after, before in decayed)
    assert all(torch.equal(after, before) for after, before in step(tmp_path / "none", 0.0))


def test_max_grad_norm_clips_the_gradient_the_optimizer_applies(tmp_path: Path) -> None:
    clipped = training_run(tmp_path / "clipped", {"policy": {"max_grad_norm": 1e-3}})
    free = training_run(tmp_path / "free", {"policy": {"max_grad_norm": None}})

    clipped_report = clipped.trainer.train_step(rows_batch(4))
    free_report = free.trainer.train_step(rows_batch(4))

    assert clipped_report.grad_norm is not None and clipped_report.grad_norm > 1e-3
    assert _grad_norm(clipped.model) == pytest.approx(1e-3, rel=1e-4)
    assert free_report.grad_norm is None
    assert _grad_norm(free.model) == pytest.approx(clipped_report.grad_norm, rel=1e-4)


def test_lr_warmup_rollouts_ramps_the_learning_rate_over_logical_rollouts(tmp_path: Path) -> None:
    def rates(directory: Path, warmup: int) -> list[float]:
        training = training_run(
            directory, {"policy": {"learning_rate": 0.01, "lr_warmup_rollouts": warmup}}
        )
        return [training.trainer.train_step(rows_batch(4)).learning_rate for _ in range(2)]

    # factor (n + 1) / (4 + 1) after n rollouts: 1/5 at step 1, 5/5 after its 4 rollouts
    assert rates(tmp_path / "warm", 4) == pytest.approx([0.002, 0.01])
    assert rates(tmp_path / "cold", 0) == pytest.approx([0.01, 0.01])


# -- batches -------------------------------------------------------------------------------------


def test_train_micro_batch_size_is_the_rows_of_each_forward_pass(tmp_path: Path) -> None:
    def passes(directory: Path, rows: int) -> list[tuple[str, int]]:
        training = training_run(directory, {"policy": {"train_micro_batch_size": rows}})
        seen = forward_passes(training.model)
        training.trainer.train_step(rows_batch(4))
        return seen

    assert passes(tmp_path / "two", 2) == [("train", 2), ("train", 2)]
    assert passes(tmp_path / "four", 4) == [("train", 4)]


def test_logprob_micro_batch_size_is_the_rows_of_each_recompute_pass(tmp_path: Path) -> None:
    def passes(directory: Path, *overrides: dict) -> list[tuple[str, int]]:
        training = training_run(directory, *overrides)
        mine = own_logprobs(training.model)
        rollouts = [rollout(f"r{i}", float(i), mine) for i in range(4)]
        seen = forward_passes(training.model)
        training.train(published(training, rollouts))
        return seen

    judged = {"grpo": {"seq_logprob_error_threshold": 2.0}}
    # the trainer recomputes logprobs (eval passes) to judge the threshold, then trains
    ones = passes(tmp_path / "one", judged, {"policy": {"logprob_micro_batch_size": 1}})
    fours = passes(tmp_path / "four", judged, {"policy": {"logprob_micro_batch_size": 4}})
    assert ones == [("eval", 1)] * 4 + [("train", 2)] * 2
    assert fours == [("eval", 4)] + [("train", 2)] * 2
    # without a threshold nothing is recomputed, so the key has nothing to size
    assert (
        passes(tmp_path / "none", {"policy": {"logprob_micro_batch_size": 1}}) == [("train", 2)] * 2
    )


def test_train_global_batch_size_is_the_logical_rollouts_of_every_step(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as refused:
        load_config({"policy": {"train_global_batch_size": 8}})
    assert refused.value.problems == (
        "policy.train_global_batch_size (8) must equal the logical rollouts per step, "
        "grpo.num_prompts_per_step x grpo.num_generations_per_prompt (16): one optimizer step "
        "per batch",
    )
    training = training_run(tmp_path)  # 1 group x 4 rollouts, train_global_batch_size 4
    with pytest.raises(
        BatchError,
        match=r"a step holds at most policy\.train_global_batch_size = 4 logical rollouts, "
        r"got 5 \(in 5 rows\)",
    ):
        training.trainer.train_step(rows_batch(5))
    assert training.trainer.train_step(rows_batch(4)).logical_rollouts == 4
