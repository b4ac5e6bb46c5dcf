"""The embedded tokenizer, model and engine, and the Engine protocol's records."""

from __future__ import annotations

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import EmbeddedEngine, build_model, build_tokenizer
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.errors import (
    InvalidGenerationError,
    InvalidPromptError,
    InvalidSamplingError,
    PromptTooLongError,
    UnsupportedSamplingError,
)

PROMPT_TEXT = "<|im_start|>user\nWhat is the weather?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """A short ChatML prompt."""
    return tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)


def test_tokenizer_is_built_identically_every_time(tokenizer: PreTrainedTokenizerFast) -> None:
    assert build_tokenizer().get_vocab() == tokenizer.get_vocab()


def test_tokenizer_has_chatml_control_tokens_and_end_of_turn_as_eos(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    assert tokenizer.eos_token == "<|im_end|>"
    assert len(tokenizer.encode("<|im_start|><|im_end|>", add_special_tokens=False)) == 2


def test_tokenizer_round_trips_any_text_through_bytes(tokenizer: PreTrainedTokenizerFast) -> None:
    text = "Ünïcödé ✓ 🙂 \x00\ttabs  and spaces\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, clean_up_tokenization_spaces=False) == text


def test_model_weights_depend_only_on_the_seed(tokenizer: PreTrainedTokenizerFast) -> None:
    a, b, c = (build_model(tokenizer, seed=s) for s in (3, 3, 4))
    first = a.model.embed_tokens.weight
    assert torch.equal(first, b.model.embed_tokens.weight)
    assert not torch.equal(first, c.model.embed_tokens.weight)


def test_building_a_model_leaves_the_global_random_state_alone(
    tokenizer: PreTrainedTokenizerFast,
) -> None:
    before = torch.random.get_rng_state()
    build_model(tokenizer, seed=5)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_model_is_qwen2_style_and_sized_for_the_tokenizer(
    engine: EmbeddedEngine, tokenizer: PreTrainedTokenizerFast
) -> None:
    config = engine.model.config
    assert (config.model_type, config.vocab_size) == ("qwen2", len(tokenizer))


def test_engine_implements_the_engine_protocol(engine: EmbeddedEngine) -> None:
    assert isinstance(engine, Engine)


def test_generation_with_the_same_seed_is_identical(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=12, seed=7)
    assert engine.generate(prompt, sampling) == engine.generate(prompt, sampling)


def test_engines_built_alike_generate_alike_without_a_seed(
    tokenizer: PreTrainedTokenizerFast, prompt: list[int]
) -> None:
    a, b = EmbeddedEngine.build(tokenizer, seed=1), EmbeddedEngine.build(tokenizer, seed=1)
    sampling = SamplingParams(max_tokens=8)
    assert [a.generate(prompt, sampling) for _ in range(2)] == [
        b.generate(prompt, sampling) for _ in range(2)
    ]


def test_recorded_logprobs_are_the_log_softmax_of_the_raw_logits(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    generation = engine.generate(prompt, SamplingParams(max_tokens=10, seed=3))
    ids = torch.tensor([prompt + list(generation.token_ids)])  # (1, T)
    with torch.no_grad():
        logits = engine.model(input_ids=ids).logits[0].float()  # (T, V)
    steps = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)  # (G, V)
    expected = steps.gather(1, torch.tensor(generation.token_ids)[:, None])[:, 0]
    torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def test_generation_stops_at_a_stop_token_and_keeps_it(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    every_token = tuple(range(engine.model.config.vocab_size))
    generation = engine.generate(prompt, SamplingParams(max_tokens=5, stop_token_ids=every_token))
    assert (len(generation.token_ids), generation.finish_reason) == (1, "stop")


def test_generation_without_a_stop_token_ends_at_max_tokens_with_length(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, prompt: list[int]
) -> None:
    generation = engine.generate(prompt, SamplingParams(max_tokens=6, seed=11))
    assert tokenizer.eos_token_id not in generation.token_ids
    assert (len(generation.token_ids), generation.finish_reason) == (6, "length")


@pytest.mark.parametrize(("name", "value"), [("temperature", 0.7), ("top_p", 0.9), ("top_k", 40)])
def test_engine_refuses_sampling_it_cannot_record_exactly(
    engine: EmbeddedEngine, prompt: list[int], name: str, value: float
) -> None:
    sampling = SamplingParams(max_tokens=4, **{name: value})
    with pytest.raises(UnsupportedSamplingError, match=rf"{name} must be .*got {value}"):
        engine.generate(prompt, sampling)


def test_engine_refuses_a_prompt_that_does_not_fit_the_context(engine: EmbeddedEngine) -> None:
    with pytest.raises(PromptTooLongError, match=r"got 2040 \+ 10 = 2050, context is 2048"):
        engine.generate([1] * 2040, SamplingParams(max_tokens=10))


def test_engine_refuses_an_empty_prompt(engine: EmbeddedEngine) -> None:
    with pytest.raises(InvalidPromptError, match="at least one token"):
        engine.generate([], SamplingParams(max_tokens=1))


def test_engine_refuses_token_ids_outside_the_vocabulary(engine: EmbeddedEngine) -> None:
    with pytest.raises(InvalidPromptError, match=r"must lie in \[0, \d+\); got \[99999\]"):
        engine.generate([1, 99999], SamplingParams(max_tokens=1))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_tokens": 0}, "max_tokens: got 0"),
        ({"temperature": 0.0}, "temperature: got 0.0"),
        ({"top_p": 1.5}, "top_p: got 1.5"),
        ({"top_k": -1}, "top_k: got -1"),
        ({"stop_token_ids": (-2,)}, r"stop_token_ids: got \(-2,\)"),
    ],
)
def test_sampling_params_out_of_range_raise(fields: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidSamplingError, match=message):
        SamplingParams(**{"max_tokens": 1, **fields})


def test_generation_with_mismatched_logprobs_raises() -> None:
    with pytest.raises(InvalidGenerationError, match=r"one logprob per token \(2 tokens\); got 1"):
        Generation(token_ids=(1, 2), logprobs=(-0.1,), finish_reason="stop")


def test_generation_with_fewer_routes_than_generated_tokens_raises() -> None:
    routes = torch.zeros(1, 2, 2, dtype=torch.int16)  # one token's route, two generated
    with pytest.raises(InvalidGenerationError, match=r"R >= 2 \(the generated tokens\)"):
        Generation(token_ids=(1, 2), logprobs=(-0.1, -0.2), finish_reason="stop", routes=routes)


def test_generation_with_an_unknown_finish_reason_raises() -> None:
    with pytest.raises(InvalidGenerationError, match="finish_reason is one of"):
        Generation(token_ids=(1,), logprobs=(-0.1,), finish_reason="abort")  # type: ignore[arg-type]


def test_empty_generation_raises() -> None:
    with pytest.raises(InvalidGenerationError, match="at least one token"):
        Generation(token_ids=(), logprobs=(), finish_reason="stop")
