"""The step counters and length metrics of ``docs/metrics.md`` as a real ``grove train`` run
writes them to ``metrics.jsonl``, worked out from what its harness logged of each call."""

from __future__ import annotations

import pytest

from tests.unit.config.runs import Run, train

HARNESS = "tests.unit.config.result_harnesses"


@pytest.fixture(scope="module")
def plain_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    return train(tmp_path_factory.mktemp("plain"))


@pytest.fixture(scope="module")
def not_closed_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    directory = tmp_path_factory.mktemp("not-closed")
    return train(directory, {"harness": {"target": f"{HARNESS}:drop_first_answer"}})


def _calls_per_step(run: Run) -> list[list[dict]]:
    """Each step's calls, as the harness logged their usage (two rollouts per step)."""
    played = run.played()  # steps play one after the other: two records each
    assert len(played) == 4
    return [played[0]["calls"] + played[1]["calls"], played[2]["calls"] + played[3]["calls"]]


def test_length_metrics_are_the_rollouts_generations_and_rows(plain_run: Run) -> None:
    # One call per rollout, one row each: gen_tokens_per_sample is the mean of the two
    # completions, max_gen_tokens_per_turn the larger, total_tokens_per_sample the mean row
    # length (prompt plus completion).
    for metrics, calls in zip(plain_run.metrics(), _calls_per_step(plain_run), strict=True):
        generated = [c["completion_tokens"] for c in calls]
        rows = [c["prompt_tokens"] + c["completion_tokens"] for c in calls]
        assert metrics["gen_tokens_per_sample"] == sum(generated) / 2
        assert metrics["max_gen_tokens_per_turn"] == max(generated)
        assert metrics["total_tokens_per_sample"] == sum(rows) / 2


def test_a_plain_run_masks_no_rollout_for_an_unclosed_selection(plain_run: Run) -> None:
    assert [m["finalize/selection_not_closed_rollouts"] for m in plain_run.metrics()] == [0.0] * 2


def test_selection_not_closed_rollouts_counts_each_unclosed_rollout_once(
    not_closed_run: Run,
) -> None:
    # Rollout 0 of each step returns its second answer without the first: its selection is
    # the continuation alone, masked selection_not_closed; rollout 1 trains.
    finalized = [not_closed_run.attempt(f"keys-s{s}-g0-r0").finalized for s in (0, 1)]
    assert [f.masked_reason for f in finalized] == ["selection_not_closed"] * 2
    metrics = not_closed_run.metrics()
    assert [m["finalize/selection_not_closed_rollouts"] for m in metrics] == [1.0, 1.0]
    assert [m["finalize/masked_rollouts"] for m in metrics] == [1.0, 1.0]


def test_a_masked_rollout_adds_zero_to_the_length_metrics(not_closed_run: Run) -> None:
    # The masked rollout contributes zeros; the mean is over both rollouts of the step.
    for metrics, record in zip(
        not_closed_run.metrics(), _trained_records(not_closed_run), strict=True
    ):
        (call,) = record["calls"]
        assert metrics["gen_tokens_per_sample"] == call["completion_tokens"] / 2
        assert metrics["max_gen_tokens_per_turn"] == call["completion_tokens"]
        assert (
            metrics["total_tokens_per_sample"]
            == (call["prompt_tokens"] + call["completion_tokens"]) / 2
        )


def _trained_records(run: Run) -> list[dict]:
    """Per step, the harness's record of rollout 1 (the one that trains)."""
    records = [r for r in run.played() if r["rollout_index"] == 1]
    assert len(records) == 2
    return records
