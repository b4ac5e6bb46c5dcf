"""Router replay: the learner routes each token as the engine did, and still trains the router.

The model is the embedded MoE with experts 0 and 1 nearly tied (``near_tie``): which of them a
token takes depends on float32 rounding, so the engine's token-by-token decode and the
learner's whole-row forward disagree on some tokens unless the engine's routes are replayed.
"""

from __future__ import annotations

import pytest
import torch

from grove.capture.embedded import EmbeddedEngine, build_model, build_tokenizer
from grove.capture.embedded_moe import build_moe_model
from grove.capture.engine import SamplingParams
from grove.training.errors import RouteReplayError
from grove.training.loss import token_diagnostics
from grove.training.route_replay import (
    logprob_function,
    moe_routers,
    recompute_logprobs,
    replayed_row_logprobs,
    replaying,
)
from grove.training.rows import ROUTE_MISSING_SENTINEL
from grove.training.trainer import StepBatch, causal_token_logprobs, row_logprobs

NEAR_TIE = 1e-7  # one float32 ulp: experts 0 and 1 differ by rounding alone


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def model(tokenizer):
    return build_moe_model(tokenizer, seed=0, near_tie=NEAR_TIE)


@pytest.fixture(scope="module")
def sampled(tokenizer, model) -> StepBatch:
    """Four generations by the embedded engine in float32, laid out as a step's rows: the
    recorded routes, the sentinel at each row's final token and on padding."""
    engine = EmbeddedEngine(model, stop_token_ids=[tokenizer.eos_token_id], seed=0)
    rows = []
    for index in range(4):
        prompt = tokenizer.encode(f"<|im_start|>user\nThe quick brown fox {index}<|im_end|>\n")
        generation = engine.generate(prompt, SamplingParams(max_tokens=24, seed=index))
        routes = generation.routes.to(torch.int32)
        routes[-1] = ROUTE_MISSING_SENTINEL  # the row's final token
        rows.append((prompt, generation, routes))
    width = max(len(p) + len(g.token_ids) for p, g, _ in rows)
    token_ids = torch.zeros(4, width, dtype=torch.int64)
    loss_mask = torch.zeros(4, width, dtype=torch.bool)
    logprobs = torch.zeros(4, width)
    routes = torch.full((4, width, 2, 2), ROUTE_MISSING_SENTINEL, dtype=torch.int32)
    for r, (prompt, generation, row_routes) in enumerate(rows):
        end = len(prompt) + len(generation.token_ids)
        token_ids[r, :end] = torch.tensor(prompt + list(generation.token_ids))
        loss_mask[r, len(prompt) : end] = True
        logprobs[r, len(prompt) : end] = torch.tensor(generation.logprobs)
        routes[r, :end] = row_routes
    return StepBatch(
        token_ids=token_ids,
        loss_mask=loss_mask,
        generation_logprobs=logprobs,
        advantages=torch.zeros(4),
        owners=torch.arange(4),
        logical_rollouts=4,
        routes=routes,
    )


def _max_tmpe(trainer_logprobs: torch.Tensor, batch: StepBatch) -> float:
    diagnostics = token_diagnostics(
        trainer_logprobs.detach(),
        batch.generation_logprobs,
        batch.loss_mask,
        batch.owners,
        logical_rollouts=batch.logical_rollouts,
    )
    return diagnostics.max_token_mult_prob_error


def test_replayed_routes_reproduce_the_engines_logprobs_within_tmpe_1_001(model, sampled):
    assert _max_tmpe(replayed_row_logprobs(model, sampled, slice(None)), sampled) < 1.001


def test_without_replay_the_same_batch_has_a_measurably_higher_tmpe(model, sampled):
    assert _max_tmpe(row_logprobs(model, sampled, slice(None)), sampled) > 1.001


def test_replay_of_the_routers_own_choice_computes_the_same_logprobs_bit_for_bit(model, sampled):
    from grove.capture.embedded_moe import RouteRecorder

    recorder = RouteRecorder(moe_routers(model))
    with torch.no_grad(), recorder.recording():
        own = causal_token_logprobs(model, sampled.token_ids)
    chosen = recorder.routes().reshape(*sampled.token_ids.shape, 2, 2)
    with torch.no_grad(), replaying(moe_routers(model), chosen):
        replayed = causal_token_logprobs(model, sampled.token_ids)
    assert torch.equal(replayed, own)


def test_sentinel_routes_leave_every_token_to_the_router(model, sampled):
    missing = torch.full_like(sampled.routes, ROUTE_MISSING_SENTINEL)
    with torch.no_grad():
        own = causal_token_logprobs(model, sampled.token_ids)
        with replaying(moe_routers(model), missing):
            replayed = causal_token_logprobs(model, sampled.token_ids)
    assert torch.equal(replayed, own)


def test_replayed_experts_are_the_ones_the_experts_receive(model, sampled):
    forced = torch.zeros_like(sampled.routes)
    forced[..., 0], forced[..., 1] = 3, 2  # every token to experts 3 and 2
    received = []
    handle = model.model.layers[0].mlp.experts.register_forward_hook(
        lambda _m, inputs, _o: received.append(inputs[1].clone())
    )
    try:
        with torch.no_grad(), replaying(moe_routers(model), forced[:1]):
            causal_token_logprobs(model, sampled.token_ids[:1])
    finally:
        handle.remove()
    assert received[0].tolist() == [[3, 2]] * sampled.token_ids.shape[1]


def test_gradients_reach_the_router_through_the_replayed_experts_gate_weights(model, sampled):
    model.zero_grad(set_to_none=True)
    logprobs = replayed_row_logprobs(model, sampled, slice(0, 2))
    (logprobs * sampled.loss_mask[:2]).sum().backward()
    router = moe_routers(model)[0]
    assert router.weight.grad is not None
    assert float(router.weight.grad.abs().sum()) > 0.0
    model.zero_grad(set_to_none=True)


def test_recompute_logprobs_replays_routes_in_micro_batches(model, sampled):
    whole = replayed_row_logprobs(model, sampled, slice(None)).detach()
    recomputed = recompute_logprobs(model, sampled.token_ids, sampled.routes, micro_batch_size=3)
    mask = sampled.loss_mask  # elsewhere tokens after a sentinel may route themselves
    assert torch.allclose(recomputed[mask], whole[mask], atol=1e-6, rtol=0)


def test_an_moe_model_trains_with_replay_and_a_dense_one_without(tokenizer, model):
    assert logprob_function(model) is replayed_row_logprobs
    assert logprob_function(build_model(tokenizer, seed=0)) is row_logprobs


def test_an_moe_batch_without_routes_is_refused(model, sampled):
    bare = StepBatch(
        token_ids=sampled.token_ids,
        loss_mask=sampled.loss_mask,
        generation_logprobs=sampled.generation_logprobs,
        advantages=sampled.advantages,
        owners=sampled.owners,
        logical_rollouts=4,
    )
    with pytest.raises(RouteReplayError, match=r"routes_missing.*2 MoE layers.*no captured"):
        replayed_row_logprobs(model, bare, slice(None))


def test_routes_of_another_layer_count_are_refused(model, sampled):
    with (
        pytest.raises(RouteReplayError, match=r"routes must be integer \(rows, tokens, 2, 2\)"),
        replaying(moe_routers(model), sampled.routes[:, :, :1]),
    ):
        pass


def test_routes_naming_an_expert_the_layer_lacks_are_refused(model, sampled):
    routes = sampled.routes.clone()
    routes[0, 0, 1] = torch.tensor([4, 0])
    with (
        pytest.raises(RouteReplayError, match=r"layer 1 has experts \[0, 4\).*from 0 to 4"),
        replaying(moe_routers(model), routes),
    ):
        pass


def test_routes_naming_one_expert_twice_are_refused(model, sampled):
    routes = sampled.routes.clone()
    routes[0, 0, 0] = torch.tensor([2, 2])
    with (
        pytest.raises(RouteReplayError, match=r"expert_repeated.*layer 0"),
        replaying(moe_routers(model), routes),
    ):
        pass
