"""The Responses API on the wire: the subset Grove accepts and the response it answers.

Producer of the request: a harness (the official client, the OpenAI Agents SDK's Responses
model); consumer: ``capture/conversion.py``. The answer is built here from the ``CallOutcome``
(``response_object``); ``capture/streaming.py`` sends it as buffered server-sent events.

Output items follow the committed message (``capture/toolcalls.py``), in OpenAI's order: a
``reasoning`` item when the text held reasoning, a ``message`` item unless the model only called
tools, then one ``function_call`` item per tool call (its ``call_id`` is the tool call's id). Every
item's ``id`` is the call's response id: a client that sends the items back in its next ``input``
(as ``item.model_dump()`` does) names the call they came from, and normalization folds them into
one assistant message again (``docs/normalization.md``).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Final, Literal

from pydantic import Field

from grove.capture.lifecycle import CallOutcome
from grove.capture.wire import JSONObject, TokenLogprob, WireReply, WireRequest
from grove.ledger.bounds import MAX_COUNT

__all__ = [
    "LOGPROBS_INCLUDE",
    "FunctionCallItem",
    "OutputItem",
    "OutputMessage",
    "OutputText",
    "ReasoningItem",
    "ReasoningText",
    "ResponseObject",
    "ResponseUsage",
    "ResponsesRequest",
    "response_object",
]

LOGPROBS_INCLUDE: Final = "message.output_text.logprobs"
"""The one ``include`` value Grove provides: the sampled logprob of each output text token."""


class ResponsesRequest(WireRequest):
    """``POST /v1/responses``, the subset Grove serves.

    ``input`` is a string (one user message) or a list of Responses input items or chat
    messages; ``instructions`` becomes a leading system message. ``stream`` true answers with
    buffered server-sent events. ``include`` may name ``message.output_text.logprobs`` only;
    ``metadata`` and ``text`` are echoed, ``store`` ignored. ``text.format`` (``text``,
    ``json_object``, ``json_schema``) and a forced ``tool_choice`` are decoded under a grammar
    (``capture/constraints.py``). Refused: ``previous_response_id`` and
    ``conversation`` (provider-managed state: send the whole input), ``background``, and
    ``truncation="auto"`` (prompts are never truncated).
    """

    model: str
    input: str | list[JSONObject]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, le=MAX_COUNT)
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    conversation: str | JSONObject | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    tools: list[JSONObject] | None = None
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    text: JSONObject | None = None
    reasoning: JSONObject | None = None
    store: bool | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    top_logprobs: int | None = None


class ReasoningText(WireReply):
    """The reasoning the model wrote between its think tags, verbatim."""

    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class ReasoningItem(WireReply):
    """The reasoning output item (no summary: Grove does not summarize)."""

    type: Literal["reasoning"] = "reasoning"
    id: str
    summary: list[JSONObject] = Field(default_factory=list)
    content: list[ReasoningText]
    status: Literal["completed", "incomplete"] = "completed"


class OutputText(WireReply):
    """The text part of the output message; ``logprobs`` only when ``include`` asks for them."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[JSONObject] = Field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class OutputMessage(WireReply):
    """The assistant message output item, whose ``id`` is the call's response id."""

    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class FunctionCallItem(WireReply):
    """One tool call the model wrote; ``call_id`` pairs it with its ``function_call_output``."""

    type: Literal["function_call"] = "function_call"
    id: str
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed", "incomplete"] = "completed"


OutputItem = Annotated[
    ReasoningItem | OutputMessage | FunctionCallItem, Field(discriminator="type")
]


class ResponseUsage(WireReply):
    """Token counts in the Responses API's names."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})


class ResponseObject(WireReply):
    """``POST /v1/responses`` answer; ``id`` is the call's response id. ``status`` is
    ``incomplete`` (reason ``max_output_tokens``) when the generation hit its token limit."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputItem]
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[JSONObject] = Field(default_factory=list)
    tool_choice: str | JSONObject = "auto"
    parallel_tool_calls: bool = True
    text: JSONObject | None = None
    previous_response_id: None = None
    error: None = None
    incomplete_details: dict[str, str] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


def response_object(
    outcome: CallOutcome,
    model: str,
    request: ResponsesRequest,
    logprobs: Sequence[TokenLogprob] | None = None,
) -> ResponseObject:
    """The Response answering ``outcome`` (items in the module docstring's order, every id the
    response id); ``logprobs`` go on the output text when the request included them."""
    complete = outcome.generation.finish_reason == "stop"
    status: Literal["completed", "incomplete"] = "completed" if complete else "incomplete"
    completion = len(outcome.generation.token_ids)
    return ResponseObject(
        id=outcome.response_id,
        created_at=time.time(),
        status=status,
        model=model,
        output=_output_items(outcome.message, outcome.response_id, status, logprobs),
        usage=ResponseUsage(
            input_tokens=outcome.prompt_tokens,
            output_tokens=completion,
            total_tokens=outcome.prompt_tokens + completion,
        ),
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=request.tools or [],
        tool_choice=request.tool_choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls is not False,
        text=request.text,
        incomplete_details=None if complete else {"reason": "max_output_tokens"},
        metadata=request.metadata or {},
    )


def _output_items(
    message: Mapping[str, Any],
    response_id: str,
    status: Literal["completed", "incomplete"],
    logprobs: Sequence[TokenLogprob] | None,
) -> list[ReasoningItem | OutputMessage | FunctionCallItem]:
    items: list[ReasoningItem | OutputMessage | FunctionCallItem] = []
    reasoning = message.get("reasoning_content")
    if reasoning is not None:
        items.append(
            ReasoningItem(id=response_id, content=[ReasoningText(text=reasoning)], status=status)
        )
    content = message.get("content")
    if content is not None:
        text = OutputText(text=content, logprobs=None if logprobs is None else list(logprobs))
        items.append(OutputMessage(id=response_id, status=status, content=[text]))
    for call in message.get("tool_calls") or ():
        function = call["function"]
        items.append(
            FunctionCallItem(
                id=response_id,
                call_id=call["id"],
                name=function["name"],
                arguments=function["arguments"],
            )
        )
    return items
