"""Buffered streaming: a finished answer sent as server-sent events in OpenAI's order.

Grove captures each call whole (generate, store, commit) before it answers, so a streamed answer
is the same answer cut into the events a streaming client expects: each piece of text arrives in
one delta. Both sequences are what the official ``openai`` client's stream iteration and its
accumulating helpers (``chat.completions.stream``, ``responses.stream``) read.

- Chat Completions (``chat_chunks``): a chunk with the role, then one delta each for the
  reasoning (``reasoning_content``), the content (with the logprobs, when asked) and every tool
  call (index, id, name and whole arguments), then a chunk with the finish reason; with
  ``stream_options.include_usage`` every chunk carries ``usage: null`` and a last chunk with no
  choices carries the usage. The stream ends with ``data: [DONE]``.
- Responses (``response_events``): created, in_progress, then per output item
  output_item.added, its deltas and their done events, output_item.done, and completed. The last
  event is ``response.completed`` even for an incomplete response (OpenAI sends
  ``response.incomplete`` there, which the client's ``responses.stream`` helper does not accept as
  an end).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from grove.capture.chat_api import ChatCompletion
from grove.capture.responses_api import (
    FunctionCallItem,
    OutputMessage,
    ReasoningItem,
    ResponseObject,
)

__all__ = ["DONE", "chat_chunks", "chat_sse", "response_events", "responses_sse"]

DONE = "data: [DONE]\n\n"
"""The line that ends a Chat Completions stream."""

JSONObject = dict[str, Any]


def chat_chunks(completion: ChatCompletion, *, include_usage: bool) -> list[JSONObject]:
    """The ``chat.completion.chunk`` objects of a finished completion, in order."""
    choice = completion.choices[0]
    message = choice.message
    base: JSONObject = {
        "id": completion.id,
        "object": "chat.completion.chunk",
        "created": completion.created,
        "model": completion.model,
    }
    if include_usage:
        base["usage"] = None

    def chunk(delta: JSONObject, finish: str | None = None, logprobs: Any = None) -> JSONObject:
        entry = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        return {**base, "choices": [entry]}

    logprobs = None if choice.logprobs is None else choice.logprobs.model_dump()
    chunks = [chunk({"role": "assistant", "content": ""})]
    if message.reasoning_content is not None:
        chunks.append(chunk({"reasoning_content": message.reasoning_content}))
    if message.content or logprobs is not None:
        chunks.append(chunk({"content": message.content or ""}, logprobs=logprobs))
    for index, call in enumerate(message.tool_calls or ()):
        chunks.append(chunk({"tool_calls": [{"index": index, **call.model_dump()}]}))
    chunks.append(chunk({}, finish=choice.finish_reason))
    if include_usage:
        chunks.append({**base, "choices": [], "usage": completion.usage.model_dump()})
    return chunks


def chat_sse(completion: ChatCompletion, *, include_usage: bool) -> Iterator[str]:
    """The completion as server-sent ``data:`` lines, ending with ``[DONE]``."""
    for chunk in chat_chunks(completion, include_usage=include_usage):
        yield f"data: {_json(chunk)}\n\n"
    yield DONE


def response_events(response: ResponseObject) -> list[JSONObject]:
    """The standard Responses stream events for a finished response, in order, numbered."""
    started = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    events: list[JSONObject] = [
        {"type": "response.created", "response": started.model_dump()},
        {"type": "response.in_progress", "response": started.model_dump()},
    ]
    for index, item in enumerate(response.output):
        events.extend(_item_events(index, item))
    events.append({"type": "response.completed", "response": response.model_dump()})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def responses_sse(response: ResponseObject) -> Iterator[str]:
    """The response's events as server-sent ``event:`` and ``data:`` lines."""
    for event in response_events(response):
        yield f"event: {event['type']}\ndata: {_json(event)}\n\n"


def _item_events(
    index: int, item: ReasoningItem | OutputMessage | FunctionCallItem
) -> list[JSONObject]:
    """Added, the item's deltas and done events, and done, for the output item at ``index``."""
    where = {"item_id": item.id, "output_index": index}
    at = {**where, "content_index": 0}
    events: list[JSONObject] = []
    if isinstance(item, FunctionCallItem):
        opened = item.model_copy(update={"status": "in_progress", "arguments": ""})
        events = [
            {"type": "response.output_item.added", "output_index": index, "item": opened},
            {"type": "response.function_call_arguments.delta", **where, "delta": item.arguments},
            {"type": "response.function_call_arguments.done", **where, "arguments": item.arguments},
        ]
    elif isinstance(item, ReasoningItem):
        text = item.content[0].text
        events = [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": item.model_copy(update={"content": []}),
            },
            {"type": "response.reasoning_text.delta", **at, "delta": text},
            {"type": "response.reasoning_text.done", **at, "text": text},
        ]
    else:
        part = item.content[0]
        logprobs = [entry.model_dump() for entry in part.logprobs or ()]
        events = [
            {
                "type": "response.output_item.added",
                "output_index": index,
                "item": item.model_copy(update={"status": "in_progress", "content": []}),
            },
            {
                "type": "response.content_part.added",
                **at,
                "part": part.model_copy(update={"text": "", "logprobs": None}),
            },
            {"type": "response.output_text.delta", **at, "delta": part.text, "logprobs": logprobs},
            {"type": "response.output_text.done", **at, "text": part.text, "logprobs": logprobs},
            {"type": "response.content_part.done", **at, "part": part},
        ]
    events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return [_dumped(event) for event in events]


def _dumped(event: Mapping[str, Any]) -> JSONObject:
    return {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in event.items()}


def _json(value: Sequence[Any] | Mapping[str, Any]) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
