"""Staging stays bounded: 20 steps of ``grove train`` keep exactly the selected calls' blobs.

The run is the main job's own function (``run_training``) on the embedded model: one prompt group
of two rollouts a step, the recency agent rejecting its first answer and keeping the resample
(``reject_fraction: 1``, one retry), so every rollout leaves an unselected blob behind.
After each step the staging blobs are counted (``clean_step`` is wrapped, so the count is taken
right after the step's cleanup): they are always exactly the selected blobs of the published,
trainable rollouts, and nothing else. Afterwards every kept blob still verifies, a fresh projector
rebuilds every published step from them (what a restarted trainer does), and ``grove replay
--verify`` and ``grove show`` still rebuild a cleaned attempt's rows.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import grove.train.job
from grove.config import load_config
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.event_replay import CheckOutcome
from grove.ledger.store import EventStore
from grove.storage import BlobRef, open_blob_store
from grove.tools.replay import replay
from grove.tools.show import write_attempt_page
from grove.train.job import run_training
from grove.training.cleanup import CleanupReport, clean_step
from grove.training.projector import Projector, ProjectorSettings
from grove.workspace import Workspace

pytestmark = pytest.mark.slow

STEPS = 20
RUN_ID = "bounded"


def _configuration(directory: Path) -> dict:
    tasks = directory / "tasks.jsonl"
    tasks.write_text('{"prompt": "Say hello."}\n{"prompt": "Name a color."}\n')
    return {
        "seed": 5,
        "model": {"path": "embedded"},
        "harness": {
            "target": "examples.recency_agent:play",
            "options": {
                "turns": 1,
                "keep_rounds": 1,
                "max_tokens": 3,
                "reject_fraction": 1.0,
                "max_response_retries": 1,
            },
        },
        "data": {"path": str(tasks), "epochs": STEPS},
        "token_capture": {"forest_training": True, "pending_call_timeout_s": 30},
        "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": 2},
        "policy": {
            "train_global_batch_size": 2,
            "train_micro_batch_size": 2,
            "logprob_micro_batch_size": 2,
        },
        "checkpointing": {"save_period": STEPS},
    }


def _selected_keys(state: AttemptState) -> set[str]:
    assert state.selection is not None
    return {state.calls[c].committed.blob_key for c in state.selection.call_ids}


def _committed_keys(state: AttemptState) -> set[str]:
    return {c.committed.blob_key for c in state.calls.values() if c.committed is not None}


@pytest.fixture(scope="module")
def bounded_run(tmp_path_factory: pytest.TempPathFactory):
    """The run, with the staging keys listed after each step's cleanup."""
    directory = tmp_path_factory.mktemp("bounded")
    workspace = Workspace.resolve(directory / "work")
    after_step: list[set[str]] = []
    blobs = open_blob_store(workspace.blob_url)

    def counted(*args, **kwargs) -> CleanupReport:
        report = clean_step(*args, **kwargs)
        after_step.append(set(blobs.list_keys("staging/")))
        return report

    patch = pytest.MonkeyPatch()
    patch.setattr(grove.train.job, "clean_step", counted)
    try:
        summary = run_training(
            load_config(_configuration(directory)), workspace, steps=STEPS, run_id=RUN_ID
        )
    finally:
        patch.undo()
    store = EventStore.open(workspace.database_url)
    log = AttemptLog(store)
    keys = [f"{RUN_ID}-s{s}-g0-r{r}" for s in range(STEPS) for r in range(2)]
    states = {key: log.load(key) for key in keys}
    yield summary, workspace, store, states, after_step
    store.close()


def test_after_every_step_staging_holds_exactly_the_selected_blobs_of_trained_rollouts(
    bounded_run,
):
    summary, _, _, states, after_step = bounded_run
    assert summary.steps == len(after_step) == STEPS

    for step, stored in enumerate(after_step):
        attempts = [states[f"{RUN_ID}-s{s}-g0-r{r}"] for s in range(step + 1) for r in range(2)]
        kept = set().union(*(_selected_keys(a) for a in attempts if a.finalized.trainable))
        assert stored == kept, f"step {step}"

    unselected = sum(len(_committed_keys(a) - _selected_keys(a)) for a in states.values())
    selected = sum(len(_selected_keys(a)) for a in states.values())
    # Each answer is rejected once: as many unselected blobs as selected ones were written (40
    # of each), and none is left; what remains grows by the 2 selected blobs of each step.
    assert unselected == selected == 2 * STEPS
    assert [len(s) for s in after_step] == [2 * (step + 1) for step in range(STEPS)]


def test_every_cleaned_attempt_records_exactly_its_unselected_blobs(bounded_run):
    _, _, _, states, _ = bounded_run

    for key, state in states.items():
        assert set(state.cleaned_keys) == _committed_keys(state) - _selected_keys(state), key


def test_every_kept_blob_verifies_and_a_fresh_projector_rebuilds_every_published_step(
    bounded_run,
):
    _, workspace, store, states, _ = bounded_run
    blobs = open_blob_store(workspace.blob_url)
    for state in states.values():
        for call_id in state.selection.call_ids:
            committed = state.calls[call_id].committed
            blobs.get_delta(
                BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
            )

    projector = Projector(
        store,
        blobs,
        ProjectorSettings(
            rollouts_per_group=2,
            groups_per_step=1,
            training_stream=f"training-{RUN_ID}",
            capture_prefix=f"{RUN_ID}-",
            max_row_tokens=load_config({}).policy.max_total_sequence_length,
        ),
    )
    projector.poll()
    for step in range(STEPS):
        published = projector.batch_for_step(step)
        assert published is not None and published.rebuilt
        for rollout in published.rollouts:
            recorded = states[rollout.capture_key].finalized
            assert rollout.forest.trainable == recorded.trainable, rollout.capture_key
            assert len(rollout.rollout.rows) == len(recorded.paths), rollout.capture_key


def test_replay_verify_and_show_rebuild_the_rows_of_a_cleaned_attempt(bounded_run, tmp_path):
    _, workspace, store, states, _ = bounded_run
    key = f"{RUN_ID}-s{STEPS - 1}-g0-r0"
    assert states[key].cleaned_keys
    blobs = open_blob_store(workspace.blob_url)

    result = replay(store, key, blobs=blobs)
    page = write_attempt_page(store, blobs, key, tmp_path / "attempt.html")

    finalization = [c for c in result.checks if c.decision == "finalization"]
    assert [c.outcome for c in finalization] == [CheckOutcome.SAME]
    assert result.differences == 0
    # The rejected call is drawn from the ledger; the rows come from the kept blobs.
    assert (page.calls, page.rows) == (2, len(states[key].finalized.paths))
