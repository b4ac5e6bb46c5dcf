"""Tamper: corrupted or deleted blobs and contradictory events never train.

- Blobs: bytes flipped, blobs deleted, truncated or swapped for another call's blob, before the
  projector's decision or after it (a restarted projector re-reads every blob): each tampered
  rollout is masked ``blob_invalid`` and no published batch holds a row of it.
- Contradictory events: through the lifecycle API (``AttemptLog``, what the gateway uses) each is
  refused and writes nothing; appended straight to the store (``EventStore.append``, which
  checks payloads but not lifecycle rules) each masks its rollout and nothing else.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from grove.capture.lifecycle import CaptureService
from grove.ledger.attempt import AttemptError, AttemptLog, fold_attempt
from grove.ledger.errors import EventIdConflict, LedgerError
from grove.ledger.events import (
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)
from grove.ledger.store import EventStore
from grove.training.projector import FinalizedRollout, Projector, ProjectorSettings, PublishedBatch

from .conftest import capture_service
from .figures import FiguresFile
from .rollouts import Played, play, record_result

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


# -- blobs -----------------------------------------------------------------------------------


def flip(data: bytes, rng: random.Random) -> bytes:
    position = rng.randrange(len(data))
    return (
        data[:position] + bytes([data[position] ^ (1 << rng.randrange(8))]) + data[position + 1 :]
    )


TAMPERINGS: dict[str, Callable[[bytes, bytes, random.Random], bytes | None]] = {
    "flipped": lambda data, other, rng: flip(data, rng),
    "deleted": lambda data, other, rng: None,
    "truncated": lambda data, other, rng: data[: rng.randrange(len(data))],
    "swapped": lambda data, other, rng: other,
}
"""How a blob is tampered with: its new bytes (None: deleted), from its bytes, another call's
blob and the seeded generator."""


def tamper(capture: CaptureService, victim: Played, how: str, other: Played, rng: random.Random):
    """Tamper with one selected call's blob of ``victim``, behind the blob store's back."""
    state = capture.log.load(victim.capture_key)
    call_id = rng.choice(victim.call_ids)
    committed = state.calls[call_id].committed
    donor = capture.log.load(other.capture_key).calls[call_id].committed
    fs, path = capture.blobs.fs, capture.blobs.path(committed.blob_key)
    data = fs.cat_file(path)
    tampered = TAMPERINGS[how](data, fs.cat_file(capture.blobs.path(donor.blob_key)), rng)
    fs.rm(path)
    if tampered is not None:
        fs.pipe_file(path, tampered)


@pytest.mark.parametrize(
    ("database_url", "blob_url"), [("sqlite", "local"), ("postgresql", "s3")], indirect=True
)
def test_tampered_blobs_mask_their_rollouts_and_never_train(
    database_url: str, blob_url: str, figures: FiguresFile
):
    capture = capture_service(database_url, blob_url)
    store = capture.log.store
    rng = random.Random(SEED)
    played = [
        play(capture, f"g{g}-r{r}", group=f"g{g}", index=r) for g in range(GROUPS) for r in range(2)
    ]
    victims = rng.sample(played, 8)
    hows = [list(TAMPERINGS)[i % len(TAMPERINGS)] for i in range(len(victims))]
    early, late = victims[:4], victims[4:]
    for victim, how in zip(early, hows[:4], strict=True):
        tamper(capture, victim, how, rng.choice([p for p in played if p is not victim]), rng)
    first = caught_up(fresh_projector(capture), store)  # decides every rollout
    decisions = {p.rollout_id: capture.log.load(p.capture_key).finalized for p in played}
    for victim, how in zip(late, hows[4:], strict=True):
        tamper(capture, victim, how, rng.choice([p for p in played if p is not victim]), rng)
    batches = publish_all(caught_up(fresh_projector(capture), store))  # re-reads every blob

    assert first.events_read > 0
    assert {r for r, d in decisions.items() if not d.trainable} == {v.rollout_id for v in early}
    assert {decisions[v.rollout_id].masked_reason for v in early} == {"blob_invalid"}
    healthy_groups = {p.group for p in played if p not in victims}  # others are dropped
    assert [b.rollouts[0].group_id for b in batches] == sorted(healthy_groups)
    published = {r.rollout_id: r for b in batches for r in b.rollouts}
    published_victims = [v for v in victims if v.rollout_id in published]
    assert {r for r, f in published.items() if not f.forest.trainable} == {
        v.rollout_id for v in published_victims
    }
    assert {str(published[v.rollout_id].forest.masked_reason) for v in published_victims} == {
        "blob_invalid"
    }
    trained = trained_rollouts(batches)
    assert set(trained).isdisjoint(v.rollout_id for v in victims)
    assert len(trained) == len(played) - len(victims)
    row_ids = {row for e in store.read_stream("training") for row in e.payload["row_ids"]}
    assert not any(row.startswith(v.rollout_id + "/") for v in victims for row in row_ids)
    figures.record(
        f"tamper/blobs/{database_url.split(':')[0].split('+')[0]}-{capture.blobs.backend}",
        {
            "rollouts": len(played),
            **{f"blobs_{how}": hows.count(how) for how in TAMPERINGS},
            "tampered_before_decision": len(early),
            "tampered_after_decision": len(late),
            "masked_blob_invalid": len(victims),
            "groups_dropped": GROUPS - len(healthy_groups),
            "tampered_rows_trained": 0,
        },
    )
    store.close()


def test_a_group_whose_rollouts_are_all_masked_is_dropped_and_the_next_group_trains(
    capture: CaptureService,
):
    rng = random.Random(SEED)
    masked = [play(capture, f"g0-r{r}", group="g0", index=r, turns=2) for r in range(2)]
    healthy = [play(capture, f"g1-r{r}", group="g1", index=r, turns=2) for r in range(2)]
    for victim in masked:
        tamper(capture, victim, "deleted", healthy[0], rng)
    projector = caught_up(fresh_projector(capture), capture.log.store)
    batches = publish_all(projector)
    assert [[r.rollout_id for r in b.rollouts] for b in batches] == [["g1-r0", "g1-r1"]]
    assert projector.batch_for_step(1) is None


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
    result_after: bool = False
    """The fold leaves the appended event out (a selection naming calls never intended), so the
    attempt still takes its harness's result, recorded after it; the contradiction masks it."""


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
        "ledger_contradiction",
        selected_first=False,
        result_after=True,
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
    if case.result_after:
        assert capture.log.load(victim.capture_key).selection is None
        record_result(capture, victim.capture_key, victim.result)
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
