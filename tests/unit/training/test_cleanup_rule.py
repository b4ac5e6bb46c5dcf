"""The staging cleanup rule, pure: which of an attempt's stored blobs may go now, and which wait.

Every attempt below is the same small capture (``_attempt``): ``c1`` and ``c2`` committed,
``c2`` rejected by the harness; ``c3`` still pending when the attempt settled (its writer may
still write); ``c4`` failed before committing. The harness selected ``c1``. Its partition holds a
blob for each call and one, ``zz``, that no event names.
"""

from __future__ import annotations

import pytest

from grove.ledger.attempt import AttemptState, fold_attempt
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptCleaned,
    AttemptOpened,
    AttemptSettled,
    CallCommitted,
    CallFailed,
    CallIntended,
    ReplaySummary,
    RolloutFinalized,
    RolloutSelected,
)
from grove.training.cleanup import CleanupPlan, plan_cleanup

KEY = "run-s0-g0-r0"
SUMMARY = ReplaySummary(
    normalization_version=1,
    item_count=1,
    source_digest="0" * 64,
    canonical_source_digest="0" * 64,
    render_options_digest="1" * 64,
)
STORED = [f"staging/{KEY}/{name}" for name in ("c1", "c2", "c3", "c4", "zz")]
C1, C2, C3, C4, ZZ = STORED


def _intended(call_id: str) -> CallIntended:
    return CallIntended(
        call_id=call_id,
        decision="root",
        root_reason="initial",
        replay_summary=SUMMARY,
        prompt_tokens=4,
    )


def _committed(call_id: str) -> CallCommitted:
    return CallCommitted(
        call_id=call_id,
        prev_len=0,
        delta_len=6,
        cum_len=6,
        prompt_delta_len=4,
        generated_len=2,
        blob_key=f"staging/{KEY}/{call_id}",
        blob_sha256="a" * 64,
        blob_bytes=90,
        chain_digest="b" * 64,
        finish_reason="stop",
        response_id=f"resp-{call_id}",
        output_fingerprint="c" * 64,
        replay_summary=SUMMARY,
    )


def _attempt(
    *,
    settled: bool = True,
    finalized: bool | None = True,
    late_c3: bool = False,
    waiting: bool = True,
) -> AttemptState:
    """The capture above; ``finalized``: trainable (True), masked (False) or not yet (None);
    without ``waiting``, ``c3`` and ``c4`` are never intended."""
    events = [
        AttemptOpened(
            capture_key=KEY,
            rollout_id="run-s0-g0-r0",
            prompt_group="run-s0-g0",
            rollout_index=0,
            policy_version=0,
            model_fingerprint="m",
            template_fingerprint="t",
        ),
        _intended("c1"),
        _committed("c1"),
        _intended("c2"),
        _committed("c2"),
        CallFailed(call_id="c2", reason="rejected_by_harness"),
    ]
    if waiting:
        events += [
            _intended("c3"),
            _intended("c4"),
            CallFailed(call_id="c4", reason="storage_error"),
        ]
    events.append(AdmissionsClosed())
    if settled:
        events.append(
            AttemptSettled(pending_call_ids=("c3",) if waiting else (), timed_out=waiting)
        )
        if late_c3:
            events.append(_committed("c3"))
        events.append(
            RolloutSelected(
                policy="returned_history",
                call_ids=("c1",),
                terminal_response_id="resp-c1",
                reward=1.0,
            )
        )
        if finalized is not None:
            events.append(
                RolloutFinalized(
                    rollout_id="run-s0-g0-r0",
                    trainable=finalized,
                    masked_reason=None if finalized else "capture_pending",
                    paths=(("c1",),) if finalized else (),
                )
            )
    return fold_attempt(KEY, events)


def _plan(
    state: AttemptState,
    *,
    published: bool = True,
    dropped: bool = False,
    settled_for_s: float | None = 1.0,
) -> CleanupPlan:
    return plan_cleanup(
        state,
        STORED,
        published=published,
        dropped=dropped,
        settled_for_s=settled_for_s,
        window_s=300.0,
    )


def test_a_published_rollout_keeps_its_selected_blob_and_loses_unselected_ones_and_orphans():
    plan = _plan(_attempt())

    assert (plan.final, plan.keep, plan.remove, plan.orphans) == (
        "published",
        (C1,),
        (C2, ZZ),
        (ZZ,),
    )


def test_blobs_of_pending_and_failed_before_commit_calls_wait_for_teardown():
    plan = _plan(_attempt(), settled_for_s=299.0)

    assert (plan.waiting, plan.teardown) == ((C3, C4), False)
    assert not {C3, C4} & set(plan.remove)


def test_teardown_after_the_settle_window_removes_waiting_blobs_but_never_selected_ones():
    plan = _plan(_attempt(), settled_for_s=300.0)

    assert (plan.teardown, plan.waiting, plan.keep) == (True, (), (C1,))
    assert plan.remove == (C2, C3, C4, ZZ)


def test_a_masked_rollout_loses_every_committed_blob_selected_ones_included():
    plan = _plan(_attempt(finalized=False), published=False)

    assert (plan.final, plan.keep, plan.remove, plan.waiting) == (
        "masked",
        (),
        (C1, C2, ZZ),
        (C3, C4),
    )


def test_a_trainable_rollout_of_a_dropped_group_loses_every_committed_blob_selected_ones_included():
    plan = _plan(_attempt(), published=False, dropped=True)

    assert (plan.final, plan.keep, plan.remove, plan.waiting) == (
        "dropped",
        (),
        (C1, C2, ZZ),
        (C3, C4),
    )


def test_a_trainable_rollout_not_yet_published_keeps_every_named_blob():
    plan = _plan(_attempt(), published=False)

    assert (plan.final, plan.remove, plan.keep, plan.waiting) == (None, (ZZ,), (), (C3, C4))


@pytest.mark.parametrize(
    ("settled", "finalized"), [(False, None), (True, None)], ids=["open", "not-finalized"]
)
def test_an_attempt_not_yet_final_loses_only_orphans_whatever_its_age(settled, finalized):
    plan = _plan(
        _attempt(settled=settled, finalized=finalized), settled_for_s=10_000.0 if settled else None
    )

    assert (plan.final, plan.remove, plan.teardown) == (None, (ZZ,), False)


def test_a_commit_recorded_after_settling_is_named_and_goes_at_once():
    plan = _plan(_attempt(late_c3=True))

    assert C3 in plan.remove and C3 not in plan.waiting
    assert plan.waiting == (C4,)


def test_a_final_attempt_without_waiting_calls_is_torn_down_at_once():
    plan = _plan(_attempt(finalized=False, waiting=False), published=False, settled_for_s=0.0)

    assert (plan.teardown, plan.remove) == (True, (C1, C2, C3, C4, ZZ))  # c3, c4: orphans now


def test_only_stored_keys_are_planned():
    plan = plan_cleanup(_attempt(), [C1], published=True, settled_for_s=1_000.0, window_s=300.0)

    assert (plan.keep, plan.remove, plan.waiting) == ((C1,), (), ())


def test_keys_already_cleaned_and_gone_are_not_planned_again():
    state = fold_attempt(KEY, [AttemptCleaned(keys=(C2, ZZ))], _attempt())

    assert _plan(state).remove == (C2, ZZ)  # still listed: deleted again, idempotently
    gone = plan_cleanup(state, [C1], published=True, settled_for_s=1.0, window_s=300.0)
    assert gone.remove == ()
