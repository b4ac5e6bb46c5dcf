"""The projector's group rules: a dropped group is never published, is counted once in the step
published after it completed (rebuilt steps too), and a group within the policy lag trains on the
logprobs its calls were sampled with."""

from __future__ import annotations

import pytest
import torch

from grove.storage import BlobRef
from grove.training.errors import BatchError

from .conftest import Lab


def play(lab: Lab, group: str, index: int, version: int) -> None:
    """One rollout of one call, sampled by policy version ``version``."""
    lab.capture.engine.policy_version = version
    lab.play(f"{group}-r{index}", group=group, index=index, reward=float(index), compact_after=None,
             turns=1)  # fmt: skip


def play_group(lab: Lab, group: str, *versions: int) -> None:
    for index, version in enumerate(versions):
        play(lab, group, index, version)


def test_a_group_whose_calls_span_more_than_the_policy_lag_is_dropped(lab: Lab):
    play_group(lab, "g0", 0, 1)  # sampled before and after an optimizer step
    play_group(lab, "g1", 1, 1)
    strict = lab.project(lab.projector(max_policy_lag=0)).batch_for_step(0)
    lenient = lab.project(lab.projector(max_policy_lag=1, training_stream="other"))

    assert strict is not None
    assert {r.group_id for r in strict.rollouts} == {"g1"}
    assert [(d.group_id, d.reason) for d in strict.dropped] == [("g0", "policy_lag_exceeded")]
    published = lenient.batch_for_step(0)
    assert published is not None and {r.group_id for r in published.rollouts} == {"g0"}


def test_a_waiting_group_is_dropped_at_the_step_it_falls_behind_by_more_than_the_lag(lab: Lab):
    play_group(lab, "g0", 0, 0)
    play_group(lab, "g1", 0, 0)
    projector = lab.project(lab.projector(max_policy_lag=0))
    first = projector.batch_for_step(0)
    assert first is not None and first.dropped == ()  # g1 waits, kept at step 0
    assert projector.batch_for_step(1) is None  # at step 1, g1 is one version behind
    play_group(lab, "g2", 1, 1)
    second = lab.project(projector).batch_for_step(1)

    assert second is not None and {r.group_id for r in second.rollouts} == {"g2"}
    assert [(d.group_id, d.reason) for d in second.dropped] == [("g1", "policy_lag_exceeded")]


def test_each_dropped_group_is_counted_once_and_again_when_its_step_is_rebuilt(lab: Lab):
    play_group(lab, "g0", 0, 1)
    play_group(lab, "g1", 1, 1)
    play_group(lab, "g2", 1, 1)
    projector = lab.project(lab.projector(max_policy_lag=0))
    steps = [projector.batch_for_step(0), projector.batch_for_step(1)]
    rebuilt = lab.project(lab.projector(max_policy_lag=0))  # as after a restart
    again = [rebuilt.batch_for_step(1), rebuilt.batch_for_step(0)]

    assert [[d.group_id for d in s.dropped] for s in steps if s] == [["g0"], []]
    assert [[d.group_id for d in s.dropped] for s in again if s] == [[], ["g0"]]
    assert all(s is not None and s.rebuilt for s in again)


def test_a_step_publishes_only_named_groups_that_are_complete_and_kept(lab: Lab):
    play_group(lab, "g0", 0, 1)
    play_group(lab, "g1", 0, 0)
    projector = lab.project(lab.projector(groups_per_step=2, max_policy_lag=0))

    with pytest.raises(BatchError, match=r"of which \['g0'\] are not"):
        projector.batch_for_step(0, groups=["g0", "g1"])
    published = projector.batch_for_step(0, groups=["g1"])
    assert published is not None and {r.group_id for r in published.rollouts} == {"g1"}
    assert [d.group_id for d in published.dropped] == ["g0"]


def test_a_group_within_the_lag_trains_each_call_on_the_logprobs_it_was_sampled_with(lab: Lab):
    play_group(lab, "g0", 0, 1)
    published = lab.project(lab.projector(max_policy_lag=1)).batch_for_step(0)
    assert published is not None
    batch = published.batch

    for owner, rollout in enumerate(published.rollouts):
        committed = lab.capture.log.load(rollout.capture_key).calls["c0"].committed
        assert committed.policy_version == owner  # r0 by version 0, r1 by version 1
        ref = BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        sampled = lab.capture.blobs.get_delta(ref).logprobs
        (row,) = (batch.parent_indices == owner).nonzero().flatten().tolist()
        owned = batch.loss_mask[row].bool()
        assert torch.equal(batch.generation_logprobs[row][owned], sampled.to(torch.float32))
