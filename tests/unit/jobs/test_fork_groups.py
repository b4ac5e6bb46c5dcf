"""Which turns a step forks, and what its fork groups scored (``grove/train/fork_groups.py``)."""

from __future__ import annotations

import random

from grove.train.fork_groups import (
    ForkPick,
    SourceRollout,
    fork_candidates,
    fork_metrics,
    pick_forks,
)


def _rollout(key: str, reward: float, *calls: str, group: str = "g0", trainable: bool = True):
    return SourceRollout(key, group, reward, calls, calls[-1] if calls else None, trainable)


def test_every_selected_call_but_the_scored_one_is_a_turn_to_fork():
    rollouts = [_rollout("a", 1.0, "c0", "c1", "c2"), _rollout("b", 0.0, "c0")]
    assert fork_candidates(rollouts, "uniform") == [
        ForkPick("a", "c0", "g0"),
        ForkPick("a", "c1", "g0"),
    ]


def test_a_forks_source_calls_and_untrainable_rollouts_offer_no_turn():
    rollouts = [
        _rollout("fork", 1.0, "src/c0", "f0", "f1"),  # "src/c0": the source's call, not the fork's
        _rollout("masked", 1.0, "c0", "c1", trainable=False),
    ]
    assert fork_candidates(rollouts, "uniform") == [ForkPick("fork", "f0", "g0")]


def test_low_reward_offers_the_turns_of_rollouts_below_their_groups_mean():
    rollouts = [
        _rollout("a", 0.0, "c0", "c1"),
        _rollout("b", 1.0, "c0", "c1"),
        _rollout("c", 0.5, "c0", "c1", group="g1"),  # alone in its group: at its mean
        _rollout("d", 0.5, "c0", "c1", group="g1"),
    ]
    assert fork_candidates(rollouts, "low_reward") == [ForkPick("a", "c0", "g0")]


def test_low_reward_offers_every_turn_when_no_rollout_is_below_its_groups_mean():
    rollouts = [_rollout("a", 1.0, "c0", "c1"), _rollout("b", 1.0, "c0", "c1")]
    assert fork_candidates(rollouts, "low_reward") == fork_candidates(rollouts, "uniform")


def test_the_pick_is_a_uniform_draw_seeded_by_the_runs_seed_and_the_step():
    candidates = [ForkPick(f"k{i}", "c0", "g0") for i in range(10)]
    expected = random.Random("grove-forks/7/3").sample(candidates, 2)
    assert pick_forks(candidates, count=2, seed=7, step=3) == expected
    assert pick_forks(candidates, count=2, seed=7, step=3) == expected  # the same every run
    assert pick_forks(candidates, count=2, seed=7, step=4) != expected


def test_with_fewer_candidates_than_asked_every_candidate_is_forked():
    candidates = [ForkPick("k0", "c0", "g0"), ForkPick("k1", "c0", "g0")]
    assert pick_forks(candidates, count=5, seed=0, step=1) == candidates


def test_fork_metrics_count_the_groups_and_average_their_reward_variance():
    # variances: [0, 1] -> 0.25, [1, 1] -> 0; mean 0.125
    assert fork_metrics({"f0": [0.0, 1.0], "f1": [1.0, 1.0]}) == {
        "forks/groups": 2.0,
        "forks/reward_variance": 0.125,
    }
    assert fork_metrics({}) == {"forks/groups": 0.0}
