"""Routed experts from capture to the learner, on both databases: the embedded MoE engine stores
each call's routes with its delta, the projector places them in rows (compaction included), the
learner replays them, and a route missing inside a row masks the rollout ``route_missing``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from grove.capture.embedded import EmbeddedEngine
from grove.capture.embedded_moe import build_moe_model
from grove.capture.lifecycle import CaptureService
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.training.loss import token_diagnostics
from grove.training.route_replay import replayed_row_logprobs
from grove.training.rows import ROUTE_MISSING_SENTINEL
from grove.training.trainer import StepBatch, row_logprobs

from .conftest import Lab, tokenizer

S = ROUTE_MISSING_SENTINEL


@pytest.fixture
def moe_lab(database_url: str, tmp_path) -> Iterator[Lab]:
    """The training lab with the embedded MoE engine (experts 0 and 1 one float32 ulp apart, so
    rounding decides between them) sampling in float32."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    blob_url = str(tmp_path / "blobs")
    model = build_moe_model(tokenizer(), seed=0, near_tie=1e-7)
    engine = EmbeddedEngine(model, stop_token_ids=[tokenizer().eos_token_id], seed=3)
    capture = CaptureService(
        AttemptLog(store),
        open_blob_store(blob_url),
        Renderer(tokenizer()),
        engine,
        model_fingerprint="grove-tiny",  # the name Lab.play sends
    )
    try:
        yield Lab(store, capture, blob_url)
    finally:
        store.close()


def _step(lab: Lab) -> tuple[StepBatch, torch.nn.Module]:
    """The projector's first step as the trainer's input, and the engine's (the policy) model."""
    projector = lab.project(lab.projector(rollouts_per_group=2))
    published = projector.batch_for_step(0)
    assert published is not None
    batch = published.batch
    step = StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=torch.zeros(batch.num_rows),
        owners=batch.parent_indices,
        logical_rollouts=batch.num_rollouts,
        routes=batch.routes,
    )
    return step, lab.capture.engine.model


def _max_tmpe(trainer_logprobs: torch.Tensor, batch: StepBatch) -> float:
    return token_diagnostics(
        trainer_logprobs.detach(),
        batch.generation_logprobs,
        batch.loss_mask,
        batch.owners,
        logical_rollouts=batch.logical_rollouts,
    ).max_token_mult_prob_error


def test_captured_routes_reach_the_rows_and_replay_reproduces_the_engines_logprobs(
    moe_lab: Lab,
):
    for index in range(2):  # each: three calls, compacted after the first (two rows)
        moe_lab.play(f"g0-r{index}", group="g0", index=index, reward=float(index), turns=3)
    batch, model = _step(moe_lab)

    assert batch.routes is not None and tuple(batch.routes.shape[2:]) == (2, 2)
    missing = (batch.routes == S).flatten(2).any(-1)  # (R, T)
    for row in range(batch.token_ids.shape[0]):  # row multiple 1: every row is real
        end = int(batch.loss_mask[row].nonzero().max()) + 1  # after the row's final token
        assert not bool(missing[row, : end - 1].any()), f"row {row} lacks a route inside"
        assert bool(missing[row, end - 1])  # the trace boundary
    with torch.no_grad():
        replayed = _max_tmpe(replayed_row_logprobs(model, batch, slice(None)), batch)
        routed_anew = _max_tmpe(row_logprobs(model, batch, slice(None)), batch)
    assert replayed < 1.001
    assert routed_anew > 1.001


def test_a_route_missing_inside_a_row_masks_the_rollout_route_missing(lab: Lab):
    lab.capture.open_attempt("g0-r0", rollout_id="g0/r0", prompt_group="g0", rollout_index=0)
    parent_routes = torch.tensor([[[1, 2]], [[2, 3]], [[S, S]]], dtype=torch.int16)  # c0's last
    lab.hand_call("g0-r0", "c0", None, [1, 2], [3], routes=parent_routes)
    lab.hand_call("g0-r0", "c1", "c0", [4], [5, 6], routes=torch.ones(3, 1, 2, dtype=torch.int16))
    lab.finish("g0-r0", {"model_calls": ["c0", "c1"], "reward": 1.0})
    lab.play("g0-r1", group="g0", index=1, reward=0.0)
    projector = lab.project()

    decision = lab.capture.log.load("g0-r0").finalized
    assert (decision.trainable, decision.masked_reason) == (False, "route_missing")
    published = projector.batch_for_step(0)
    assert published.rollouts[0].outcome.masked_reason == "route_missing"
