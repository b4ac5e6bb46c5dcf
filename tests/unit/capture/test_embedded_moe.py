"""The embedded MoE model and the routes the embedded engine records while it samples."""

from __future__ import annotations

import pytest
import torch

from grove.capture.embedded import EmbeddedEngine, build_model, build_tokenizer
from grove.capture.embedded_moe import RouteMemory, RouteRecorder, build_moe_model, router_modules
from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import InvalidGenerationError


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def moe(tokenizer):
    return build_moe_model(tokenizer, seed=0)


def _engine(model, tokenizer) -> EmbeddedEngine:
    return EmbeddedEngine(model, stop_token_ids=[tokenizer.eos_token_id], seed=0)


def _prompt(tokenizer) -> list[int]:
    return tokenizer.encode("<|im_start|>user\nThe quick brown fox<|im_end|>\n")


def test_moe_model_from_the_same_seed_has_the_same_weights(tokenizer, moe) -> None:
    again = build_moe_model(tokenizer, seed=0)
    for (name, a), (_, b) in zip(moe.state_dict().items(), again.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_moe_model_routes_two_of_four_experts_in_every_layer_without_aux_loss(moe) -> None:
    routers = router_modules(moe)
    assert [(r.num_experts, r.top_k) for r in routers] == [(4, 2), (4, 2)]
    assert moe.config.router_aux_loss_coef == 0.0
    assert moe.config.output_router_logits is False


def test_near_tie_makes_expert_one_the_scaled_router_row_of_expert_zero(tokenizer) -> None:
    model = build_moe_model(tokenizer, seed=0, near_tie=0.5)
    for router in router_modules(model):
        assert torch.equal(router.weight[1], router.weight[0] * 1.5)


def test_engine_records_the_route_of_every_prompt_and_generated_token(tokenizer, moe) -> None:
    prompt = _prompt(tokenizer)
    generation = _engine(moe, tokenizer).generate(prompt, SamplingParams(max_tokens=6, seed=3))
    tokens = len(prompt) + len(generation.token_ids)
    assert generation.routes is not None
    assert tuple(generation.routes.shape) == (tokens, 2, 2)  # (tokens, layers, top_k)


def test_recorded_routes_are_the_experts_the_model_chooses_over_the_whole_sequence(
    tokenizer, moe
) -> None:
    prompt = _prompt(tokenizer)
    generation = _engine(moe, tokenizer).generate(prompt, SamplingParams(max_tokens=6, seed=3))
    recorder = RouteRecorder(router_modules(moe))
    with torch.no_grad(), recorder.recording():
        moe(torch.tensor([prompt + list(generation.token_ids)]))
    # The final generated token is run once more after sampling, so it has a route too.
    assert torch.equal(recorder.routes(), generation.routes)


def test_recording_leaves_the_sampled_tokens_and_logprobs_unchanged(tokenizer) -> None:
    model = build_moe_model(tokenizer, seed=0)
    sampling = SamplingParams(max_tokens=6, seed=3)
    recorded = _engine(model, tokenizer).generate(_prompt(tokenizer), sampling)
    plain = _engine(model, tokenizer)
    plain._routers = []  # the same engine without its recorder
    unrecorded = plain.generate(_prompt(tokenizer), sampling)
    assert unrecorded.routes is None
    assert (recorded.token_ids, recorded.logprobs) == (unrecorded.token_ids, unrecorded.logprobs)


def test_dense_engine_records_no_routes(tokenizer) -> None:
    engine = _engine(build_model(tokenizer, seed=0), tokenizer)
    generation = engine.generate(_prompt(tokenizer), SamplingParams(max_tokens=3, seed=1))
    assert generation.routes is None


def test_delta_routes_are_the_last_prompt_delta_and_generated_rows() -> None:
    routes = torch.arange(5 * 2 * 1, dtype=torch.int16).reshape(5, 2, 1)  # 3 prompt + 2 generated
    generation = Generation(
        token_ids=(7, 8), logprobs=(-0.1, -0.2), finish_reason="stop", routes=routes
    )
    assert torch.equal(generation.delta_routes(1), routes[2:])
    assert generation.delta_routes(3).shape == (5, 2, 1)


def test_delta_routes_longer_than_what_the_engine_ran_raise() -> None:
    routes = torch.zeros(3, 1, 2, dtype=torch.int16)
    generation = Generation(
        token_ids=(7, 8), logprobs=(-0.1, -0.2), finish_reason="stop", routes=routes
    )
    with pytest.raises(InvalidGenerationError, match=r"\(4 rows\); got '3 rows'"):
        generation.delta_routes(2)


def test_generation_with_routes_without_a_layer_axis_raises() -> None:
    with pytest.raises(InvalidGenerationError, match=r"routes of shape \(R, layers, top_k\)"):
        Generation(
            token_ids=(7,),
            logprobs=(-0.1,),
            finish_reason="stop",
            routes=torch.zeros(1, 2, dtype=torch.int16),
        )


def test_a_continuations_prefill_routes_its_parents_tokens_as_the_parent_did(tokenizer) -> None:
    # experts 0 and 1 one float32 ulp apart: prefilling the parent's tokens again would route
    # some of them otherwise than the parent's token-by-token decode did
    model = build_moe_model(tokenizer, seed=0, near_tie=1e-7)
    engine = _engine(model, tokenizer)
    parent = engine.generate(_prompt(tokenizer), SamplingParams(max_tokens=24, seed=1))
    history = _prompt(tokenizer) + list(parent.token_ids)
    continuation = history + tokenizer.encode("<|im_start|>tool\nsunny<|im_end|>\n")

    child = engine.generate(continuation, SamplingParams(max_tokens=4, seed=2))
    fresh = _engine(model, tokenizer).generate(continuation, SamplingParams(max_tokens=4, seed=2))

    assert torch.equal(child.routes[: len(history)], parent.routes)
    assert not torch.equal(fresh.routes[: len(history)], parent.routes)  # what forcing prevents


def test_route_memory_finds_the_longest_remembered_prefix_of_a_prompt() -> None:
    memory = RouteMemory(capacity=2)
    memory.remember([1, 2], torch.zeros(2, 1, 1))
    memory.remember([1, 2, 3, 4], torch.ones(4, 1, 1))
    assert memory.prefix_routes([1, 2, 3, 4, 5]).shape == (4, 1, 1)
    assert memory.prefix_routes([1, 2, 3]).shape == (2, 1, 1)
    assert memory.prefix_routes([2, 1]) is None
    memory.remember([9], torch.zeros(1, 1, 1))  # capacity 2: [1, 2, 3, 4], least recently used
    assert memory.prefix_routes([1, 2, 3, 4, 5]).shape == (2, 1, 1)
