"""A harness result's environment mask in a real ``grove train`` run: the flagged rollout is
recorded in ``rollout.selected``, filtered (``environment``), counted once in
``num_mask_sample_filtered``, and its sibling trains (``docs/forest.md``, "Environment masks")."""

from __future__ import annotations

import pytest

from tests.unit.config.result_harnesses import SANDBOX_CRASH
from tests.unit.config.runs import Run, train

HARNESS = "tests.unit.config.result_harnesses"


@pytest.fixture(scope="module")
def masked_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    # One group of two rollouts per step, padded to four rows: rollout 1 is flagged each step.
    directory = tmp_path_factory.mktemp("environment")
    overrides = {
        "harness": {"target": f"{HARNESS}:crash_second_rollout"},
        "policy": {"data_parallel_size": 2},  # row multiple 2 ranks x 2 rows = 4
    }
    return train(directory, overrides)


def test_the_environment_mask_is_recorded_in_the_selection(masked_run: Run) -> None:
    flagged = masked_run.attempt("keys-s0-g0-r1").selection
    unflagged = masked_run.attempt("keys-s0-g0-r0").selection
    assert (flagged.environment_masked, flagged.environment_mask_reason) == (True, SANDBOX_CRASH)
    assert (unflagged.environment_masked, unflagged.environment_mask_reason) == (False, None)


def test_an_environment_masked_rollout_is_counted_once_per_step(masked_run: Run) -> None:
    assert [m["num_mask_sample_filtered"] for m in masked_run.metrics()] == [1.0, 1.0]


def test_an_environment_masked_rollout_excludes_its_row_and_never_the_padding(
    masked_run: Run,
) -> None:
    # Per step: two real rows (one per rollout) and two padding rows; only the flagged
    # rollout's row is excluded, padding is not counted as masked.
    metrics = masked_run.metrics()
    assert [m["forest/rows"] for m in metrics] == [2.0, 2.0]
    assert [m["forest/padding_rows"] for m in metrics] == [2.0, 2.0]
    assert [m["forest/masked_rows"] for m in metrics] == [1.0, 1.0]


def test_the_siblings_of_an_environment_masked_rollout_train(masked_run: Run) -> None:
    # The flagged rollout is verified (its forest is trainable) but filtered; its group is
    # kept, and with masked_reward_policy exclude its sibling is the only baseline
    # participant: advantage 0, a step that still trains and publishes.
    for step in (0, 1):
        assert masked_run.attempt(f"keys-s{step}-g0-r1").finalized.trainable
    metrics = masked_run.metrics()
    assert [m["dropped_prompt_groups"] for m in metrics] == [0.0, 0.0]
    assert [m["scheduler_step_increment"] for m in metrics] == [2.0, 2.0]
