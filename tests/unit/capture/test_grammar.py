"""Grammar-constrained decoding on the embedded engine: the grammar of an output constraint, the
mask it puts on the random tiny model's logits, and the logprobs recorded under it
(``capture/grammar.py``; ``docs/gateway.md``, "Structured output")."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from grove.capture.embedded import EmbeddedEngine
from grove.capture.engine import FunctionSchema, Generation, OutputConstraint, SamplingParams
from grove.capture.errors import InvalidSamplingError, UnsupportedSamplingError
from grove.capture.grammar import GrammarError, GrammarMask, TokenizerGrammar, grammar_text
from grove.capture.toolcalls import parse_output
from grove.training.advantages import pooled_logprob_error

PROMPT_TEXT = "<|im_start|>user\nThe weather, as JSON?<|im_end|>\n<|im_start|>assistant\n"
WEATHER = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Rome"]},
        "degrees": {"type": "integer", "minimum": -30, "maximum": 45},
        "sunny": {"type": "boolean"},
    },
    "required": ["city", "degrees", "sunny"],
    "additionalProperties": False,
}
JSON_WEATHER = OutputConstraint(content="json_schema", schema=WEATHER, name="weather", strict=True)
LOOKUP = FunctionSchema(
    "lookup",
    {
        "type": "object",
        "properties": {"unit": {"enum": ["c", "f"]}},
        "required": ["unit"],
        "additionalProperties": False,
    },
)
FORCED_LOOKUP = OutputConstraint(tools=(LOOKUP,), tool_calls="required", parallel_tool_calls=False)


@pytest.fixture(scope="module")
def prompt(tokenizer: PreTrainedTokenizerFast) -> list[int]:
    return tokenizer.encode(PROMPT_TEXT, add_special_tokens=False)


@pytest.fixture(scope="module")
def grammar(tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine) -> TokenizerGrammar:
    """The grammar compiler the engine builds for itself, built again for the test."""
    return TokenizerGrammar(
        tokenizer,
        vocab_size=engine.model.config.vocab_size,
        stop_token_ids=[tokenizer.eos_token_id],
    )


def text_of(tokenizer: PreTrainedTokenizerFast, generation: Generation) -> str:
    return tokenizer.decode(generation.content_token_ids, clean_up_tokenization_spaces=False)


def allowed(mask: GrammarMask, vocab: int) -> set[int]:
    """The token ids ``mask`` allows next."""
    masked = mask.apply(torch.zeros(vocab))
    return set(torch.isfinite(masked).nonzero().flatten().tolist())


def replayed_steps(
    engine: EmbeddedEngine,
    grammar: TokenizerGrammar,
    prompt: list[int],
    generation: Generation,
    constraint: OutputConstraint,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, V) raw and grammar-masked logits of each generated token, recomputed from scratch:
    one forward pass over prompt and generation, and a fresh mask following the tokens."""
    ids = torch.tensor([prompt + list(generation.token_ids)])  # (1, T)
    with torch.no_grad():
        raw = engine.model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()  # (G, V)
    mask = grammar.mask(constraint)
    masked = []
    for step, token in zip(raw, generation.token_ids, strict=True):
        masked.append(mask.apply(step))
        mask.accept(token)
    return raw, torch.stack(masked)


def test_a_json_schema_constraint_makes_the_random_model_answer_json_of_the_schema(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, prompt: list[int]
) -> None:
    for seed in range(3):
        sampling = SamplingParams(max_tokens=64, seed=seed, constraint=JSON_WEATHER)
        generation = engine.generate(prompt, sampling)
        assert generation.finish_reason == "stop"
        jsonschema.validate(json.loads(text_of(tokenizer, generation)), WEATHER)


def test_a_constrained_generation_ends_with_the_end_of_turn_token_after_the_grammar(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=64, seed=4, constraint=JSON_WEATHER)
    generation = engine.generate(prompt, sampling)
    assert generation.token_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.eos_token_id not in generation.content_token_ids


def test_recorded_logprobs_are_the_log_softmax_of_the_grammar_masked_logits(
    engine: EmbeddedEngine, grammar: TokenizerGrammar, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=64, seed=5, constraint=JSON_WEATHER)
    generation = engine.generate(prompt, sampling)
    _, masked = replayed_steps(engine, grammar, prompt, generation, JSON_WEATHER)
    tokens = torch.tensor(generation.token_ids)[:, None]  # (G, 1)
    expected = torch.log_softmax(masked, dim=-1).gather(1, tokens)[:, 0]  # (G,)
    torch.testing.assert_close(torch.tensor(generation.logprobs), expected, atol=1e-4, rtol=0)


def unconstrained(
    engine: EmbeddedEngine, grammar: TokenizerGrammar, prompt: list[int], seed: int
) -> tuple[Generation, torch.Tensor, torch.Tensor]:
    """A constrained generation, each token's unconstrained logprob (what the trainer recomputes)
    and the mass the unconstrained distribution gives the tokens the grammar allowed, (G,)."""
    sampling = SamplingParams(max_tokens=64, seed=seed, constraint=JSON_WEATHER)
    generation = engine.generate(prompt, sampling)
    raw, masked = replayed_steps(engine, grammar, prompt, generation, JSON_WEATHER)
    tokens = torch.tensor(generation.token_ids)[:, None]  # (G, 1)
    trainer = torch.log_softmax(raw, dim=-1).gather(1, tokens)[:, 0]  # (G,)
    allowed_mass = torch.softmax(raw, dim=-1).masked_fill(~torch.isfinite(masked), 0).sum(-1)
    return generation, trainer, allowed_mass


def test_a_constrained_tokens_unconstrained_logprob_is_lower_by_the_log_of_the_allowed_mass(
    engine: EmbeddedEngine, grammar: TokenizerGrammar, prompt: list[int]
) -> None:
    # log p(t) = log q(t) + log Z: p the model, q the masked distribution the engine sampled,
    # Z the mass p gives the allowed tokens.
    generation, trainer, allowed_mass = unconstrained(engine, grammar, prompt, seed=6)
    recorded = torch.tensor(generation.logprobs)
    torch.testing.assert_close(trainer - recorded, allowed_mass.log(), atol=1e-4, rtol=0)
    assert float(allowed_mass.min()) < 0.5  # the grammar did cut the distribution


def test_the_tmpe_of_a_constrained_call_is_the_mean_inverse_allowed_mass(
    engine: EmbeddedEngine, grammar: TokenizerGrammar, prompt: list[int]
) -> None:
    generation, trainer, allowed_mass = unconstrained(engine, grammar, prompt, seed=6)
    count = len(generation.token_ids)
    tmpe = pooled_logprob_error(
        torch.tensor(generation.logprobs),
        trainer,
        torch.ones(count),
        torch.zeros(count, dtype=torch.long),
        1,
    )
    expected = float((1 / allowed_mass.double()).mean())
    assert float(tmpe[0]) == pytest.approx(expected, rel=1e-3)
    assert expected > 1.5


def test_a_constrained_generation_with_the_same_seed_is_identical(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=64, seed=8, constraint=JSON_WEATHER)
    assert engine.generate(prompt, sampling) == engine.generate(prompt, sampling)


def test_a_constrained_generation_cut_by_max_tokens_finishes_length(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=5, seed=1, constraint=JSON_WEATHER)
    generation = engine.generate(prompt, sampling)
    assert (len(generation.token_ids), generation.finish_reason) == (5, "length")
    assert text_of(tokenizer, generation) == '{"city": "'[: len(text_of(tokenizer, generation))]


def test_a_required_tool_call_is_one_call_in_the_markup_the_gateway_parses(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, prompt: list[int]
) -> None:
    sampling = SamplingParams(max_tokens=80, seed=2, constraint=FORCED_LOOKUP)
    generation = engine.generate(prompt, sampling)
    parsed = parse_output(text_of(tokenizer, generation), tool_calls=True)
    assert generation.finish_reason == "stop"
    assert (parsed.content, len(parsed.tool_calls), parsed.tool_calls[0].name) == (
        None,
        1,
        "lookup",
    )
    assert json.loads(parsed.tool_calls[0].arguments)["unit"] in ("c", "f")


def test_without_parallel_tool_calls_only_the_end_of_turn_follows_a_complete_call(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, grammar: TokenizerGrammar
) -> None:
    mask = grammar.mask(FORCED_LOOKUP)
    call = '<tool_call>{"name": "lookup", "arguments": {"unit": "c"}}</tool_call>'
    for token in tokenizer.encode(call, add_special_tokens=False):
        mask.accept(token)
    assert allowed(mask, engine.model.config.vocab_size) == {tokenizer.eos_token_id}


def test_with_parallel_tool_calls_another_call_may_follow_a_complete_one(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, grammar: TokenizerGrammar
) -> None:
    parallel = OutputConstraint(tools=(LOOKUP,), tool_calls="required", parallel_tool_calls=True)
    mask = grammar.mask(parallel)
    call = '<tool_call>{"name": "lookup", "arguments": {"unit": "c"}}</tool_call>'
    for token in tokenizer.encode(call, add_special_tokens=False):
        mask.accept(token)
    opening = tokenizer.convert_tokens_to_ids("<tool_call>")
    after = allowed(mask, engine.model.config.vocab_size)
    assert {tokenizer.eos_token_id, opening} <= after


def test_auto_tool_calls_with_a_json_format_allow_json_or_a_call_first(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, grammar: TokenizerGrammar
) -> None:
    either = OutputConstraint(content="json_object", tools=(LOOKUP,), tool_calls="auto")
    first = allowed(grammar.mask(either), engine.model.config.vocab_size)
    brace, opening = tokenizer.convert_tokens_to_ids(["{", "<tool_call>"])
    assert {brace, opening} <= first
    assert tokenizer.convert_tokens_to_ids("Ġthe") not in first


def test_control_tokens_are_never_allowed_even_where_their_spelling_would_be(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, grammar: TokenizerGrammar
) -> None:
    # Inside a JSON string any text is allowed, "<|im_start|>" included, but not the token.
    mask = grammar.mask(OutputConstraint(content="json_object"))
    for token in tokenizer.encode('{"', add_special_tokens=False):
        mask.accept(token)
    inside = allowed(mask, engine.model.config.vocab_size)
    start, end_of_text, think = tokenizer.convert_tokens_to_ids(
        ["<|im_start|>", "<|endoftext|>", "<think>"]
    )
    assert (start in inside, end_of_text in inside, think in inside) == (False, False, True)


def test_a_request_stop_token_is_allowed_only_where_the_grammar_is_complete(
    tokenizer: PreTrainedTokenizerFast, engine: EmbeddedEngine, grammar: TokenizerGrammar
) -> None:
    dot, eos = tokenizer.convert_tokens_to_ids("."), tokenizer.eos_token_id
    vocab = engine.model.config.vocab_size
    mask = grammar.mask(OutputConstraint(content="json_object"), {eos, dot})
    for token in tokenizer.encode('{"a', add_special_tokens=False):
        mask.accept(token)
    inside = allowed(mask, vocab)
    for token in tokenizer.encode('": 1}', add_special_tokens=False):
        mask.accept(token)
    assert (dot in inside, allowed(mask, vocab)) == (False, {eos, dot})


def test_the_engine_builds_its_grammar_compiler_once(
    tokenizer: PreTrainedTokenizerFast, prompt: list[int]
) -> None:
    engine = EmbeddedEngine.build(tokenizer)
    sampling = SamplingParams(max_tokens=4, seed=1, constraint=JSON_WEATHER)
    engine.generate(prompt, sampling)
    built = engine._grammar
    engine.generate(prompt, sampling)
    assert built is not None and engine._grammar is built


def test_an_engine_built_without_its_tokenizer_refuses_a_constraint(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    bare = EmbeddedEngine(engine.model, stop_token_ids=engine.stop_token_ids)
    sampling = SamplingParams(max_tokens=4, constraint=JSON_WEATHER)
    with pytest.raises(UnsupportedSamplingError, match="built without its tokenizer"):
        bare.check(prompt, sampling)


@pytest.mark.parametrize(
    ("schema", "reason"),
    [
        ({"type": "array", "uniqueItems": True}, "array keyword 'uniqueItems' is not supported"),
        ({"type": "string", "format": "color"}, "string format 'color' is not supported"),
        (
            {"type": "string", "pattern": "a+", "maxLength": 3},
            "minLength/maxLength beside a pattern or format",
        ),
        ({"type": "nonsense"}, 'Unsupported type "nonsense"'),
    ],
    ids=["unique-items", "unknown-format", "pattern-with-length", "unknown-type"],
)
def test_a_schema_the_grammar_cannot_enforce_is_refused_with_the_reason(
    schema: dict, reason: str
) -> None:
    constraint = OutputConstraint(content="json_schema", schema=schema)
    with pytest.raises(GrammarError, match=reason) as raised:
        grammar_text(constraint)
    assert isinstance(raised.value, InvalidSamplingError)


def test_an_engine_refuses_a_schema_it_cannot_enforce_before_generating(
    engine: EmbeddedEngine, prompt: list[int]
) -> None:
    schema = {"type": "array", "contains": {"type": "integer"}}
    sampling = SamplingParams(
        max_tokens=4, constraint=OutputConstraint(content="json_schema", schema=schema)
    )
    with pytest.raises(GrammarError, match=r"#: array keyword 'contains'"):
        engine.check(prompt, sampling)


def test_a_tool_calls_grammar_names_the_tool_and_its_arguments_schema() -> None:
    grammar = grammar_text(FORCED_LOOKUP)
    assert '"\\"lookup\\""' in grammar
    assert '"<tool_call>"' in grammar and '"</tool_call>"' in grammar


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"content": "json_schema"}, "a schema exactly when content is json_schema"),
        ({"content": "json_object", "schema": WEATHER}, "a schema exactly when"),
        ({"content": "json_object", "tool_calls": "auto"}, "tools exactly when tool_calls"),
        ({"tools": (LOOKUP,), "tool_calls": "required", "content": "json_object"}, "none when"),
        ({}, "a content format unless tool calls are required"),
    ],
    ids=["schema-missing", "schema-extra", "tools-missing", "content-with-required", "empty"],
)
def test_an_inconsistent_constraint_is_refused(fields: dict, rule: str) -> None:
    with pytest.raises(InvalidSamplingError, match=rule):
        OutputConstraint(**fields)


def test_the_recorded_constraint_keeps_the_schemas_property_order_as_json_text() -> None:
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "null"}}}
    record = OutputConstraint(content="json_schema", schema=schema, name="n").record()
    assert record == {
        "content": "json_schema",
        "schema": json.dumps(schema),
        "name": "n",
        "strict": None,
        "tool_calls": "none",
        "tools": [],
        "parallel_tool_calls": True,
    }
    assert list(json.loads(record["schema"])["properties"]) == ["z", "a"]
