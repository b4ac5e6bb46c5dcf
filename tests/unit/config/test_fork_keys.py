"""What ``grpo.forks`` changes in a ``grove train`` run: per-state groups (``docs/fork.md``).

Each run is the tiny run of ``tests/unit/config/runs.py`` with two prompt groups of two rollouts
per step and the ``fork_aware`` harness: a task rollout makes two calls (``c0``, then ``c1``, the
scored one) and scores its rollout index (0 or 1); a fork sends the conversation it was given
plus one message (``f0``). So the only turn a step-0 rollout offers is its ``c0``, and rollout 0
of each group is the one below its group's mean.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.config.runs import Run, train

FORKS = {
    "grpo": {"num_prompts_per_step": 2, "forks": {"per_step": 1}},
    "policy": {"train_global_batch_size": 4},
}
NO_FORKS = {"grpo": {"num_prompts_per_step": 2}, "policy": {"train_global_batch_size": 4}}


def _fork_run(directory: Path, pick: str = "uniform") -> Run:
    return train(directory, FORKS, {"grpo": {"forks": {"pick": pick}}}, harness="fork_aware")


@pytest.fixture(scope="module")
def forked(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return _fork_run(tmp_path_factory.mktemp("forks"))


def test_forks_per_step_makes_one_group_of_step_1_a_fork_of_a_step_0_turn(forked: Run):
    forks = [forked.attempt(f"keys-s1-f0-r{r}") for r in (0, 1)]
    sources = {
        (a.opened.fork_from.source_capture_key, a.opened.fork_from.source_call_id) for a in forks
    }
    [(source_key, call_id)] = sources  # both rollouts of the group fork one call
    assert source_key.startswith("keys-s0-g") and call_id == "c0"
    for attempt in forks:
        call = attempt.calls["f0"]
        assert (call.parent_call_id, call.intended.source_capture_key) == ("c0", source_key)
    assert forked.attempt("keys-s1-g1-r0").opened is None  # the fork group took its place
    assert forked.attempt("keys-s1-g0-r0").opened is not None


def test_a_forks_harness_gets_the_source_conversation_in_its_task(forked: Run):
    source = forked.attempt("keys-s1-f0-r0").opened.fork_from
    played = [p for p in forked.played() if "fork" in p["task"]]
    assert len(played) == 2
    fork = played[0]["task"]["fork"]
    assert (fork["capture_key"], fork["call_id"]) == (
        source.source_capture_key,
        source.source_call_id,
    )
    assert fork["cum_len"] == source.source_cum_len
    assert fork["messages"][0] == {"role": "user", "content": played[0]["task"]["prompt"]}
    assert [m["role"] for m in fork["messages"]] == ["user", "assistant"]


def test_forks_metrics_count_the_fork_groups_and_their_reward_variance(forked: Run):
    first, second = forked.metrics()
    assert first["forks/groups"] == 0.0 and "forks/reward_variance" not in first
    # the fork group's rollouts score 0 and 1: population variance 0.25
    assert (second["forks/groups"], second["forks/reward_variance"]) == (1.0, 0.25)


def test_without_forks_every_group_plays_a_task(tmp_path: Path):
    run = train(tmp_path, NO_FORKS, harness="fork_aware")
    assert [p for p in run.played() if "fork" in p["task"]] == []
    assert "forks/groups" not in run.metrics()[1]
    assert run.attempt("keys-s1-g1-r0").opened is not None


def test_forks_pick_low_reward_forks_a_turn_of_a_rollout_below_its_groups_mean(tmp_path: Path):
    low = _fork_run(tmp_path / "low", "low_reward").attempt("keys-s1-f0-r0").opened.fork_from
    uniform = _fork_run(tmp_path / "uniform", "uniform").attempt("keys-s1-f0-r0").opened.fork_from
    assert low.source_capture_key.endswith("-r0")  # reward 0, below its group's mean 0.5
    # seed 0's uniform draw at step 1 falls on a rollout 1 (reward 1): low_reward never takes it
    assert uniform.source_capture_key.endswith("-r1")
