"""Dropped prompt groups in ``grove train`` with an in-process harness (``docs/forest.md``,
"Failures and drops"): a group whose rollouts are all masked, whose harness raised or hung past
``async_rl.rollout_failure.rollout_timeout_s``, or that has too few verified rollouts is left out
of its step; the step trains the others when ``min_step_batch_fraction`` allows it, plays
replacement groups within ``max_replacement_groups``, and stops training otherwise, naming why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file

from grove.config import load_config
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.events import BatchPublished
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.storage.keys import staging_prefix
from grove.train.job import TrainSummary, run_training
from grove.train.rollouts import replacement_task
from grove.training.errors import BatchError
from grove.training.forest import MaskReason
from grove.workspace import Workspace
from tests.unit.config.runs import merged

RUN = "drops"
HARNESS = "tests.e2e.drop_harness:play"


def _config(tmp_path: Path, fraction: float) -> dict:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"prompt": "Say hello."}\n{"prompt": "Name a fox.", "rewrite": true}\n')
    return {
        "harness": {"target": "tests.e2e.rewriting_harness:play"},
        "data": {"path": str(tasks), "shuffle": False},
        "token_capture": {"forest_training": False, "pending_call_timeout_s": 10},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
        "policy": {"train_global_batch_size": 4, "train_micro_batch_size": 2},
        "async_rl": {"rollout_failure": {"min_step_batch_fraction": fraction}},
        "logging": {"tensorboard": False},
    }


def test_a_group_with_every_rollout_masked_is_dropped_and_the_step_trains_the_others(
    tmp_path: Path,
) -> None:
    workspace = Workspace.resolve(tmp_path / "work")
    summary = run_training(load_config(_config(tmp_path, 0.5)), workspace, steps=1)
    assert (summary.steps, summary.logical_rollouts) == (1, 2)  # one group of two trained
    (record,) = [
        json.loads(line)
        for line in (workspace.workdir / "runs" / summary.run_id / "metrics.jsonl").open()
    ]
    assert record["metrics"]["dropped_prompt_groups"] == 1.0


def test_a_dropped_group_below_the_step_floor_stops_training_naming_it(tmp_path: Path) -> None:
    workspace = Workspace.resolve(tmp_path / "work")
    with pytest.raises(BatchError) as stopped:
        run_training(load_config(_config(tmp_path, 1.0)), workspace, steps=1)
    assert stopped.value.rule == "min_step_batch_fraction"
    assert "-s0-g1 (no_valid_layout) leave 2 of 4 logical rollouts" in stopped.value.detail


# -- failed, hung and replaced groups (tests/e2e/drop_harness.py) --------------------------------


def _tasks(directory: Path, *tasks: dict[str, Any]) -> str:
    path = directory / "tasks.jsonl"
    path.write_text("".join(json.dumps(task) + "\n" for task in tasks))
    return str(path)


def _drop_config(directory: Path, tasks: list[dict[str, Any]], *overrides: dict) -> dict:
    """Two groups of two one-call rollouts a step, on ``tasks`` in file order."""
    directory.mkdir(parents=True, exist_ok=True)
    data: dict[str, Any] = {
        "harness": {"target": HARNESS, "options": {"log": str(directory / "harness.jsonl")}},
        "data": {"path": _tasks(directory, *tasks), "shuffle": False},
        "token_capture": {"pending_call_timeout_s": 10},
        "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 2},
        "policy": {"train_global_batch_size": 4, "train_micro_batch_size": 2},
        "logging": {"tensorboard": False},
    }
    for override in overrides:
        data = merged(data, override)
    return data


def _train(directory: Path, data: dict, steps: int = 1, resume: bool = False) -> TrainSummary:
    workspace = Workspace.resolve(directory / "work")
    return run_training(load_config(data), workspace, steps=steps, resume=resume, run_id=RUN)


def _metrics(directory: Path) -> list[dict[str, float]]:
    lines = (directory / "work" / "runs" / RUN / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["metrics"] for line in lines]


def _attempt(directory: Path, capture_key: str) -> AttemptState:
    store = EventStore.open(Workspace.resolve(directory / "work").database_url)
    try:
        return AttemptLog(store).load(capture_key)
    finally:
        store.close()


def _published_groups(directory: Path) -> list[list[str]]:
    """Each published step's prompt groups, in batch order."""
    store = EventStore.open(Workspace.resolve(directory / "work").database_url)
    try:
        events = [s.decode() for s in store.read_stream(f"training-{RUN}")]
    finally:
        store.close()
    steps = []
    for event in events:
        assert isinstance(event, BatchPublished)
        steps.append(list(dict.fromkeys(r.rsplit("-r", 1)[0] for r in event.rollout_ids)))
    return steps


def _fraction(value: float) -> dict:
    return {"async_rl": {"rollout_failure": {"min_step_batch_fraction": value}}}


OK, FOX = {"prompt": "Say hello."}, {"prompt": "Name a fox."}
RAISES = {"prompt": "Name a fox.", "raise": [1]}


def test_a_harness_that_raises_drops_its_group_and_the_step_trains_the_others(
    tmp_path: Path,
) -> None:
    summary = _train(tmp_path, _drop_config(tmp_path, [OK, RAISES], _fraction(0.5)))

    assert (summary.steps, summary.logical_rollouts) == (1, 2)
    assert _published_groups(tmp_path) == [[f"{RUN}-s0-g0"]]
    (metrics,) = _metrics(tmp_path)
    assert metrics["dropped_prompt_groups"] == metrics["dropped_prompt_groups/harness_failed"] == 1
    failed = _attempt(tmp_path, f"{RUN}-s0-g1-r1")  # recorded as abandoned, never as a result
    assert failed.admissions_closed and failed.settled is not None
    assert failed.selection is not None
    assert (failed.selection.policy, failed.selection.call_ids) == ("abandoned:harness_failed", ())
    assert failed.finalized is not None and not failed.finalized.trainable


def test_a_harness_that_raises_stops_the_run_at_the_default_fraction_naming_rollout_and_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(BatchError) as stopped:
        _train(tmp_path, _drop_config(tmp_path, [OK, RAISES]))

    assert stopped.value.rule == "min_step_batch_fraction"
    assert stopped.value.detail.startswith(
        f"step 0: dropped prompt groups {RUN}-s0-g1 (harness_failed: rollout {RUN}-s0-g1-r1: "
        "the harness raised ValueError('boom in rollout 1')) leave 2 of 4 logical rollouts, "
        "below the floor of 4 (async_rl.rollout_failure.min_step_batch_fraction): training stops."
    )
    assert (tmp_path / "work" / "runs" / RUN / "metrics.jsonl").read_text() == ""  # no step


@pytest.mark.slow
def test_a_hung_rollout_is_abandoned_after_rollout_timeout_s_and_its_group_dropped(
    tmp_path: Path,
) -> None:
    hangs = {"prompt": "Name a fox.", "hang": [0]}
    timeout = {"async_rl": {"rollout_failure": {"rollout_timeout_s": 5.0}}}  # the others: < 1 s
    summary = _train(tmp_path, _drop_config(tmp_path, [OK, hangs], _fraction(0.5), timeout))

    assert (summary.steps, summary.logical_rollouts) == (1, 2)
    assert _published_groups(tmp_path) == [[f"{RUN}-s0-g0"]]
    (metrics,) = _metrics(tmp_path)
    assert metrics["dropped_prompt_groups/rollout_timeout"] == 1.0
    hung = _attempt(tmp_path, f"{RUN}-s0-g1-r0")
    assert hung.admissions_closed and hung.selection is not None
    assert (hung.selection.policy, hung.selection.result) == ("abandoned:rollout_timeout", None)
    # the harness's next call after the attempt closed was refused, and it unwound
    log = (tmp_path / "harness.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in log] == [{"refused": "attempt_closed"}]


def test_a_group_below_min_valid_fraction_is_left_out_of_the_batch(tmp_path: Path) -> None:
    # rollout 0 of the fox task rewrites its context: masked without forest training
    half_masked = {"prompt": "Name a fox.", "rewrite": [0]}
    strict = {"token_capture": {"min_valid_fraction_per_group": 1.0}}
    summary = _train(tmp_path, _drop_config(tmp_path, [OK, half_masked], _fraction(0.5), strict))

    assert (summary.steps, summary.logical_rollouts, summary.rows) == (1, 2, 2)
    (metrics,) = _metrics(tmp_path)
    assert metrics["dropped_prompt_groups/below_min_valid_fraction"] == 1.0
    assert (metrics["forest/rows"], metrics["forest/masked_rows"]) == (2.0, 0.0)
    assert _published_groups(tmp_path) == [[f"{RUN}-s0-g0"]]


def test_a_dropped_groups_staging_blobs_are_removed_after_the_step_selected_ones_included(
    tmp_path: Path,
) -> None:
    half_masked = {"prompt": "Name a fox.", "rewrite": [0]}
    strict = {"token_capture": {"min_valid_fraction_per_group": 1.0}}
    _train(tmp_path, _drop_config(tmp_path, [OK, half_masked], _fraction(0.5), strict))

    verified = _attempt(tmp_path, f"{RUN}-s0-g1-r1")  # trainable, in the dropped group
    assert verified.finalized is not None and verified.finalized.trainable
    blobs = open_blob_store(Workspace.resolve(tmp_path / "work").blob_url)
    for rollout in ("r0", "r1"):
        key = f"{RUN}-s0-g1-{rollout}"
        committed = sorted(c.committed.blob_key for c in _attempt(tmp_path, key).calls.values())
        assert blobs.list_keys(staging_prefix(key)) == []
        assert sorted(_attempt(tmp_path, key).cleaned_keys) == committed
    assert blobs.list_keys(staging_prefix(f"{RUN}-s0-g0-r1")) != []  # trained: selected kept
    store = EventStore.open(Workspace.resolve(tmp_path / "work").database_url)
    try:
        (published,) = [s.decode() for s in store.read_stream(f"training-{RUN}")]
    finally:
        store.close()
    assert isinstance(published, BatchPublished)
    assert published.dropped_rollout_ids == (f"{RUN}-s0-g1-r0", f"{RUN}-s0-g1-r1")


def _replacing(directory: Path, *overrides: dict, interrupt: bool = False) -> dict:
    """Step 0 plays tasks 0 and 1, whose rollout 1 raises; replacement 0 plays task 2 (whose
    rollout 1, with ``interrupt``, stops the run once as Ctrl-C would)."""
    replaced = {**FOX, "interrupt": [1]} if interrupt else FOX
    tasks = [OK, RAISES, replaced, {"prompt": "Name a bird."}]
    assert replacement_task(len(tasks), seed=0, step=0, index=0) == 2
    replace_one = {"async_rl": {"rollout_failure": {"max_replacement_groups": 1}}}
    once = {"harness": {"options": {"once": str(directory / "interrupted-once")}}}
    return _drop_config(directory, tasks, replace_one, once, *overrides)


def test_a_dropped_group_is_replaced_by_a_freshly_played_group_before_the_step_trains(
    tmp_path: Path,
) -> None:
    summary = _train(tmp_path, _replacing(tmp_path))

    assert (summary.steps, summary.logical_rollouts) == (1, 4)
    assert _published_groups(tmp_path) == [[f"{RUN}-s0-g0", f"{RUN}-s0-g2"]]
    (metrics,) = _metrics(tmp_path)
    assert (metrics["dropped_prompt_groups"], metrics["replacement_groups"]) == (1.0, 1.0)
    replacement = _attempt(tmp_path, f"{RUN}-s0-g2-r0")
    assert replacement.opened is not None and replacement.opened.prompt_group == f"{RUN}-s0-g2"


@pytest.mark.slow
def test_a_resumed_step_plays_the_same_replacement_groups(tmp_path: Path) -> None:
    straight_dir, interrupted_dir = tmp_path / "straight", tmp_path / "interrupted"
    straight = _train(straight_dir, _replacing(straight_dir))
    config = _replacing(interrupted_dir, interrupt=True)
    with pytest.raises(KeyboardInterrupt):  # in the replacement group, before the step trains
        _train(interrupted_dir, config)
    resumed = _train(interrupted_dir, config, resume=True)

    assert _published_groups(interrupted_dir) == _published_groups(straight_dir)
    assert resumed.steps == straight.steps == 1
    assert straight.checkpoint is not None and resumed.checkpoint is not None
    a = load_file(Path(straight.checkpoint, "model.safetensors"))
    b = load_file(Path(resumed.checkpoint, "model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)


def test_a_step_that_retains_no_group_stops_before_the_optimizer(tmp_path: Path) -> None:
    both_fail = [RAISES, RAISES]
    with pytest.raises(BatchError) as stopped:
        _train(tmp_path, _drop_config(tmp_path, both_fail, _fraction(0.25)))

    assert " leave 0 of 4 logical rollouts, below the floor of 1 " in stopped.value.detail
    assert not list((tmp_path / "work").rglob("step_*"))  # no checkpoint: no optimizer step
    failed = _attempt(tmp_path, f"{RUN}-s0-g0-r1").finalized
    assert failed is not None and failed.masked_reason == MaskReason.EMPTY_SELECTION
