"""The cleanup rule with forks, pure: a fork holds its source chain's blobs while it may train.

The source ``src`` is a masked rollout of two calls, ``c1`` then ``c2``; its partition holds both
blobs. ``fork-1`` forks ``c1`` (its chain: ``src/c1``) and plays ``f1``, continuing ``c1``;
``fork-2`` forks ``f1`` (its chain: ``src/c1``, then ``fork-1/f1``) and plays ``g1``. Without a
fork, every blob of a masked rollout goes once it is finalized (``test_cleanup_rule.py``).
"""

from __future__ import annotations

from grove.ledger.attempt import AttemptState, fold_attempt
from grove.ledger.events import (
    AttemptSettled,
    Event,
    ForkSource,
    RolloutFinalized,
    RolloutSelected,
    SourceCall,
)
from grove.training.cleanup import CleanupPlan, fork_held_keys, plan_cleanup
from tests.integration.ledger.scenario import SUMMARY, committed, intended, opened

SRC_C1, SRC_C2 = "staging/src/c1", "staging/src/c2"
FORK1_F1, FORK2_G1 = "staging/fork-1/f1", "staging/fork-2/g1"
NOTHING: frozenset[str] = frozenset()


def _call(capture_key: str, call_id: str, parent: str | None, source: str | None) -> list[Event]:
    """A committed call of ``capture_key``: a root, or a continuation of ``parent`` (of attempt
    ``source`` when that is another one)."""
    return [
        intended(call_id, parent=parent, source=source),
        committed(capture_key, call_id, parent=parent, source=source, prev=8 if parent else 0),
    ]


def _source_call(capture_key: str, call_id: str) -> SourceCall:
    """Call ``call_id`` of ``capture_key`` as a fork's chain records it (from its commit)."""
    recorded = committed(capture_key, call_id).model_dump(include=set(SourceCall.model_fields))
    return SourceCall(capture_key=capture_key, **recorded)


def _attempt(
    capture_key: str,
    calls: list[Event],
    selected: tuple[str, ...],
    *,
    trainable: bool | None,
    fork_from: ForkSource | None = None,
) -> AttemptState:
    """An attempt with ``calls``, settled and selecting ``selected``; ``trainable``: finalized
    trainable (True), masked (False) or not yet finalized (None)."""
    events: list[Event] = [
        opened(capture_key, rollout_id=f"r-{capture_key}", fork_from=fork_from),
        *calls,
        AttemptSettled(pending_call_ids=(), timed_out=False),
        RolloutSelected(
            policy="returned_history",
            call_ids=selected,
            terminal_response_id=f"resp-{selected[-1]}",
            reward=1.0,
        ),
    ]
    if trainable is not None:
        events.append(
            RolloutFinalized(
                rollout_id=f"r-{capture_key}",
                trainable=trainable,
                masked_reason=None if trainable else "capture_pending",
                paths=(selected,) if trainable else (),
            )
        )
    return fold_attempt(capture_key, events)


def _fork(
    capture_key: str, chain: tuple[SourceCall, ...], own: str, *, trainable: bool | None
) -> AttemptState:
    """A fork of the last call of ``chain`` that plays ``own``, continuing it."""
    source = chain[-1]
    fork_from = ForkSource(
        source_capture_key=source.capture_key,
        source_call_id=source.call_id,
        source_chain_digest=source.chain_digest,
        source_cum_len=6,
        source_replay_summary=SUMMARY,
        chain=chain,
    )
    calls = _call(capture_key, own, source.call_id, source.capture_key)
    return _attempt(capture_key, calls, (own,), trainable=trainable, fork_from=fork_from)


SOURCE_CALLS = [*_call("src", "c1", None, None), *_call("src", "c2", "c1", None)]
SOURCE = _attempt("src", SOURCE_CALLS, ("c1", "c2"), trainable=False)
FORK1_CHAIN = (_source_call("src", "c1"),)
FORK2_CHAIN = (*FORK1_CHAIN, _source_call("fork-1", "f1"))


def _plan_source(held: frozenset[str]) -> CleanupPlan:
    return plan_cleanup(
        SOURCE, [SRC_C1, SRC_C2], published=False, settled_for_s=1.0, window_s=300.0, held=held
    )


def test_a_fork_not_yet_finalized_holds_its_source_chain():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=None)
    assert fork_held_keys([fork], published=NOTHING, dropped=NOTHING) == {SRC_C1}


def test_a_masked_sources_blob_a_live_fork_holds_is_kept_and_the_rest_removed():
    held = fork_held_keys(
        [_fork("fork-1", FORK1_CHAIN, "f1", trainable=None)], published=NOTHING, dropped=NOTHING
    )
    plan = _plan_source(held)
    assert (plan.final, plan.remove, plan.held, plan.keep) == ("masked", (SRC_C2,), (SRC_C1,), ())


def test_a_trainable_fork_not_yet_published_still_holds_its_chain():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=True)
    assert fork_held_keys([fork], published=NOTHING, dropped=NOTHING) == {SRC_C1}


def test_a_masked_fork_holds_nothing_so_the_next_cleanup_removes_the_source_chain():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=False)
    held = fork_held_keys([fork], published=NOTHING, dropped=NOTHING)
    assert held == NOTHING
    plan = _plan_source(held)
    assert (plan.remove, plan.held) == ((SRC_C1, SRC_C2), ())


def test_a_fork_in_a_dropped_group_holds_nothing():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=True)
    assert fork_held_keys([fork], published=NOTHING, dropped={"r-fork-1"}) == NOTHING


def test_a_published_fork_whose_rows_carry_the_chain_keeps_holding_it_for_rebuilds():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=True)
    assert fork_held_keys([fork], published={"r-fork-1"}, dropped=NOTHING) == {SRC_C1}


def test_a_published_fork_whose_selected_calls_are_new_roots_holds_nothing():
    fork = _fork("fork-1", FORK1_CHAIN, "f1", trainable=True)
    calls = _call("fork-1", "h1", None, None)
    fork_from = fork.recorded_opening().fork_from
    rooted = _attempt("fork-1", calls, ("h1",), trainable=True, fork_from=fork_from)
    assert fork_held_keys([rooted], published={"r-fork-1"}, dropped=NOTHING) == NOTHING


def test_a_fork_of_a_fork_holds_both_sources_chain_blobs():
    fork_2 = _fork("fork-2", FORK2_CHAIN, "g1", trainable=None)
    fork_1 = _fork("fork-1", FORK1_CHAIN, "f1", trainable=False)  # final: holds nothing itself
    held = fork_held_keys([fork_1, fork_2], published=NOTHING, dropped=NOTHING)
    assert held == {SRC_C1, FORK1_F1}
    fork_1_plan = plan_cleanup(
        fork_1, [FORK1_F1], published=False, settled_for_s=1.0, window_s=300.0, held=held
    )
    assert (fork_1_plan.remove, fork_1_plan.held) == ((), (FORK1_F1,))
    assert _plan_source(held).held == (SRC_C1,)


def test_an_attempt_that_forks_nothing_holds_nothing():
    assert fork_held_keys([SOURCE], published=NOTHING, dropped=NOTHING) == NOTHING


def test_held_keys_of_another_partition_change_nothing():
    assert _plan_source(frozenset({FORK2_G1})) == _plan_source(NOTHING)


def test_a_source_not_yet_final_loses_nothing_whatever_forks_hold():
    live = _attempt("src", _call("src", "c1", None, None), ("c1",), trainable=None)
    plan = plan_cleanup(
        live, [SRC_C1], published=False, settled_for_s=1.0, window_s=300.0, held={SRC_C1}
    )
    assert (plan.final, plan.remove, plan.held) == (None, (), ())
