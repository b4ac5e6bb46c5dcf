"""Dropped prompt groups of an external run (``harness.target: external``, ``docs/forest.md``,
"Failures and drops"): an attempt open past ``async_rl.rollout_failure.rollout_timeout_s`` is
closed and its group never trains; a group within ``async_rl.max_policy_lag`` trains on the
logprobs each call was sampled with."""

from __future__ import annotations

import time
from pathlib import Path

import openai
import pytest

from grove.client import GroveClientError
from tests.e2e.external_run import ExternalRun

pytestmark = pytest.mark.slow


def test_an_external_attempt_open_past_the_rollout_timeout_is_closed_and_its_group_dropped(
    tmp_path: Path,
) -> None:
    timeout = {"async_rl": {"rollout_failure": {"rollout_timeout_s": 1.0}}}
    with ExternalRun(tmp_path, timeout, steps=1) as run:
        hung = run.open("g0", 0)
        answer = run.call(hung)
        deadline = time.monotonic() + 30.0  # abandoned about a second after the run saw it
        while hung.status()["selection"] is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hung.status()["selection"]["policy"] == "abandoned:rollout_timeout"
        with pytest.raises(openai.ConflictError) as refused:
            run.call(hung)
        assert refused.value.code == "attempt_closed"
        with pytest.raises(GroveClientError) as late:
            hung.post_result({"output": [{"role": "user", "content": "Hi."}, answer], "reward": 1})
        assert (late.value.status, late.value.code) == (409, "conflicting_event")
        run.rollout("g0", 1)
        run.rollout("g1", 0)
        run.rollout("g1", 1)
        summary = run.finish()

    assert summary.logical_rollouts == 2
    (metrics,) = run.metrics()
    assert metrics["dropped_prompt_groups/rollout_timeout"] == 1.0


def test_a_group_within_max_policy_lag_trains_on_the_logprobs_its_calls_were_sampled_with(
    tmp_path: Path,
) -> None:
    # g0's rollouts straddle step 0 (versions 0 and 1); a large learning rate makes one step
    # move the weights enough that version 0's logprobs differ from the trainer's at step 1
    def second_step_max_tmpe(directory: Path, lag: int) -> float:
        fast = {"policy": {"learning_rate": 1e-2}, "async_rl": {"max_policy_lag": lag}}
        with ExternalRun(directory, fast, steps=2) as run:
            run.rollout("g0", 0)
            run.rollout("g1", 0)
            run.rollout("g1", 1)
            run.wait_for_steps(1)
            if lag:
                run.rollout("g0", 1)  # g0 trains at step 1
            else:
                run.rollout("g2", 0)  # on-policy: g2 trains at step 1
                run.rollout("g2", 1)
            run.finish()
        return run.metrics()[1]["train/max_token_mult_prob_error"]

    assert second_step_max_tmpe(tmp_path / "lagging", 1) > 1.001
    assert second_step_max_tmpe(tmp_path / "on-policy", 0) < 1.0001
