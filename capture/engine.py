"""The inference seam: one ``Engine.generate`` call per model call, exact tokens in and out.

The lifecycle hands an engine the exact prompt token ids that ``capture/splice.py`` planned and
stores what comes back; nothing between them re-tokenizes. Engines: ``capture/embedded.py`` (a
tiny transformers model, for tests and the demo) and ``capture/vllm.py`` (a vLLM server).

A call may constrain what it generates (:class:`OutputConstraint`: JSON content, a JSON schema,
forced tool calls); both engines then decode under the one grammar ``capture/grammar.py`` builds
from it (``docs/gateway.md``, "Structured output").
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol, get_args, runtime_checkable

import torch

from grove.capture.errors import InvalidGenerationError, InvalidSamplingError
from grove.ledger.bounds import MAX_COUNT, MAX_SEED

__all__ = [
    "FINISH_REASONS",
    "ContentFormat",
    "Engine",
    "FinishReason",
    "FunctionSchema",
    "Generation",
    "OutputConstraint",
    "SamplingParams",
    "ToolCalls",
]

FinishReason = Literal["stop", "length"]
FINISH_REASONS: Final = frozenset(get_args(FinishReason))
ContentFormat = Literal["json_object", "json_schema"]
ToolCalls = Literal["none", "auto", "required"]


@dataclass(frozen=True)
class FunctionSchema:
    """A function tool a constrained answer may call: its name and the JSON schema of its
    arguments (``parameters``; None: any JSON object)."""

    name: str
    parameters: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class OutputConstraint:
    """What a generation must be, enforced by grammar-constrained decoding.

    Producer: ``capture/conversion.py`` (``response_format``, the Responses ``text.format``,
    ``tool_choice``); consumers: the engines, through ``capture/grammar.py``, and the call's
    intent (:meth:`record`). ``docs/gateway.md``, "Structured output", states the rules.

    ``content`` is the format of the answer's text: ``json_object`` (any JSON object) or
    ``json_schema`` (a JSON value matching ``schema``, whose ``name`` and ``strict`` are the
    request's, recorded as sent; the schema is enforced either way); None only when a tool call
    is required. ``tool_calls`` says whether the answer may instead call ``tools``: ``none`` (it
    may not; ``tools`` is empty), ``auto`` (content, or tool calls and nothing else) or
    ``required`` (tool calls and nothing else). ``parallel_tool_calls`` False allows one call,
    True one or more.
    """

    content: ContentFormat | None = None
    schema: Mapping[str, Any] | None = None
    name: str | None = None
    strict: bool | None = None
    tools: tuple[FunctionSchema, ...] = ()
    tool_calls: ToolCalls = "none"
    parallel_tool_calls: bool = True

    def __post_init__(self) -> None:
        if (self.content == "json_schema") != (self.schema is not None):
            raise InvalidSamplingError(
                "constraint.schema", self.schema, "a schema exactly when content is json_schema"
            )
        if (self.tool_calls == "none") != (not self.tools):
            raise InvalidSamplingError(
                "constraint.tools",
                [tool.name for tool in self.tools],
                "tools exactly when tool_calls is auto or required",
            )
        if (self.content is None) != (self.tool_calls == "required"):
            raise InvalidSamplingError(
                "constraint.content",
                self.content,
                "a content format unless tool calls are required, and none when they are",
            )

    def record(self) -> dict[str, Any]:
        """The constraint as JSON values, as the call's intent records it. Schemas are kept as
        their JSON text, so the property order the grammar enforces survives any JSON store."""
        return {
            "content": self.content,
            "schema": None if self.schema is None else json.dumps(self.schema),
            "name": self.name,
            "strict": self.strict,
            "tool_calls": self.tool_calls,
            "tools": [
                {
                    "name": tool.name,
                    "parameters": None if tool.parameters is None else json.dumps(tool.parameters),
                }
                for tool in self.tools
            ],
            "parallel_tool_calls": self.parallel_tool_calls,
        }


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation. Producer: the gateway (request body); consumer: an engine.

    ``top_k`` 0 and ``top_p`` 1.0 mean no truncation of the distribution. ``seed`` None lets the
    engine use its own random stream; else it is a non-negative signed 64-bit integer (what
    torch's generator and vLLM take). ``max_tokens`` and ``top_k`` are at most ``2**31 - 1`` (the
    ledger's integer columns; ``grove.ledger.bounds``). ``stop_token_ids`` are added to the
    engine's own stop tokens (end of turn, end of text); a stop token is part of the generation.
    ``constraint`` None samples freely; else every token is drawn from the distribution
    renormalized over the tokens the constraint's grammar allows, and its logprob is taken under
    that distribution.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    constraint: OutputConstraint | None = None

    def __post_init__(self) -> None:
        if _not_int_in(self.max_tokens, 1, MAX_COUNT):
            raise InvalidSamplingError(
                "max_tokens", self.max_tokens, f"an integer in [1, {MAX_COUNT}]"
            )
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidSamplingError("temperature", self.temperature, "a finite number > 0")
        if not 0 < self.top_p <= 1:
            raise InvalidSamplingError("top_p", self.top_p, "a number in (0, 1]")
        if _not_int_in(self.top_k, 0, MAX_COUNT):
            raise InvalidSamplingError(
                "top_k", self.top_k, f"an integer in [0, {MAX_COUNT}] (0: disabled)"
            )
        if self.seed is not None and _not_int_in(self.seed, 0, MAX_SEED):
            raise InvalidSamplingError(
                "seed", self.seed, f"None or an integer in [0, {MAX_SEED}] (a signed 64-bit seed)"
            )
        if any(t < 0 for t in self.stop_token_ids):
            raise InvalidSamplingError("stop_token_ids", self.stop_token_ids, "token ids >= 0")


def _not_int_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is anything but an integer (a bool is not one) in ``[low, high]``."""
    return isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high


@dataclass(frozen=True)
class Generation:
    """One engine result. Producer: an :class:`Engine`; consumer: the lifecycle (delta blob).

    ``token_ids`` are the generated ids exactly as sampled (a stop token included when
    ``finish_reason`` is ``"stop"``); ``logprobs[i]`` is the sampling log-probability of
    ``token_ids[i]``; both have the same length, at least 1. ``routes``, when the engine reports
    routed experts (an MoE model), is an integer tensor ``(R, layers, top_k)``: the experts each
    MoE layer's router chose for the last ``R`` tokens the engine ran, prompt then generation,
    in order; ``R`` covers at least the generated tokens (``docs/moe.md``). Else None.
    ``policy_version`` is the number of optimizer steps in the weights that sampled it (0: the
    initial weights); None when the engine does not know.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: FinishReason
    routes: torch.Tensor | None = None
    policy_version: int | None = None

    def __post_init__(self) -> None:
        if not self.token_ids:
            raise InvalidGenerationError("a generation has at least one token", self.token_ids)
        if len(self.logprobs) != len(self.token_ids):
            raise InvalidGenerationError(
                f"one logprob per token ({len(self.token_ids)} tokens)", len(self.logprobs)
            )
        if self.routes is not None:
            _check_routes(self.routes, len(self.token_ids))
        if self.finish_reason not in FINISH_REASONS:
            raise InvalidGenerationError(
                f"finish_reason is one of {sorted(FINISH_REASONS)}", self.finish_reason
            )
        if self.policy_version is not None and self.policy_version < 0:
            raise InvalidGenerationError(
                "policy_version is None or an integer >= 0", self.policy_version
            )

    def delta_routes(self, prompt_delta_len: int) -> torch.Tensor | None:
        """The routes of a call's delta: its last ``prompt_delta_len`` prompt tokens, then its
        generated tokens (``(P + G, layers, top_k)``, as the blob stores them); None without
        routes. Raises ``InvalidGenerationError`` when the engine reported fewer tokens."""
        if self.routes is None:
            return None
        wanted = prompt_delta_len + len(self.token_ids)
        if self.routes.shape[0] < wanted:
            raise InvalidGenerationError(
                f"routes for the call's {prompt_delta_len} new prompt tokens and "
                f"{len(self.token_ids)} generated tokens ({wanted} rows)",
                f"{self.routes.shape[0]} rows",
            )
        return self.routes[self.routes.shape[0] - wanted :]

    @property
    def content_token_ids(self) -> tuple[int, ...]:
        """The tokens of the returned text: all but the stop token that closed the turn (the chat
        template writes it back when the assistant message is rendered again)."""
        return self.token_ids[:-1] if self.finish_reason == "stop" else self.token_ids


def _check_routes(routes: object, generated: int) -> None:
    """Routes are an integer ``(R, layers, top_k)`` tensor with ``R >= generated``."""
    if not isinstance(routes, torch.Tensor):
        raise InvalidGenerationError("routes are a torch tensor", type(routes).__name__)
    dtype = routes.dtype
    if dtype.is_floating_point or dtype.is_complex or dtype == torch.bool:
        raise InvalidGenerationError("routes have an integer dtype", dtype)
    shape = tuple(routes.shape)
    if len(shape) != 3 or shape[0] < generated or 0 in shape[1:]:
        raise InvalidGenerationError(
            f"routes of shape (R, layers, top_k) with R >= {generated} (the generated tokens)",
            shape,
        )


@runtime_checkable
class Engine(Protocol):
    """Generates from exact prompt token ids; never truncates or re-tokenizes the prompt."""

    @property
    def name(self) -> str:
        """The engine's kind, as messages name it (``embedded``, ``vllm``)."""
        ...

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Raise the refusal ``generate`` would give (unsupported sampling, a prompt too long
        or outside the vocabulary), so the lifecycle refuses before recording the call."""
        ...

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        """Sample one generation after ``prompt_token_ids``."""
        ...
