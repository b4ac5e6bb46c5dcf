"""Tamper: contradictory events never train.

- Contradictory events: through the lifecycle API (``AttemptLog``, what the gateway uses) each is
  refused and writes nothing; appended straight to the store (``EventStore.append``, which
  checks payloads but not lifecycle rules) each masks its rollout and nothing else.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from capture.lifecycle import CaptureService
from ledger.attempt import AttemptError, AttemptLog, fold_attempt
from ledger.errors import EventIdConflict, LedgerError
from ledger.events import (
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)
from ledger.store import EventStore
from training.projector import FinalizedRollout, Projector, ProjectorSettings, PublishedBatch

from .figures import FiguresFile
from .rollouts import Played, play

SEED = 20261129
GROUPS = 6


def fresh_projector(capture: CaptureService) -> Projector:
    """A projector that knows nothing yet (as after a restart): groups of 2, one per step."""
    settings = ProjectorSettings(rollouts_per_group=2, groups_per_step=1)
    return Projector(capture.log.store, capture.blobs, settings)


def caught_up(projector: Projector, store: EventStore, timeout_s: float = 30.0) -> Projector:
    """``projector`` after it has read the whole ledger (on PostgreSQL a transaction elsewhere
    on the server can hold the gap-free reader back for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        projector.poll()
        if projector.events_read == store.count() or time.monotonic() > deadline:
            return projector
        time.sleep(0.05)


def publish_all(projector: Projector) -> list[PublishedBatch]:
    """Every batch the projector can publish now, step by step."""
    batches = []
    while (batch := projector.batch_for_step(len(batches))) is not None:
        batches.append(batch)
    return batches


def trained_rollouts(batches: list[PublishedBatch]) -> dict[str, FinalizedRollout]:
    """The rollouts whose rows are in the batches, by rollout id."""
    return {r.rollout_id: r for b in batches for r in b.rollouts if r.rollout.rows}


# -- contradictory events --------------------------------------------------------------------


@dataclass(frozen=True)
class Contradiction:
    """An event that contradicts an attempt's history, made from the attempt's state (and its
    sibling's): the lifecycle API refuses it (``refused``, ``match``); appended to the store it
    masks the rollout (``masked``). ``after_decision``: made once the projector decided."""

    name: str
    make: Callable[[AttemptLog, str, str], Event]
    refused: type[LedgerError]
    match: str
    masked: str
    selected_first: bool = True
    after_decision: bool = False


def _committed(log: AttemptLog, key: str, call_id: str = "t1") -> CallCommitted:
    committed = log.load(key).calls[call_id].committed
    assert committed is not None
    return committed


CONTRADICTIONS = [
    Contradiction(
        "second commit naming another blob",
        lambda log, key, sibling: _committed(log, key).model_copy(
            update={
                name: getattr(_committed(log, sibling), name)
                for name in ("blob_key", "blob_sha256", "blob_bytes", "chain_digest")
            }
        ),
        EventIdConflict,
        "already recorded with a different payload",
        "ledger_contradiction",
    ),
    Contradiction(
        "commit of a call never intended",
        lambda log, key, sibling: _committed(log, key).model_copy(update={"call_id": "t9"}),
        AttemptError,
        "commit of a call that was never intended",
        "ledger_contradiction",
    ),
    Contradiction(
        "failure of a call never intended",
        lambda log, key, sibling: CallFailed(call_id="t9", reason="engine_error"),
        AttemptError,
        "failure of a call that was never intended",
        "ledger_contradiction",
    ),
    Contradiction(
        "second intent of a committed call",
        lambda log, key, sibling: (
            log.load(key).calls["t1"].intended.model_copy(update={"prompt_tokens": 1})
        ),
        EventIdConflict,
        "already recorded with a different payload",
        "ledger_contradiction",
    ),
    Contradiction(
        "selection naming unknown calls",
        lambda log, key, sibling: RolloutSelected(
            policy="returned_history", call_ids=("t0", "t1", "t7"), reward=1.0
        ),
        AttemptError,
        r"selection names unknown calls \['t7'\]",
        "selected_call_missing",
        selected_first=False,
    ),
    Contradiction(
        "second selection of other calls",
        lambda log, key, sibling: log.load(key).selection.model_copy(update={"call_ids": ("t0",)}),
        EventIdConflict,
        "already recorded with a different payload",
        "ledger_contradiction",
    ),
    Contradiction(
        "second finalization with another decision",
        lambda log, key, sibling: RolloutFinalized(
            rollout_id=log.load(key).opened.rollout_id, trainable=True, paths=(("t1",),)
        ),
        EventIdConflict,
        "already recorded with a different payload",
        "ledger_contradiction",
        after_decision=True,
    ),
]

RECORDERS: dict[type[Event], Callable[[AttemptLog], Callable[[str, Event], object]]] = {
    CallIntended: lambda log: log.intend,
    CallCommitted: lambda log: log.commit,
    CallFailed: lambda log: log.fail,
    RolloutSelected: lambda log: log.select,
    RolloutFinalized: lambda log: log.finalize,
}
"""The lifecycle API's method that records each kind of event."""


def setup_case(capture: CaptureService, case: Contradiction) -> tuple[Played, Played]:
    victim = play(capture, "victim", group="g0", index=0, turns=2, select=case.selected_first)
    sibling = play(capture, "sibling", group="g0", index=1, turns=2)
    if not case.selected_first:
        capture.settle(victim.capture_key, timeout_s=0.0)
    if case.after_decision:
        caught_up(fresh_projector(capture), capture.log.store)
    return victim, sibling


@pytest.mark.parametrize("case", CONTRADICTIONS, ids=lambda c: c.name.replace(" ", "-"))
def test_a_contradictory_event_is_refused_by_the_lifecycle_and_writes_nothing(
    capture: CaptureService, case: Contradiction, figures: FiguresFile
):
    victim, sibling = setup_case(capture, case)
    log, store = capture.log, capture.log.store
    event = case.make(log, victim.capture_key, sibling.capture_key)
    before = store.count()
    with pytest.raises(case.refused, match=case.match):
        RECORDERS[type(event)](log)(victim.capture_key, event)
    assert store.count() == before
    assert log.load(victim.capture_key).contradictions == ()
    figures.record(f"tamper/refused/{case.name}", {"appends_refused": 1, "events_written": 0})


@pytest.mark.parametrize("case", CONTRADICTIONS, ids=lambda c: c.name.replace(" ", "-"))
def test_a_contradictory_event_appended_to_the_store_masks_only_its_rollout(
    capture: CaptureService, case: Contradiction, figures: FiguresFile
):
    victim, sibling = setup_case(capture, case)
    store = capture.log.store
    event = case.make(capture.log, victim.capture_key, sibling.capture_key)
    store.append(victim.capture_key, [event])  # payload checked, lifecycle rules not
    batches = publish_all(caught_up(fresh_projector(capture), store))

    (batch,) = batches
    decided = {r.rollout_id: r.forest for r in batch.rollouts}
    assert str(decided[victim.rollout_id].masked_reason) == case.masked
    assert decided[sibling.rollout_id].trainable
    assert set(trained_rollouts(batches)) == {sibling.rollout_id}
    figures.record(
        f"tamper/appended/{case.name}", {"contradictions_masked": 1, "tampered_rows_trained": 0}
    )


def test_the_fold_leaves_out_a_commit_of_a_call_never_intended_and_names_it(
    capture: CaptureService,
):
    play(capture, "victim", group="g0", index=0, turns=2)
    events = [stored.decode() for stored in capture.log.store.read_stream("victim")]
    ghost = next(e for e in events if isinstance(e, CallCommitted)).model_copy(
        update={"call_id": "t9"}
    )
    state = fold_attempt("victim", [*events, ghost])
    assert list(state.calls) == ["t0", "t1"]
    assert state.contradictions == ("call.committed of call t9: the call was never intended",)
    assert state.version == len(events) + 1
