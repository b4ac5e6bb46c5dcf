"""Cleanup and forks through the gateway: a fork holds its source chain's blobs while it may train.

The source ``src`` plays ``c1`` then ``c2`` (``test_forks._source``) and its harness selects only
``c2``, whose parent is not selected: the projector masks it (``selection_not_closed``) and drops
its group at step 0, which trains another attempt; so its cleanup removes every blob no fork
holds. ``fork-1`` forks ``c1``, a call of that masked
rollout that was never selected (docs/fork.md, "Cleanup"; docs/storage.md, "Cleanup"). A real
projector finalizes and publishes each step, and ``clean_step`` (what ``grove train`` runs after a
step) or ``collect_garbage`` (``grove gc``) cleans.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from grove.capture.gateway import CALL_ID_HEADER
from grove.training.cleanup import clean_step, collect_garbage
from grove.training.projector import Projector, ProjectorSettings, PublishedBatch

from .conftest import Gateway
from .test_completions import USER, ask, observe, reply
from .test_forks import _fork, _source

BOTH_ENDS = pytest.mark.parametrize(
    ("database_url", "blob_url"), [("sqlite", "local"), ("postgresql", "s3")], indirect=True
)


def _projector(gateway: Gateway) -> Projector:
    service = gateway.service
    return Projector(
        service.log.store,
        service.blobs,
        ProjectorSettings(rollouts_per_group=1, groups_per_step=1),
    )


def _step(projector: Projector, step: int) -> PublishedBatch:
    """Step ``step`` of ``projector``, once it read every event committed so far: the second
    poll reads back the finalizations the first recorded (on PostgreSQL a reader sees an event
    only once every transaction older than it ended, ``wait_for_horizon``)."""
    for _ in range(2):
        assert projector.store.wait_for_horizon()
        projector.poll()
    published = projector.batch_for_step(step)
    assert published is not None
    return published


def _plain(gateway: Gateway, capture_key: str) -> None:
    """An attempt alone in its prompt group that plays one call and selects it: trainable."""
    gateway.open(capture_key, prompt_group=f"g-{capture_key}")
    _, headers = ask(gateway.client(capture_key), [USER])
    answer = gateway.http.post(
        f"/v1/attempts/{capture_key}/result",
        json={"reward": 1.0, "model_calls": [headers["x-grove-call-id"]]},
    )
    assert answer.status_code == 200, answer.text


def _masked_source_step(gateway: Gateway, projector: Projector, c2: str) -> PublishedBatch:
    """The source's harness selects only ``c2``, whose parent ``c1`` is not: the projector masks
    it, and its group (``src`` alone) is dropped at step 0, which publishes ``plain-0``."""
    answer = gateway.http.post("/v1/attempts/src/result", json={"reward": 0.0, "model_calls": [c2]})
    assert answer.status_code == 200, answer.text
    _plain(gateway, "plain-0")
    return _step(projector, 0)


@dataclass(frozen=True)
class _Forked:
    """The source played (``history`` up to ``c1``'s answer; calls ``c1``, ``c2``), ``fork-1``
    opened from ``c1``, and the source masked at step 0 (``source_step``) of ``projector``."""

    history: list[dict[str, Any]]
    c1: str
    c2: str
    projector: Projector
    source_step: PublishedBatch


def _forked_masked_source(gateway: Gateway) -> _Forked:
    history, c1, c2 = _source(gateway)
    assert _fork(gateway, "fork-1", "src", c1).status_code == 200
    projector = _projector(gateway)
    return _Forked(history, c1, c2, projector, _masked_source_step(gateway, projector, c2))


def _blob(gateway: Gateway, capture_key: str, call_id: str) -> str:
    committed = gateway.state(capture_key).calls[call_id].committed
    assert committed is not None
    return committed.blob_key


def _staged(gateway: Gateway, capture_key: str) -> list[str]:
    return gateway.service.blobs.list_keys(f"staging/{capture_key}/")


def _play_fork(
    gateway: Gateway, history: list[dict[str, Any]], *, select_closed: bool = True
) -> None:
    """``fork-1`` plays ``f1`` (continuing ``c1``) and ``f2`` (continuing ``f1``), then returns;
    its harness selects both, or only ``f2`` (masked: ``f1`` is not selected)."""
    client = gateway.client("fork-1")
    asked = [*history, observe("apples=4")]
    first, _ = ask(client, asked, extra_headers={CALL_ID_HEADER: "f1"})
    asked = [*asked, reply(first), observe("pears=2")]
    second, _ = ask(client, asked, extra_headers={CALL_ID_HEADER: "f2"})
    calls = ["f1", "f2"] if select_closed else ["f2"]
    answer = gateway.http.post(
        "/v1/attempts/fork-1/result",
        json={"reward": 1.0, "model_calls": calls, "terminal_response_id": second.id},
    )
    assert answer.status_code == 200, answer.text


@BOTH_ENDS
def test_a_fork_of_a_masked_rollouts_call_trains_its_rows_after_the_source_was_cleaned(
    gateway: Gateway,
):
    forked = _forked_masked_source(gateway)
    (source,) = forked.source_step.dropped_rollouts
    assert source.forest.masked_reason == "selection_not_closed"
    store, blobs = gateway.service.log.store, gateway.service.blobs

    report = clean_step(store, blobs, forked.source_step, window_s=0)

    c1_blob, c2_blob = _blob(gateway, "src", forked.c1), _blob(gateway, "src", forked.c2)
    assert (report.removed, report.held) == ([c2_blob], 1)
    assert _staged(gateway, "src") == [c1_blob]
    assert gateway.state("src").cleaned_keys == (c2_blob,)
    _play_fork(gateway, forked.history)
    (fork,) = _step(forked.projector, 1).rollouts
    assert fork.forest.masked_reason is None
    (row,) = fork.rollout.rows
    assert row.call_ids == (f"src/{forked.c1}", "f1", "f2")
    assert row.owned_call_ids == ("f1", "f2")


@BOTH_ENDS
def test_the_source_chain_goes_at_the_cleanup_after_its_fork_is_final(gateway: Gateway):
    forked = _forked_masked_source(gateway)
    store, blobs = gateway.service.log.store, gateway.service.blobs
    clean_step(store, blobs, forked.source_step, window_s=0)
    _play_fork(gateway, forked.history, select_closed=False)
    _plain(gateway, "plain-1")
    fork_step = _step(forked.projector, 1)
    (fork,) = fork_step.dropped_rollouts
    assert fork.forest.masked_reason == "selection_not_closed"

    report = clean_step(store, blobs, fork_step, window_s=0)

    c1_blob, c2_blob = _blob(gateway, "src", forked.c1), _blob(gateway, "src", forked.c2)
    assert c1_blob in report.removed and report.held == 0
    assert (_staged(gateway, "src"), _staged(gateway, "fork-1")) == ([], [])
    assert gateway.state("src").cleaned_keys == (c2_blob, c1_blob)


def test_grove_gc_holds_a_live_forks_chain_and_removes_it_once_the_fork_is_final(
    local_gateway: Gateway,
):
    gateway = local_gateway
    forked = _forked_masked_source(gateway)
    store, blobs = gateway.service.log.store, gateway.service.blobs

    held = collect_garbage(store, blobs, window_s=0)
    _play_fork(gateway, forked.history, select_closed=False)
    _plain(gateway, "plain-1")
    _step(forked.projector, 1)
    freed = collect_garbage(store, blobs, window_s=0)

    assert (held.removed, held.held) == ([_blob(gateway, "src", forked.c2)], 1)
    assert held.as_dict()["held_for_forks"] == 1
    assert _blob(gateway, "src", forked.c1) in freed.removed and freed.held == 0
    assert blobs.list_keys("staging/src/") == blobs.list_keys("staging/fork-1/") == []


def test_a_published_fork_keeps_its_source_chain_so_its_step_rebuilds_alike(
    local_gateway: Gateway,
):
    gateway = local_gateway
    forked = _forked_masked_source(gateway)
    store, blobs = gateway.service.log.store, gateway.service.blobs
    clean_step(store, blobs, forked.source_step, window_s=0)
    _play_fork(gateway, forked.history)
    published = _step(forked.projector, 1)

    report = clean_step(store, blobs, published, window_s=0)
    rebuilt = _step(_projector(gateway), 1)  # a restarted trainer rebuilds the published step

    assert (report.removed, report.kept, report.held) == ([], 2, 1)
    assert _staged(gateway, "src") == [_blob(gateway, "src", forked.c1)]
    assert rebuilt.rebuilt and rebuilt.rollouts[0].forest.masked_reason is None
    assert rebuilt.batch.input_ids.tolist() == published.batch.input_ids.tolist()


def test_a_fork_of_a_call_whose_blob_cleanup_removed_is_refused_and_writes_nothing(
    local_gateway: Gateway,
):
    gateway = local_gateway
    _, c1, c2 = _source(gateway)
    store, blobs = gateway.service.log.store, gateway.service.blobs
    clean_step(store, blobs, _masked_source_step(gateway, _projector(gateway), c2), window_s=0)
    before = gateway.written()

    answer = _fork(gateway, "fork-1", "src", c1)

    assert answer.status_code == 409, answer.text
    error = answer.json()["error"]
    assert error["code"] == "attempt_rule"
    assert (
        "cleanup removed 1 of them from attempt 'src' (first: call 'c1') after its rollout was "
        "final, so call 'c1' of attempt 'src' can no longer be forked" in error["message"]
    )
    assert gateway.written() == before
