"""What each run-level key changes in a ``grove train`` run (``grove/train/job.py``).

Every test runs the main job's own function, ``run_training``, on the tiny configuration of
``tests/unit/config/runs.py`` with one key changed (plus what the combination rules require),
and compares what happened with the unchanged run (``base_run``) or with a run that sets the key
otherwise: the tasks and seeds the harness got, the gateway it talked to, the ledger's attempts,
the run directory's files, the logged metrics. ``tests/unit/config/test_key_effects.py`` maps
each key to its test.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.config import load_config
from grove.engines.models import EMBEDDED, load_model, save_embedded_model
from grove.ledger.attempt import AttemptLog
from grove.train.harness import rollout_seed
from grove.train.rollouts import replacement_task
from grove.train.tasks import task_order
from grove.train.training_run import TrainingRun
from grove.training.forest import MaskReason
from grove.training.projector import finalization_forest
from tests.e2e.external_run import ExternalRun
from tests.unit.config.runs import TASKS, Run, train, write_tasks
from tests.unit.jobs.warm_cache import seed_workdir


def _checkpoints(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# -- seed, model ---------------------------------------------------------------------------------


def test_seed_seeds_every_rollout(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"seed": 1})

    # rollout r of step s (group 0) gets rollout_seed(seed, s, 0, r)
    assert [p["seed"] for p in run.played()] == [
        rollout_seed(1, step, 0, r) for step in (0, 1) for r in (0, 1)
    ]
    assert [p["seed"] for p in base_run.played()] == [
        rollout_seed(0, step, 0, r) for step in (0, 1) for r in (0, 1)
    ]
    assert {p["seed"] for p in run.played()}.isdisjoint(p["seed"] for p in base_run.played())


def test_model_path_is_the_policy_the_gateway_serves_and_trains(
    base_run: Run, tmp_path: Path
) -> None:
    directory = save_embedded_model(tmp_path / "my-policy")

    run = train(tmp_path / "run", {"model": {"path": str(directory)}})

    assert [p["model"] for p in run.played()] == ["my-policy"] * 4
    assert run.info()["model"] == "my-policy"
    assert [p["model"] for p in base_run.played()] == [EMBEDDED_MODEL_NAME] * 4


def test_model_dtype_is_the_dtype_the_policy_trains_in(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"model": {"dtype": "float64"}})

    trained = load_file(Path(str(run.summary.checkpoint), "model.safetensors"))
    assert {str(t.dtype) for t in trained.values()} == {"torch.float64"}
    base = load_file(Path(str(base_run.summary.checkpoint), "model.safetensors"))
    assert {str(t.dtype) for t in base.values()} == {"torch.float32"}


def test_model_warm_start_trains_from_the_warm_started_weights(
    base_run: Run, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    entry = seed_workdir(tmp_path / "work", tmp_path_factory.getbasetemp())  # fitted once

    run = train(tmp_path, {"model": {"warm_start": True}})

    warm = load_file(entry / "model.safetensors")
    trained = load_file(Path(str(run.summary.checkpoint), "model.safetensors"))
    base = load_file(Path(str(base_run.summary.checkpoint), "model.safetensors"))
    # policy.learning_rate 1e-6: two Adam steps move a weight by about 2e-6
    assert all(torch.allclose(trained[name], warm[name], atol=1e-4) for name in warm)
    assert not any(torch.allclose(base[name], warm[name], atol=1e-2) for name in warm)


# -- engine --------------------------------------------------------------------------------------


def test_engine_host_is_the_address_the_gateway_listens_on(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"engine": {"host": "127.0.0.2"}})

    assert run.info()["gateway"].startswith("http://127.0.0.2:")
    assert {p["base_url"].split(":")[1] for p in run.played()} == {"//127.0.0.2"}
    assert base_run.info()["gateway"].startswith("http://127.0.0.1:")


def test_engine_port_is_the_port_the_gateway_listens_on(tmp_path: Path) -> None:
    port = _free_port()

    run = train(tmp_path, {"engine": {"port": port}})

    assert run.info()["gateway"] == f"http://127.0.0.1:{port}/v1"
    assert {p["base_url"] for p in run.played()} == {f"http://127.0.0.1:{port}/v1/"}


def test_engine_auth_token_guards_the_gateway_and_is_handed_to_the_harness(
    base_run: Run, tmp_path: Path
) -> None:
    run = train(tmp_path, {"engine": {"auth_token": "s3cret"}})

    assert [(p["api_key"], p["unauthenticated_status"]) for p in run.played()] == [
        ("s3cret", 401)
    ] * 4
    assert [(p["api_key"], p["unauthenticated_status"]) for p in base_run.played()] == [
        ("grove", 200)
    ] * 4


def test_engine_default_max_tokens_bounds_a_call_that_names_none(
    base_run: Run, tmp_path: Path
) -> None:
    run = train(tmp_path, {"engine": {"default_max_tokens": 2}})

    assert [p["calls"][0]["completion_tokens"] for p in run.played()] == [2] * 4
    assert [p["calls"][0]["completion_tokens"] for p in base_run.played()] == [4] * 4


# -- harness -------------------------------------------------------------------------------------


def test_harness_target_is_the_function_that_plays_each_rollout(
    base_run: Run, tmp_path: Path
) -> None:
    run = train(tmp_path, harness="play_elsewhere")

    assert [p["harness"] for p in run.played()] == ["play_elsewhere"] * 4
    assert [p["harness"] for p in base_run.played()] == ["play"] * 4


def test_harness_concurrency_plays_that_many_rollouts_at_once(
    base_run: Run, tmp_path: Path
) -> None:
    # each rollout waits (up to a minute) until two run at once: only concurrency lets them meet
    run = train(tmp_path, {"harness": {"concurrency": 2, "options": {"meet": 2}}})

    # both rollouts of a step start before either ends; one at a time, each ends first
    assert [record["event"] for record in run.log()] == ["start", "start", "end", "end"] * 2
    assert [record["event"] for record in base_run.log()] == ["start", "end"] * 4


def test_harness_options_are_the_harness_keyword_arguments(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"harness": {"options": {"calls": 2}}})

    assert [p["options"]["calls"] for p in run.played()] == [2] * 4
    assert list(run.attempt("keys-s0-g0-r0").calls) == ["c0", "c1"]
    assert list(base_run.attempt("keys-s0-g0-r0").calls) == ["c0"]


# -- data ----------------------------------------------------------------------------------------


def test_data_path_is_the_task_file_the_harness_plays(base_run: Run, tmp_path: Path) -> None:
    tasks = write_tasks(tmp_path / "other.jsonl", ({"prompt": "north"}, {"prompt": "south"}))

    run = train(tmp_path, {"data": {"path": str(tasks), "shuffle": False}})

    assert run.tasks() == ["north", "north", "south", "south"]
    assert set(base_run.tasks()) <= {task["prompt"] for task in TASKS}


def test_data_shuffle_off_plays_the_tasks_in_file_order(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"data": {"shuffle": False}})

    assert run.tasks() == ["red", "red", "green", "green"]
    # shuffled with seed 0, the order of four tasks is [0, 3, 1, 2]: red, gold, ...
    assert task_order(4, shuffle=True, seed=0, epochs=1) == [0, 3, 1, 2]
    assert base_run.tasks() == ["red", "red", "gold", "gold"]


def test_data_shuffle_seed_draws_another_task_order(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"data": {"shuffle_seed": 1}})

    assert task_order(4, shuffle=True, seed=1, epochs=1) == [2, 0, 1, 3]
    assert run.tasks() == ["blue", "blue", "red", "red"]
    assert base_run.tasks() == ["red", "red", "gold", "gold"]


def test_data_epochs_play_the_task_file_again_before_the_run_stops(tmp_path: Path) -> None:
    one_task = str(write_tasks(tmp_path / "one.jsonl", ({"prompt": "red"},)))
    settings = {"data": {"path": one_task}, "grpo": {"max_num_steps": 3}}

    once = train(tmp_path / "once", settings)
    twice = train(tmp_path / "twice", settings, {"data": {"epochs": 2}})

    assert (once.summary.steps, once.tasks()) == (1, ["red"] * 2)
    assert (twice.summary.steps, twice.tasks()) == (2, ["red"] * 4)


# -- logging, steps, checkpoints ---------------------------------------------------------------


def test_logging_tensorboard_off_writes_no_event_files(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"logging": {"tensorboard": False}})

    assert not (run.run_dir / "tensorboard").exists()
    assert len(run.metrics()) == 2  # metrics.jsonl is written either way
    events = [p.name for p in (base_run.run_dir / "tensorboard").iterdir()]
    assert events and all(name.startswith("events.out.tfevents.") for name in events)


def test_max_num_steps_stops_the_run(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"grpo": {"max_num_steps": 1}})

    # four tasks would last four steps: the key stops the run first
    assert (run.summary.steps, len(run.played()), len(run.metrics())) == (1, 2, 1)
    assert (base_run.summary.steps, len(base_run.played()), len(base_run.metrics())) == (2, 4, 2)


def test_checkpoint_dir_is_where_the_run_checkpoints_go(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"checkpointing": {"checkpoint_dir": "saved"}})

    workdir = run.workspace.workdir
    assert _checkpoints(workdir / "saved" / "keys") == [
        "config.json",
        "step_00000001",
        "step_00000002",
    ]
    assert not (workdir / "checkpoints").exists()
    assert run.summary.checkpoint == str(workdir / "saved" / "keys" / "step_00000002")
    base = base_run.workspace.workdir / "checkpoints" / "keys"
    assert base_run.summary.checkpoint == str(base / "step_00000002")


def test_checkpointing_disabled_writes_no_checkpoint(base_run: Run, tmp_path: Path) -> None:
    run = train(tmp_path, {"checkpointing": {"enabled": False}})

    assert run.summary.checkpoint is None
    assert _checkpoints(run.workspace.workdir / "checkpoints" / "keys") == ["config.json"]
    assert _checkpoints(base_run.workspace.workdir / "checkpoints" / "keys") == [
        "config.json",
        "step_00000001",
        "step_00000002",
    ]


def test_save_period_checkpoints_every_nth_step(tmp_path: Path) -> None:
    run = train(tmp_path, {"checkpointing": {"save_period": 2}})

    assert _checkpoints(run.workspace.workdir / "checkpoints" / "keys") == [
        "config.json",
        "step_00000002",
    ]


# -- capture -------------------------------------------------------------------------------------


@pytest.mark.slow
def test_pending_call_timeout_masks_a_rollout_whose_call_outlives_it(tmp_path: Path) -> None:
    # rollout 0 returns while its second call (about 250 tokens) is still being generated; the
    # short timeout runs out at once, the default one waits for the call
    pending = {"harness": {"options": {"tokens": 1000}}}
    short = train(
        tmp_path / "short",
        pending,
        {"token_capture": {"pending_call_timeout_s": 0.001}},
        harness="leave_a_call_pending",
        steps=1,
    )
    patient = train(tmp_path / "patient", pending, harness="leave_a_call_pending", steps=1)

    gave_up = short.attempt("keys-s0-g0-r0")
    assert gave_up.settled is not None
    assert (gave_up.settled.timed_out, gave_up.settled.pending_call_ids) == (True, ("c1",))
    assert gave_up.finalized is not None
    assert gave_up.finalized.masked_reason == MaskReason.CAPTURE_PENDING
    waited = patient.attempt("keys-s0-g0-r0")
    assert waited.settled is not None
    assert (waited.settled.timed_out, waited.settled.pending_call_ids) == (False, ())
    assert waited.finalized is not None and waited.finalized.trainable


def test_selection_policy_chooses_the_calls_that_train(tmp_path: Path) -> None:
    # two calls, but the harness returns only the first answer
    answers = {
        "token_capture": {"forest_training": True},
        "harness": {"options": {"calls": 2, "returned": 1}},
    }
    returned = train(tmp_path / "returned", answers, steps=1)
    captured = train(
        tmp_path / "captured",
        answers,
        {"token_capture": {"selection_policy": "all_captured"}},
        steps=1,
    )

    for run, policy, calls in (
        (returned, "returned_history", ("c0",)),
        (captured, "all_captured", ("c0", "c1")),
    ):
        state = run.attempt("keys-s0-g0-r0")
        assert state.opened is not None and state.selection is not None
        assert (state.opened.selection_policy, state.selection.call_ids) == (policy, calls)


def test_forest_training_trains_a_rewritten_rollout_instead_of_masking_it(tmp_path: Path) -> None:
    # rollout 0 rewrites its context (two paths), rollout 1 does not (one path)
    off = train(tmp_path / "off", harness="rewrite_first_rollout", steps=1)
    on = train(
        tmp_path / "on",
        {"token_capture": {"forest_training": True}},
        harness="rewrite_first_rollout",
        steps=1,
    )

    masked = off.attempt("keys-s0-g0-r0").finalized
    assert masked is not None and masked.masked_reason == MaskReason.FOREST_TRAINING_DISABLED
    trained = on.attempt("keys-s0-g0-r0").finalized
    assert trained is not None and trained.paths == (("c0",), ("c1",))
    assert [m["forest/rows"] for m in off.metrics()] == [1.0]  # rollout 1's row only
    assert [m["forest/rows"] for m in on.metrics()] == [3.0]


def test_max_total_sequence_length_masks_an_over_long_rollout_and_caps_the_gateway_context(
    base_run: Run, tmp_path: Path
) -> None:
    # the gateway's context is 15 tokens: a 13-token prompt leaves room for 2
    capped = train(
        tmp_path / "capped",
        {"policy": {"max_total_sequence_length": 15}, "harness": {"options": {"max_tokens": 4}}},
        harness="probe_context",
        steps=1,
    )
    for played in capped.played():
        assert played["calls"] == [
            {
                "call_id": "c0",
                "prompt_tokens": 13,
                "completion_tokens": 2,
                "finish_reason": "length",
            }
        ]
        assert played["refusal"] == {"status": 400, "code": "prompt_too_long"}
    # the learner masks a captured rollout whose row (13 + 4 = 17 tokens) is longer
    with base_run.ledger() as (store, blobs):
        state = AttemptLog(store).load("keys-s0-g0-r0")
        reasons = []
        for limit in (16, 17):
            config = load_config({"policy": {"max_total_sequence_length": limit}})
            training = TrainingRun(store, blobs, load_model(EMBEDDED).model, config, tmp_path)
            settings = training.projector.settings
            forest, _ = finalization_forest(
                state,
                blobs,
                forest_training=settings.forest_training,
                max_row_tokens=settings.max_row_tokens,
            )
            reasons.append(forest.masked_reason)
    assert reasons == [MaskReason.ROW_TOO_LONG, None]


# -- groups and rows -----------------------------------------------------------------------------


def test_num_prompts_per_step_plays_that_many_tasks_per_step(base_run: Run, tmp_path: Path) -> None:
    run = train(
        tmp_path, {"grpo": {"num_prompts_per_step": 2}, "policy": {"train_global_batch_size": 4}}
    )

    # order [0, 3, 1, 2]: step 0 plays red and gold, step 1 green and blue, two rollouts each
    assert run.tasks() == ["red", "red", "gold", "gold", "green", "green", "blue", "blue"]
    assert [m["logical_rollouts"] for m in run.metrics()] == [4.0, 4.0]
    assert [m["logical_rollouts"] for m in base_run.metrics()] == [2.0, 2.0]


def test_num_generations_per_prompt_plays_each_task_that_many_times(
    base_run: Run, tmp_path: Path
) -> None:
    run = train(
        tmp_path,
        {"grpo": {"num_generations_per_prompt": 3}, "policy": {"train_global_batch_size": 3}},
    )

    assert run.tasks() == ["red"] * 3 + ["gold"] * 3
    assert [p["rollout_index"] for p in run.played()] == [0, 1, 2, 0, 1, 2]
    assert [m["logical_rollouts"] for m in run.metrics()] == [3.0, 3.0]
    assert [p["rollout_index"] for p in base_run.played()] == [0, 1, 0, 1]


def test_data_parallel_size_pads_each_step_to_its_execution_row_multiple(
    base_run: Run, tmp_path: Path
) -> None:
    run = train(tmp_path, {"policy": {"data_parallel_size": 2}})

    # two rows per step; the row multiple is 2 ranks x 2 rows per micro batch = 4
    assert [(m["forest/rows"], m["forest/padding_rows"]) for m in run.metrics()] == [(2.0, 2.0)] * 2
    assert [(m["forest/rows"], m["forest/padding_rows"]) for m in base_run.metrics()] == [
        (2.0, 0.0)
    ] * 2


# -- rollout failures and policy lag -------------------------------------------------------------

TWO_GROUPS_HALF_BUDGET = {
    "grpo": {"num_prompts_per_step": 2},
    "policy": {"train_global_batch_size": 4},
    "async_rl": {"rollout_failure": {"min_step_batch_fraction": 0.5}},
}
"""Two groups a step, of which one may be dropped."""


def _failing_run(directory: Path, tasks: tuple[dict, ...], **rollout_failure: object) -> Run:
    """One step of two groups (one may be dropped) of the drop harness
    (``tests/e2e/drop_harness.py``) on ``tasks`` in file order, with ``rollout_failure`` keys."""
    directory.mkdir(parents=True, exist_ok=True)
    failing = {
        "harness": {"target": "tests.e2e.drop_harness:play", "options": {"slow_s": 10.0}},
        "data": {"path": str(write_tasks(directory / "failing.jsonl", tasks)), "shuffle": False},
        "async_rl": {"rollout_failure": rollout_failure},
    }
    return train(directory, TWO_GROUPS_HALF_BUDGET, failing, steps=1)


@pytest.mark.slow
def test_rollout_timeout_s_abandons_a_rollout_whose_harness_has_not_returned_in_time(
    tmp_path: Path,
) -> None:
    # rollout 1 of the second task takes 10 s to return, the others well under 5 s
    slow = ({"prompt": "red"}, {"prompt": "gold", "slow": [1]})
    impatient = _failing_run(tmp_path / "impatient", slow, rollout_timeout_s=5.0)
    patient = _failing_run(tmp_path / "patient", slow, rollout_timeout_s=60.0)

    (cut,) = impatient.metrics()
    assert (cut["logical_rollouts"], cut["dropped_prompt_groups/rollout_timeout"]) == (2.0, 1.0)
    abandoned = impatient.attempt("keys-s0-g1-r1").selection
    assert abandoned is not None and abandoned.policy == "abandoned:rollout_timeout"
    (waited,) = patient.metrics()
    assert (waited["logical_rollouts"], waited["dropped_prompt_groups"]) == (4.0, 0.0)


def test_max_replacement_groups_replaces_a_dropped_group_before_the_step_trains(
    tmp_path: Path,
) -> None:
    # the second task's rollout 1 raises; replacement 0 of step 0 plays task 2 (blue)
    tasks = ({"prompt": "red"}, {"prompt": "gold", "raise": [1]}, {"prompt": "blue"}, TASKS[1])
    assert replacement_task(len(tasks), seed=0, step=0, index=0) == 2
    shrunk = _failing_run(tmp_path / "none", tasks, max_replacement_groups=0)
    replaced = _failing_run(tmp_path / "one", tasks, max_replacement_groups=1)

    (small,) = shrunk.metrics()
    assert (small["logical_rollouts"], small["replacement_groups"]) == (2.0, 0.0)
    (full,) = replaced.metrics()
    assert (full["logical_rollouts"], full["replacement_groups"]) == (4.0, 1.0)
    assert full["dropped_prompt_groups/harness_failed"] == 1.0
    opened = replaced.attempt("keys-s0-g2-r0").opened  # group 2: the step's first replacement
    assert opened is not None and opened.prompt_group == "keys-s0-g2"


@pytest.mark.slow
def test_max_policy_lag_drops_a_group_whose_calls_span_more_policy_versions(
    tmp_path: Path,
) -> None:
    # an external run: g0's rollout 0 is sampled before step 0 trains, rollout 1 after
    def second_step(directory: Path, lag: int) -> dict[str, float]:
        with ExternalRun(directory, {"async_rl": {"max_policy_lag": lag}}, steps=2) as run:
            run.rollout("g0", 0)
            run.rollout("g1", 0)
            run.rollout("g1", 1)
            run.wait_for_steps(1)
            run.rollout("g0", 1)
            if not lag:
                run.rollout("g2", 0)  # g0 is dropped: the step waits for another group
                run.rollout("g2", 1)
            run.finish()
        return run.metrics()[1]

    strict = second_step(tmp_path / "strict", 0)
    lenient = second_step(tmp_path / "lenient", 1)

    # versions 0 and 1 are 1 apart: more than a lag of 0, within a lag of 1
    assert strict["dropped_prompt_groups/policy_lag_exceeded"] == 1.0
    assert lenient["dropped_prompt_groups"] == 0.0
    assert strict["logical_rollouts"] == lenient["logical_rollouts"] == 2.0
