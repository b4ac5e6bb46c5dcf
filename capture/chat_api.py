"""Chat Completions on the wire: the request Grove accepts and the completion it answers.

Producer of the request: a harness (any OpenAI-compatible client); consumer:
``capture/conversion.py``, which turns it into a ``grove.capture.lifecycle.ModelCall``. The answer
is built here from the ``CallOutcome`` (``chat_completion``); ``capture/streaming.py`` sends the
same answer as buffered chunks. Unknown request fields are refused, not ignored
(``docs/gateway.md``).

The answer's message is the committed output (``capture/toolcalls.py``): ``content`` (null when
the model only called tools), ``reasoning_content`` when the text held reasoning, and
``tool_calls`` with Grove's ids; ``finish_reason`` is ``tool_calls`` after tool calls. The
``id`` is the call's response id.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from grove.capture.lifecycle import CallOutcome
from grove.capture.wire import JSONObject, TokenLogprob, WireReply, WireRequest
from grove.ledger.bounds import MAX_COUNT, Seed

__all__ = [
    "ChatCompletion",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChoiceLogprobs",
    "CompletionChoice",
    "CompletionFunction",
    "CompletionMessage",
    "CompletionToolCall",
    "CompletionUsage",
    "FinishReason",
    "chat_completion",
]

FinishReason = Literal["stop", "length", "tool_calls"]


class ChatMessage(BaseModel):
    """One Chat Completions message; fields beyond these pass through to normalization."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[JSONObject] | None = None


class ChatCompletionRequest(WireRequest):
    """``POST /v1/chat/completions``. ``max_tokens`` and ``max_completion_tokens`` are synonyms.

    Sampling bounds are checked by ``grove.capture.engine.SamplingParams`` (one place; the
    integer ranges any engine and the ledger hold are also declared here, so that the OpenAPI
    schema states them: ``docs/gateway.md``, "Field ranges"); ``stop``
    strings must each be one token of the model's vocabulary; ``n`` must be 1 and
    ``top_logprobs`` 0 or absent (the engine reports the sampled token's logprob only);
    ``stream`` true answers with buffered chunks. ``tool_choice`` is ``auto``, ``none``,
    ``required`` or a named function; ``response_format`` is ``text``, ``json_object`` or
    ``json_schema`` (both forced calls and formats are decoded under a grammar:
    ``capture/constraints.py``). ``user``, ``metadata`` and ``store`` are accepted and ignored
    (Grove stores nothing on the provider side: the ledger is the record).
    """

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, le=MAX_COUNT)
    max_completion_tokens: int | None = Field(default=None, le=MAX_COUNT)
    temperature: float | None = None
    top_p: float | None = None
    seed: Seed | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: JSONObject | None = None
    tools: list[JSONObject] | None = None
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    response_format: JSONObject | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    reasoning_effort: str | None = None
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None


class CompletionFunction(WireReply):
    """The function a tool call names, with its arguments as JSON text (an object)."""

    name: str
    arguments: str


class CompletionToolCall(WireReply):
    """One tool call of the answer; ``id`` is Grove's (``call_…``), echoed back by the client."""

    id: str
    type: Literal["function"] = "function"
    function: CompletionFunction


class CompletionMessage(WireReply):
    """The assistant message of a completion, parsed from the generated text (stop token
    excluded): ``content`` None when the model only called tools."""

    role: Literal["assistant"] = "assistant"
    content: str | None
    reasoning_content: str | None = None
    tool_calls: list[CompletionToolCall] | None = None


class ChoiceLogprobs(WireReply):
    """Logprobs of the content tokens, in order (the stop token is not content)."""

    content: list[TokenLogprob]


class CompletionChoice(WireReply):
    """The one choice of a completion (``n`` is always 1)."""

    index: int = 0
    message: CompletionMessage
    finish_reason: FinishReason
    logprobs: ChoiceLogprobs | None = None


class CompletionUsage(WireReply):
    """Token counts: the planned prompt (spliced or rendered) and the generated tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(WireReply):
    """``POST /v1/chat/completions`` answer; ``id`` is the call's response id."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


def chat_completion(
    outcome: CallOutcome, model: str, logprobs: Sequence[TokenLogprob] | None
) -> ChatCompletion:
    """The ChatCompletion answering ``outcome``; ``logprobs`` when the client asked for them."""
    completion = len(outcome.generation.token_ids)
    message: dict[str, Any] = outcome.message
    return ChatCompletion(
        id=outcome.response_id,
        created=int(time.time()),
        model=model,
        choices=[
            CompletionChoice(
                message=CompletionMessage.model_validate(message),
                finish_reason=outcome.finish_reason,  # type: ignore[arg-type]
                logprobs=None if logprobs is None else ChoiceLogprobs(content=list(logprobs)),
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=completion,
            total_tokens=outcome.prompt_tokens + completion,
        ),
    )
