"""The projector: finalization of selected rollouts and exactly-once publication of batches."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from grove.capture.lifecycle import ModelCall
from grove.ledger.events import CallFailed, CallIntended, RolloutSelected
from grove.storage import BlobRef
from grove.training.projector import Projector, finalization_event, finalization_forest
from grove.training.rows import ROUTE_MISSING_SENTINEL, rollout_rows

from .conftest import HAND_SUMMARY, OPTIONS, SAMPLING, Lab


def play_groups(lab: Lab, groups: int, rollouts: int = 2) -> None:
    for g in range(groups):
        for r in range(rollouts):
            lab.play(f"g{g}-r{r}", group=f"g{g}", index=r, reward=float(r))


def finalized(lab: Lab, capture_key: str):
    return lab.capture.log.load(capture_key).finalized


def test_a_compacted_rollout_is_finalized_with_two_rows(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, compact_after=1, turns=3)
    lab.project()
    decision = finalized(lab, "att-1")
    assert decision.trainable
    assert decision.paths == (("c0",), ("c1", "c2"))
    assert decision.owned == (("c0",), ("c1", "c2"))


def test_a_complete_group_is_published_as_one_step(lab: Lab):
    play_groups(lab, 1)
    projector = lab.project()
    published = projector.batch_for_step(0)
    assert published is not None and not published.rebuilt
    assert [r.rollout_id for r in published.rollouts] == ["g0/r0", "g0/r1"]
    assert published.batch.num_rollouts == 2
    assert published.batch.num_rows == 4  # two rows per rollout (one rewrite each)
    event = lab.store.read_stream("training")[0].decode()
    assert (event.step, event.rollout_ids) == (0, ("g0/r0", "g0/r1"))
    assert event.row_ids == ("g0/r0/0", "g0/r0/1", "g0/r1/0", "g0/r1/1")


def test_an_incomplete_group_is_not_published(lab: Lab):
    lab.play("g0-r0", group="g0", index=0, reward=0.0)
    projector = lab.project()
    assert projector.batch_for_step(0) is None
    assert lab.store.read_stream("training") == []


def test_a_published_step_is_rebuilt_exactly_by_a_fresh_projector(lab: Lab):
    play_groups(lab, 2)
    first = lab.project()
    original = first.batch_for_step(0)
    restarted = lab.project()  # as after a crash: everything comes from the ledger
    again = restarted.batch_for_step(0)
    assert again.rebuilt
    assert [r.rollout_id for r in again.rollouts] == [r.rollout_id for r in original.rollouts]
    assert torch.equal(again.batch.input_ids, original.batch.input_ids)
    assert torch.equal(again.batch.loss_mask, original.batch.loss_mask)
    nxt = restarted.batch_for_step(1)
    assert {r.group_id for r in nxt.rollouts} == {"g1"}


def test_each_rollout_is_published_in_one_step_only(lab: Lab):
    play_groups(lab, 3)
    projector = lab.project()
    steps = [projector.batch_for_step(step) for step in range(3)]
    assert projector.batch_for_step(3) is None
    published = [r for step in steps for r in step.rollouts]
    assert len({r.rollout_id for r in published}) == len(published) == 6


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_racing_projectors_publish_each_step_once(lab: Lab):
    play_groups(lab, 2)
    projectors = [lab.project(), lab.project()]
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda p: p.batch_for_step(0), projectors))
    assert [r.rollouts[0].rollout_id for r in results] == ["g0/r0", "g0/r0"]
    assert sorted(r.rebuilt for r in results) == [False, True]
    assert len(lab.store.read_stream("training")) == 1


def test_a_corrupted_blob_masks_its_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0)
    committed = lab.capture.log.load("att-1").calls["c1"].committed
    path = lab.capture.blobs.path(committed.blob_key)
    data = bytearray(lab.capture.blobs.fs.cat(path))
    data[-1] ^= 0xFF
    lab.capture.blobs.fs.rm(path)
    lab.capture.blobs.fs.pipe(path, bytes(data))
    with pytest.raises(Exception, match=r"sha256|integrity|digest"):
        lab.capture.blobs.get(
            BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        )
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.masked_reason) == (False, "blob_invalid")


def test_a_pending_call_masks_its_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, settle=False)
    lab.capture.log.intend(
        "att-1",
        lab.capture.log.load("att-1").calls["c2"].intended.model_copy(update={"call_id": "c9"}),
    )
    lab.finish("att-1", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.masked_reason) == (False, "capture_pending")


def test_a_failure_on_a_selected_call_masks_its_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, settle=False)
    lab.capture.log.fail("att-1", CallFailed(call_id="c2", reason="storage_error"))
    lab.finish("att-1", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.masked_reason) == (False, "selected_call_failed")


def test_a_rejected_and_resampled_response_does_not_mask_the_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, compact_after=None, turns=1, settle=False)
    request = [{"role": "user", "content": "Task g0."}]
    rejected = lab.capture.generate("att-1", ModelCall(request, OPTIONS, SAMPLING, "c1"))
    lab.capture.fail("att-1", "c1", "rejected_by_harness")
    retry = lab.capture.generate("att-1", ModelCall(request, OPTIONS, SAMPLING, "c2"))
    assert rejected.decision.parent_call_id == retry.decision.parent_call_id
    lab.finish("att-1", {"model_calls": ["c2"], "reward": 1.0})
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.paths) == (True, (("c2",),))


def test_a_group_whose_rollouts_are_all_masked_is_dropped_and_never_published(lab: Lab):
    for index in range(2):
        key = f"g0-r{index}"
        lab.play(key, group="g0", index=index, reward=float(index), settle=False)
        lab.capture.log.fail(key, CallFailed(call_id="c2", reason="storage_error"))
        lab.finish(key, {"model_calls": ["c0", "c1", "c2"], "reward": float(index)})
    lab.play("g1-r0", group="g1", index=0, reward=0.0)
    lab.play("g1-r1", group="g1", index=1, reward=1.0)
    projector = lab.project()
    assert projector.dropped_groups == ("g0",)
    published = projector.batch_for_step(0)
    assert {r.group_id for r in published.rollouts} == {"g1"}
    assert projector.batch_for_step(1) is None


def test_masked_rollouts_still_count_in_their_group(lab: Lab):
    lab.play("g0-r0", group="g0", index=0, reward=1.0, settle=False)
    lab.capture.log.fail("g0-r0", CallFailed(call_id="c2", reason="storage_error"))
    lab.finish("g0-r0", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.play("g0-r1", group="g0", index=1, reward=0.0)
    projector: Projector = lab.project()
    published = projector.batch_for_step(0)
    assert published.batch.num_rollouts == 2
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 2]


def row_lengths(lab: Lab, capture_key: str) -> list[int]:
    """The token count of each row the attempt's forest has with no limit."""
    forest, _ = finalization_forest(lab.capture.log.load(capture_key), lab.capture.blobs)
    return [len(row.token_ids) for row in forest.rows]


def test_a_row_longer_than_max_row_tokens_masks_its_rollout_and_its_sibling_trains(lab: Lab):
    lab.play("g0-r0", group="g0", index=0, reward=1.0, compact_after=None, turns=3)
    lab.play("g0-r1", group="g0", index=1, reward=0.0, compact_after=None, turns=1)
    (long,), (short,) = row_lengths(lab, "g0-r0"), row_lengths(lab, "g0-r1")
    assert short < long  # one turn against three, in one context each
    projector = lab.project(lab.projector(max_row_tokens=long - 1))  # long = N + 1
    masked, kept = finalized(lab, "g0-r0"), finalized(lab, "g0-r1")
    assert (masked.trainable, masked.masked_reason, masked.paths) == (False, "row_too_long", ())
    assert (kept.trainable, kept.masked_reason) == (True, None)
    published = projector.batch_for_step(0)
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 1]
    assert published.rollouts[0].outcome.masked_reason == "row_too_long"


def test_a_row_of_exactly_max_row_tokens_trains(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, compact_after=None, turns=3)
    (length,) = row_lengths(lab, "att-1")
    state, blobs = lab.capture.log.load("att-1"), lab.capture.blobs
    exact, _ = finalization_forest(state, blobs, max_row_tokens=length)
    over, _ = finalization_forest(state, blobs, max_row_tokens=length - 1)
    assert (exact.trainable, over.masked_reason) == (True, "row_too_long")
    lab.project(lab.projector(max_row_tokens=length))
    assert finalized(lab, "att-1").trainable


def test_without_forest_training_a_rewritten_rollout_is_masked_and_a_single_path_one_trains(
    lab: Lab,
):
    lab.play("g0-r0", group="g0", index=0, reward=1.0, compact_after=1, turns=3)  # two paths
    lab.play("g0-r1", group="g0", index=1, reward=0.0, compact_after=None, turns=3)  # one path
    projector = lab.project(lab.projector(forest_training=False))
    rewritten, plain = finalized(lab, "g0-r0"), finalized(lab, "g0-r1")
    assert (rewritten.trainable, rewritten.masked_reason) == (False, "forest_training_disabled")
    assert (plain.trainable, plain.paths) == (True, (("c0", "c1", "c2"),))
    published = projector.batch_for_step(0)
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 1]


def test_the_setting_masks_are_decided_again_from_the_same_inputs(lab: Lab):
    lab.play("g0-r0", group="g0", index=0, reward=1.0, compact_after=1, turns=3)
    lab.play("g0-r1", group="g0", index=1, reward=0.0, compact_after=None, turns=3)
    settings = {"forest_training": False, "max_row_tokens": 10_000}
    first = lab.project(lab.projector(**settings)).batch_for_step(0)
    for key in ("g0-r0", "g0-r1"):
        state = lab.capture.log.load(key)
        forest, _ = finalization_forest(state, lab.capture.blobs, **settings)
        assert finalization_event(state.opened.rollout_id, forest, **settings) == state.finalized
        assert (state.finalized.forest_training, state.finalized.max_row_tokens) == (False, 10_000)
    again = lab.project(lab.projector(**settings)).batch_for_step(0)  # as after a restart
    assert again.rebuilt
    assert torch.equal(again.batch.input_ids, first.batch.input_ids)
    assert [r.forest.masked_reason for r in again.rollouts] == ["forest_training_disabled", None]


def decided_again(lab: Lab, capture_key: str) -> None:
    """Today's code reaches the recorded decision from the same events and blobs (replay)."""
    state = lab.capture.log.load(capture_key)
    forest, _ = finalization_forest(state, lab.capture.blobs)
    assert finalization_event(state.opened.rollout_id, forest) == state.finalized


def intend_another(lab: Lab, capture_key: str, call_id: str) -> None:
    """Record the intent of one more call, a copy of the intent of ``c2``."""
    intended = lab.capture.log.load(capture_key).calls["c2"].intended
    lab.capture.log.intend(capture_key, intended.model_copy(update={"call_id": call_id}))


def test_a_failed_call_outside_the_selection_masks_the_whole_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, settle=False)
    intend_another(lab, "att-1", "c9")
    lab.capture.log.fail("att-1", CallFailed(call_id="c9", reason="engine_error"))
    lab.finish("att-1", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.masked_reason, decision.paths) == (
        False,
        "capture_failed",
        (),
    )
    decided_again(lab, "att-1")


def test_the_cancellation_of_a_committed_call_outside_the_selection_does_not_mask(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, settle=False)
    request = [{"role": "user", "content": "Task g0."}]
    lab.capture.generate("att-1", ModelCall(request, OPTIONS, SAMPLING, "c3"))
    lab.capture.fail("att-1", "c3", "request_finished_without_staged_coordinates")
    lab.finish("att-1", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.paths) == (True, (("c0",), ("c1", "c2")))
    decided_again(lab, "att-1")


def test_the_cancellation_of_a_call_that_never_committed_masks_the_rollout(lab: Lab):
    lab.play("att-1", group="g0", index=0, reward=1.0, settle=False)
    intend_another(lab, "att-1", "c9")
    lab.capture.fail("att-1", "c9", "request_finished_without_staged_coordinates")
    lab.finish("att-1", {"model_calls": ["c0", "c1", "c2"], "reward": 1.0})
    lab.project()
    assert finalized(lab, "att-1").masked_reason == "capture_failed"
    decided_again(lab, "att-1")


def test_all_captured_trains_a_rejected_resample_as_an_abandoned_retry(lab: Lab):
    lab.capture.open_attempt(
        "att-1",
        rollout_id="g0/r0",
        prompt_group="g0",
        rollout_index=0,
        selection_policy="all_captured",
    )
    request = [{"role": "user", "content": "Task g0."}]
    for call_id in ("c0", "c1"):
        lab.capture.generate("att-1", ModelCall(request, OPTIONS, SAMPLING, call_id))
    lab.capture.fail("att-1", "c0", "rejected_by_harness")
    lab.finish("att-1", {"model_calls": ["c1"], "reward": 1.0}, policy="all_captured")
    assert lab.capture.log.load("att-1").selection.call_ids == ("c0", "c1")
    lab.project()
    decision = finalized(lab, "att-1")
    assert (decision.trainable, decision.paths) == (True, (("c0",), ("c1",)))
    decided_again(lab, "att-1")


def routes(rows: int, base: int) -> torch.Tensor:
    """``(rows, 2)`` routed experts ``base + i`` and ``base + i + 1`` for delta token ``i``."""
    return torch.tensor([[base + i, base + i + 1] for i in range(rows)], dtype=torch.int32)


def open_by_hand(lab: Lab, capture_key: str, group: str, index: int) -> None:
    lab.capture.open_attempt(
        capture_key, rollout_id=f"{group}/r{index}", prompt_group=group, rollout_index=index
    )


def test_routes_that_do_not_fit_a_row_mask_the_rollout_instead_of_escaping_the_projector(
    lab: Lab,
):
    open_by_hand(lab, "g0-r0", "g0", 0)
    lab.hand_call("g0-r0", "c0", None, [1, 2, 3], [4, 5], routes=routes(5, 10))
    lab.hand_call("g0-r0", "c1", "c0", [6], [7, 8])  # no routes: its row cannot be replayed
    lab.finish("g0-r0", {"model_calls": ["c0", "c1"], "reward": 1.0})
    lab.play("g0-r1", group="g0", index=1, reward=0.0)
    projector = lab.project()  # the RowError is a decision, not an exception
    decision = finalized(lab, "g0-r0")
    assert (decision.trainable, decision.masked_reason) == (False, "blob_invalid")
    published = projector.batch_for_step(0)
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 2]
    assert published.rollouts[0].outcome.masked_reason == "blob_invalid"
    decided_again(lab, "g0-r0")


def test_routes_from_the_blobs_carry_the_missing_route_sentinel_only_at_the_paths_end(lab: Lab):
    open_by_hand(lab, "g0-r0", "g0", 0)
    lab.hand_call("g0-r0", "c0", None, [1, 2], [3], routes=routes(3, 10))
    lab.hand_call("g0-r0", "c1", "c0", [4], [5, 6], routes=routes(3, 20))
    lab.finish("g0-r0", {"model_calls": ["c0", "c1"], "reward": 1.0})
    forest, extras = finalization_forest(lab.capture.log.load("g0-r0"), lab.capture.blobs)
    (row,) = rollout_rows(forest, extras)
    s = ROUTE_MISSING_SENTINEL
    # c0's final generated token (3) keeps its stored route: c1's prefill ran it
    assert row.routes.tolist() == [[10, 11], [11, 12], [12, 13], [20, 21], [21, 22], [s, s]]


def test_a_rollout_whose_rows_own_no_generated_token_is_masked_no_trainable_tokens(lab: Lab):
    open_by_hand(lab, "g0-r0", "g0", 0)
    lab.hand_call("g0-r0", "c0", None, [1, 2, 3], [])
    lab.finish("g0-r0", {"model_calls": ["c0"], "reward": 1.0})
    lab.play("g0-r1", group="g0", index=1, reward=0.0)
    projector = lab.project()
    decision = finalized(lab, "g0-r0")
    assert (decision.trainable, decision.masked_reason) == (False, "no_trainable_tokens")
    published = projector.batch_for_step(0)
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 2]
    decided_again(lab, "g0-r0")


def test_a_first_call_failure_recorded_with_an_empty_selection_masks_the_rollout(lab: Lab):
    # the harness has no accepted response to return: the attempt is selected with no call
    open_by_hand(lab, "g0-r0", "g0", 0)
    intended = CallIntended(
        call_id="c0", decision="root", replay_summary=HAND_SUMMARY, prompt_tokens=3
    )
    lab.capture.log.intend("g0-r0", intended)
    lab.capture.log.fail("g0-r0", CallFailed(call_id="c0", reason="engine_error"))
    lab.capture.settle("g0-r0", timeout_s=0.2)
    lab.capture.select("g0-r0", RolloutSelected(policy="returned_history", call_ids=(), reward=0.0))
    lab.play("g0-r1", group="g0", index=1, reward=1.0)
    projector = lab.project()
    decision = finalized(lab, "g0-r0")
    assert (decision.trainable, decision.masked_reason) == (False, "capture_failed")
    published = projector.batch_for_step(0)
    assert [len(r.rollout.rows) for r in published.rollouts] == [0, 2]
    decided_again(lab, "g0-r0")
