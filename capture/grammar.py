"""Grammar-constrained decoding: an output constraint as one grammar, and its per-step token mask.

The grammar (:func:`grammar_text`, xgrammar's EBNF) of a ``grove.capture.engine.OutputConstraint``:

- content ``json_object`` is any JSON object, ``json_schema`` a JSON value matching the schema
  (enforced whether the request said ``strict`` or not); JSON is written compactly, with no
  whitespace outside strings but the separators ``", "`` and ``": "``, so a model cannot pad an
  answer with whitespace until it runs out of tokens;
- a tool call is ``<tool_call>{"name": NAME, "arguments": ARGS}</tool_call>``, the markup
  ``capture/toolcalls.py`` parses, with NAME one of the tools and ARGS matching its parameters
  (any JSON object when it has none); one call, or one or more when parallel calls are allowed;
- ``tool_calls`` ``auto`` allows the content or the calls, ``required`` the calls alone.

Both engines decode under this same text: the embedded engine through :class:`TokenizerGrammar`
here, the vLLM engine by sending it as vLLM's ``structured_outputs.grammar``. Schema keywords the
grammar could not enforce are refused (:class:`GrammarError`), never silently dropped; so is a
``$ref`` to anything outside the schema itself (a web address, a file): Grove fetches no schema.

Sampling under a grammar (:class:`GrammarMask`), at each step: the logits of the tokens the
grammar does not allow next are set to ``-inf``; the token is drawn from the softmax of the masked
logits (the model's distribution renormalized over the allowed tokens) and its logprob is taken
under that same distribution; the matcher then accepts it. Once the grammar is complete only the
end-of-turn tokens (and the request's stop tokens, which are never allowed inside the answer,
as vLLM does) are allowed, so a generation ends at the grammar's end (``stop``), or at
``max_tokens`` (``length``, the text cut where it was). ``docs/gateway.md``, "Structured output",
says what these logprobs mean for the loss.

The tokenizer's vocabulary as xgrammar sees it (:func:`tokenizer_info`): each token's text as the
tokenizer writes it, decoded by its vocabulary type (byte-level BPE: the byte alphabet mapped back
to bytes), with the special tokens (``<|im_start|>``, ``<|endoftext|>``, ...) given no text, so the
grammar never matches a control token as if it were its spelling, and the engine's end-of-turn
tokens as the stop tokens.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

import torch
import xgrammar as xgr
from transformers import PreTrainedTokenizerBase
from xgrammar.structural_tag import (
    Format,
    GrammarFormat,
    OrFormat,
    PlusFormat,
    StructuralTag,
    TagFormat,
)

from grove.capture.engine import FunctionSchema, OutputConstraint
from grove.capture.errors import EngineError, InvalidSamplingError, UnsupportedSamplingError
from grove.capture.toolcalls import TOOL_CALL_CLOSE, TOOL_CALL_OPEN

__all__ = [
    "ConstraintUnsupportedError",
    "GrammarError",
    "GrammarMask",
    "TokenizerGrammar",
    "call_schema",
    "grammar_text",
    "tokenizer_info",
]

_ANY_OBJECT: Final = {"type": "object"}
_STRING_FORMATS: Final = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
_ARRAY_UNSUPPORTED: Final = ("uniqueItems", "contains", "minContains", "maxContains")
_XGRAMMAR_PREFIX: Final = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")
_COMPILER_THREADS: Final = 2


class GrammarError(InvalidSamplingError):
    """A constraint that cannot become a grammar: a schema xgrammar refuses, or a keyword the
    grammar could not enforce. ``where`` names the schema (``response_format``, ``tools[i]``)."""

    def __init__(self, where: str, detail: str) -> None:
        self.name = where
        self.got = detail
        self.expected = "a JSON schema the grammar can enforce"
        self.where = where
        self.detail = detail
        EngineError.__init__(
            self,
            f"The JSON schema of {where} cannot be enforced by constrained decoding: {detail}",
        )


class ConstraintUnsupportedError(UnsupportedSamplingError):
    """An engine that cannot decode under an output constraint; ``reason`` says why and what to
    do."""

    def __init__(self, engine: str, reason: str) -> None:
        self.engine = engine
        self.name = "constraint"
        self.got = "an output constraint"
        self.supported = None
        self.reason = reason
        EngineError.__init__(
            self, f"The {engine} engine cannot decode under an output constraint: {reason}"
        )


def call_schema(tool: FunctionSchema) -> dict[str, Any]:
    """The JSON schema of one call of ``tool`` as the tool-call markup holds it: ``name`` (the
    tool's) first, then ``arguments`` (its parameters; any object without them)."""
    arguments = dict(tool.parameters) if tool.parameters is not None else _ANY_OBJECT
    return {
        "type": "object",
        "properties": {"name": {"const": tool.name}, "arguments": arguments},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def grammar_text(constraint: OutputConstraint) -> str:
    """The grammar of ``constraint`` in xgrammar's EBNF (module docstring); raises
    :class:`GrammarError` for a schema it cannot enforce."""
    return _grammar(json.dumps(constraint.record()))


@functools.lru_cache(maxsize=256)
def _grammar(recorded: str) -> str:
    """The grammar of a recorded constraint (cached: a harness sends the same schema often)."""
    record = json.loads(recorded)
    elements: list[Format] = []
    if record["content"] is not None:
        schema = _ANY_OBJECT if record["schema"] is None else json.loads(record["schema"])
        elements.append(_json_format(schema, "the response format"))
    if record["tool_calls"] != "none":
        calls: list[Format] = []
        for index, tool in enumerate(record["tools"]):
            parameters = None if tool["parameters"] is None else json.loads(tool["parameters"])
            schema = call_schema(FunctionSchema(tool["name"], parameters))
            arguments = _json_format(schema, f"tools[{index}] ({tool['name']})")
            calls.append(TagFormat(begin=TOOL_CALL_OPEN, content=arguments, end=TOOL_CALL_CLOSE))
        one: Format = calls[0] if len(calls) == 1 else OrFormat(elements=calls)
        elements.append(PlusFormat(content=one) if record["parallel_tool_calls"] else one)
    root = elements[0] if len(elements) == 1 else OrFormat(elements=elements)
    return str(xgr.Grammar.from_structural_tag(StructuralTag(format=root)))


def _json_format(schema: Any, where: str) -> GrammarFormat:
    """``schema`` as a compact JSON grammar, embeddable in a structural tag."""
    unsupported = _unsupported_keyword(schema)
    if unsupported is not None:
        raise GrammarError(where, unsupported)
    try:
        grammar = xgr.Grammar.from_json_schema(
            json.dumps(schema), any_whitespace=False, strict_mode=True
        )
    except (RuntimeError, ValueError) as error:
        raise GrammarError(where, _XGRAMMAR_PREFIX.sub("", str(error)).strip()) from None
    return GrammarFormat(grammar=str(grammar))


def _unsupported_keyword(schema: Any) -> str | None:
    """The first keyword the grammar would not enforce, described; None when there is none.

    xgrammar ignores these rather than refusing them: array ``uniqueItems`` and ``contains``
    (and its bounds), a string ``format`` it does not know, a string's length bounds beside a
    ``pattern`` or ``format``, and a ``$ref`` outside the schema (``http://``, ``file://``, any
    reference not starting with ``#``), which Grove never fetches. Walked with a stack, never
    recursion, in document order.
    """
    pending: list[tuple[Any, str]] = [(schema, "#")]
    while pending:
        value, path = pending.pop()
        if isinstance(value, list):
            children = [(item, f"{path}/{index}") for index, item in enumerate(value)]
        elif isinstance(value, Mapping):
            found = _unsupported_here(value, path)
            if found is not None:
                return found
            children = [(item, f"{path}/{key}") for key, item in value.items()]
        else:
            continue
        pending.extend(reversed(children))
    return None


def _unsupported_here(schema: Mapping[str, Any], path: str) -> str | None:
    """The unsupported keyword of one schema object itself (not of its subschemas)."""
    reference = schema.get("$ref")  # a Mapping there is a property named "$ref"
    local = isinstance(reference, str) and reference.startswith("#")
    if "$ref" in schema and not local and not isinstance(reference, Mapping):
        return (
            f"{path}: $ref {reference!r} is not a reference inside the schema: only local "
            "references (starting with '#') are supported; Grove fetches no schema"
        )
    types = schema.get("type")
    kinds = {types} if isinstance(types, str) else set(types or ())
    if "array" in kinds:
        for keyword in _ARRAY_UNSUPPORTED:
            if keyword in schema:
                return f"{path}: array keyword {keyword!r} is not supported"
    if "string" in kinds:
        string_format = schema.get("format")
        if string_format is not None and string_format not in _STRING_FORMATS:
            return f"{path}: string format {string_format!r} is not supported"
        generative = "pattern" in schema or "format" in schema
        if generative and ("minLength" in schema or "maxLength" in schema):
            return f"{path}: minLength/maxLength beside a pattern or format is not supported"
    return None


def tokenizer_info(
    tokenizer: PreTrainedTokenizerBase, *, vocab_size: int, stop_token_ids: Iterable[int]
) -> xgr.TokenizerInfo:
    """The vocabulary of ``tokenizer`` as xgrammar matches it (module docstring): ``vocab_size``
    entries (the model's; ids the tokenizer lacks have no text), special tokens without text,
    ``stop_token_ids`` as the tokens that end a completed grammar."""
    stops = sorted(set(stop_token_ids))
    detected = xgr.TokenizerInfo.from_huggingface(
        tokenizer, vocab_size=vocab_size, stop_token_ids=stops
    )
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    special |= set(tokenizer.all_special_ids)
    encoded = [""] * vocab_size
    for token, index in tokenizer.get_vocab().items():
        if index < vocab_size and index not in special:
            encoded[index] = token
    return xgr.TokenizerInfo(
        encoded,
        detected.vocab_type,
        vocab_size=vocab_size,
        stop_token_ids=stops,
        add_prefix_space=detected.add_prefix_space,
    )


class GrammarMask:
    """One generation's grammar state: masks each step's logits and follows the sampled tokens.

    Not thread-safe; one per generation (:meth:`TokenizerGrammar.mask`).
    """

    def __init__(
        self, compiled: xgr.CompiledGrammar, vocab_size: int, stop_token_ids: Iterable[int]
    ) -> None:
        self._matcher = xgr.GrammarMatcher(compiled, override_stop_tokens=sorted(stop_token_ids))
        self._bitmask = xgr.allocate_token_bitmask(1, vocab_size)  # (1, ceil(V / 32)) int32
        self.vocab_size = vocab_size

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (V,) with every token the grammar does not allow next set to ``-inf``."""
        masked = logits.float().clone()[None]  # (1, V)
        self._matcher.fill_next_token_bitmask(self._bitmask)
        xgr.apply_token_bitmask_inplace(masked, self._bitmask, vocab_size=self.vocab_size)
        return masked[0]

    def accept(self, token: int) -> None:
        """Advance past ``token``, which the last :meth:`apply` allowed."""
        if not self._matcher.accept_token(token):
            raise EngineError(
                f"The grammar refused token {token}, which its own mask allowed: a bug in "
                "constrained decoding; report it with the request"
            )


class TokenizerGrammar:
    """Compiles grammars for one tokenizer and model; built once per engine, as its tokenizer
    information and compiler cost a pass over the vocabulary. Compiled grammars are cached by
    xgrammar's compiler, keyed by the grammar text."""

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        vocab_size: int,
        stop_token_ids: Iterable[int],
    ) -> None:
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_token_ids)
        self._compiler = xgr.GrammarCompiler(self.info, max_threads=_COMPILER_THREADS)

    def mask(
        self, constraint: OutputConstraint, stop_token_ids: Iterable[int] | None = None
    ) -> GrammarMask:
        """A fresh mask for one generation under ``constraint``, ended by ``stop_token_ids``
        (default: the end-of-turn tokens this compiler was built with)."""
        compiled = self._compiler.compile_grammar(grammar_text(constraint))
        stops = self.info.stop_token_ids if stop_token_ids is None else stop_token_ids
        return GrammarMask(compiled, self.vocab_size, stops)
