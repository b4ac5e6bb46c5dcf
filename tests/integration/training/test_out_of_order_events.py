"""Nothing appended stops training: an out-of-order event is a recorded contradiction that masks
its rollout, never an error of the projector."""

from __future__ import annotations

from sqlalchemy import text

from grove.ledger.events import RolloutFinalized, RolloutSelected

from .conftest import Lab


def stray_finalization(rollout_id: str) -> RolloutFinalized:
    return RolloutFinalized(rollout_id=rollout_id, trainable=True, paths=(("c0",),))


def contradictions(lab: Lab) -> list[tuple]:
    query = "SELECT capture_key, contradiction FROM grove_contradictions ORDER BY position"
    with lab.store.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(query))]


def test_a_finalization_of_an_attempt_never_opened_is_recorded_and_the_group_trains(lab: Lab):
    lab.store.append("ghost", [stray_finalization("ghost/r0")])
    for index in range(2):
        lab.play(f"g0-r{index}", group="g0", index=index, reward=float(index))
    published = lab.project().batch_for_step(0)
    assert published is not None
    assert [r.rollout_id for r in published.rollouts] == ["g0/r0", "g0/r1"]
    assert contradictions(lab) == [("ghost", "rollout.finalized: the attempt was never opened")]


def test_a_finalization_before_the_selection_masks_the_rollout(lab: Lab):
    calls = lab.play("g0-r0", group="g0", index=0, reward=1.0, settle=False)
    lab.store.append("g0-r0", [stray_finalization("g0/r0")])
    lab.capture.settle("g0-r0", timeout_s=0.2)
    selected = RolloutSelected(policy="returned_history", call_ids=tuple(calls), reward=1.0)
    lab.capture.select("g0-r0", selected)
    lab.project()
    assert lab.capture.log.load("g0-r0").finalized.masked_reason == "ledger_contradiction"
    assert contradictions(lab) == [("g0-r0", "rollout.finalized: the rollout was never selected")]
