"""The Anthropic Messages API on the wire: the subset Grove accepts and the Message it answers.

Producer of the request: a harness on the official ``anthropic`` client (``base_url`` the
gateway's root); consumer: ``capture/conversion.py`` (``RequestConverter.messages_call``), which
takes the items and tools made here. The answer is built here from the ``CallOutcome``
(``message_object``); ``message_events`` cuts it into the stream events the client's
``messages.stream(...)`` reads. ``docs/gateway.md`` ("Messages API") states the rules.

Blocks map onto Chat Completions messages, so a Messages call normalizes, renders, digests and
admits exactly as a Chat call does (``docs/normalization.md``) and the APIs mix in one attempt:

- ``system`` (a string or text blocks) is a leading system message;
- a user turn's text blocks are one user message; each ``tool_result`` block is a tool message
  (``tool_call_id`` its ``tool_use_id``; its content a string or text blocks; ``is_error`` true
  writes :data:`TOOL_ERROR_PREFIX` before the text, the only way a chat template can show it);
- an assistant turn is one assistant message: ``thinking`` blocks its ``reasoning_content``,
  text blocks its ``content``, ``tool_use`` blocks its ``tool_calls`` (``id``, ``name``, the
  ``input`` as arguments). The Message Grove answers maps back to the same message, so a client
  that sends ``message.content`` back continues the call from its exact tokens.

Refused (400, nothing written): images, documents, citations, prompt caching
(``cache_control``), server tools, ``redacted_thinking``, a block type or block field Grove does
not know, and a block in a turn whose role cannot hold it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import Field

from grove.capture.lifecycle import CallOutcome
from grove.capture.refusals import Refused
from grove.capture.wire import JSONObject, WireReply, WireRequest
from grove.ledger.bounds import MAX_COUNT

__all__ = [
    "TOOL_ERROR_PREFIX",
    "AnthropicMessage",
    "MessagesRequest",
    "MessagesUsage",
    "StopReason",
    "message_events",
    "message_object",
    "messages_items",
    "messages_sse",
    "messages_tool_choice",
    "messages_tools",
    "returned_turns",
]

TOOL_ERROR_PREFIX: Final = "Error: "
"""Written before the text of a ``tool_result`` with ``is_error`` true."""

StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]

_BLOCK_KEYS: Final[dict[str, frozenset[str]]] = {
    "text": frozenset({"type", "text"}),
    "thinking": frozenset({"type", "thinking", "signature"}),
    "tool_use": frozenset({"type", "id", "name", "input"}),
    "tool_result": frozenset({"type", "tool_use_id", "content", "is_error"}),
}
_ROLE_BLOCKS: Final = {
    "user": frozenset({"text", "tool_result"}),
    "assistant": frozenset({"text", "thinking", "tool_use"}),
}
_MESSAGES_ONLY_BLOCKS: Final = frozenset({"thinking", "tool_use", "tool_result"})
"""Block types of the Messages API that no Chat or Responses content part has."""
_REFUSED_BLOCKS: Final = {
    "image": "images are not served on /v1/messages; send them through /v1/chat/completions",
    "document": "documents are not supported: send their text as text blocks",
    "search_result": "search results are not supported: send their text as text blocks",
    "redacted_thinking": "Grove never redacts thinking, so a redacted block is not one it wrote",
    "server_tool_use": "Grove runs no server tools: the model writes tool_use, the harness runs it",
    "web_search_tool_result": "Grove runs no server tools",
}


class MessagesRequest(WireRequest):
    """``POST /v1/messages``, the subset Grove serves.

    ``max_tokens`` is required, as in Anthropic's API. ``stop_sequences`` must each be one token
    of the model's vocabulary. ``top_k`` 0 or absent samples from the whole vocabulary.
    ``thinking`` is ``{"type": "enabled", "budget_tokens": N}`` (N below ``max_tokens``: the
    whole generation, thinking included, is bounded by ``max_tokens``) or ``{"type":
    "disabled"}``; enabled needs a chat template with an ``enable_thinking`` switch. ``metadata``
    (``user_id``) is accepted and ignored (the ledger is the record).
    """

    model: str
    messages: list[JSONObject] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=MAX_COUNT)
    system: str | list[JSONObject] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, ge=0, le=MAX_COUNT)
    metadata: dict[str, str | None] | None = None
    tools: list[JSONObject] | None = None
    tool_choice: JSONObject | None = None
    thinking: JSONObject | None = None
    stream: bool | None = None


class MessagesUsage(WireReply):
    """Token counts in the Messages API's names (no prompt cache: its counts are 0)."""

    input_tokens: int
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class AnthropicMessage(WireReply):
    """``POST /v1/messages`` answer; ``id`` is the call's response id."""

    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[JSONObject]
    stop_reason: StopReason
    stop_sequence: str | None = None
    usage: MessagesUsage


def messages_items(request: MessagesRequest) -> list[dict[str, Any]]:
    """The request's system prompt and turns as Chat Completions messages (module docstring)."""
    items: list[dict[str, Any]] = []
    if request.system is not None:
        items.append({"role": "system", "content": _system_text(request.system)})
    for index, turn in enumerate(request.messages):
        role = turn.get("role")
        if role not in _ROLE_BLOCKS or set(turn) - {"role", "content"}:
            raise _invalid(
                f"messages[{index}]", "must be {'role': 'user' | 'assistant', 'content': ...}"
            )
        items.extend(_turn_items(f"messages[{index}]", role, turn.get("content")))
    return items


def returned_turns(items: Sequence[Any]) -> list[Any]:
    """A harness's returned history with its Messages turns as the Chat messages they map to,
    so that selection matches them to their calls as it matches Chat messages.

    A turn is in Messages form when it has a ``user`` or ``assistant`` role and its content
    holds a ``thinking``, ``tool_use`` or ``tool_result`` block (types no Chat or Responses
    part has). An assistant turn keeps its ``response_id`` and its ``id`` (a whole Message
    sent back: its id is the call's response id), so a turn names its call either way. Other
    items, and turns the Messages rules refuse, are left as they are, for the policy to judge.
    """
    converted: list[Any] = []
    for item in items:
        content = item.get("content") if isinstance(item, Mapping) else None
        role = item.get("role") if isinstance(item, Mapping) else None
        if role not in _ROLE_BLOCKS or not _holds_messages_blocks(content):
            converted.append(item)
            continue
        try:
            turn = _turn_items("output", role, content)
        except Refused:
            converted.append(item)
            continue
        if role == "assistant":
            names = {key: item[key] for key in ("id", "response_id") if key in item}
            turn = [{**message, **names} for message in turn]
        converted.extend(turn)
    return converted


def _holds_messages_blocks(content: Any) -> bool:
    return isinstance(content, list) and any(
        isinstance(block, Mapping) and block.get("type") in _MESSAGES_ONLY_BLOCKS
        for block in content
    )


def _turn_items(where: str, role: str, content: Any) -> list[dict[str, Any]]:
    """One turn's content (a string or blocks) as Chat messages (module docstring)."""
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise _invalid(f"{where}.content", "must be a string or a list of blocks")
    blocks = [_block(f"{where}.content[{n}]", block) for n, block in enumerate(content)]
    for n, block in enumerate(blocks):
        if block["type"] not in _ROLE_BLOCKS[role]:
            raise _invalid(
                f"{where}.content[{n}]", f"a {block['type']} block cannot be in a {role} turn"
            )
    return _user_items(blocks) if role == "user" else [_assistant_item(blocks)]


def messages_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Messages tools as Chat Completions function tools (``input_schema`` the parameters);
    server tools (a ``type`` other than ``custom``) and ``cache_control`` are refused."""
    if tools is None:
        return None
    converted = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if tool.get("type", "custom") != "custom":
            raise Refused(
                400,
                "unsupported_tool",
                f"{where} has type {tool.get('type')!r}: Grove serves client tools only (the "
                "model writes the call, the harness runs it); server tools are not available",
                "tools",
            )
        extra = set(tool) - {"type", "name", "description", "input_schema"}
        if extra:
            raise _unsupported_field(where, sorted(extra)[0])
        function = {k: tool.get(k) for k in ("name", "description")}
        function["parameters"] = tool.get("input_schema")
        converted.append({"type": "function", "function": function})
    return converted


def messages_tool_choice(choice: Mapping[str, Any] | None) -> tuple[Any, bool | None]:
    """The Chat Completions ``tool_choice`` and ``parallel_tool_calls`` of a Messages
    ``tool_choice``: ``auto`` is auto, ``any`` required, ``tool`` the named function, ``none``
    none; ``disable_parallel_tool_use`` true allows one call."""
    if choice is None:
        return None, None
    kind = choice.get("type")
    allowed = {"type", "disable_parallel_tool_use"} | ({"name"} if kind == "tool" else set())
    if set(choice) - allowed:
        raise _unsupported_field("tool_choice", sorted(set(choice) - allowed)[0])
    parallel = None if not choice.get("disable_parallel_tool_use") else False
    if kind in ("auto", "none"):
        return kind, parallel
    if kind == "any":
        return "required", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise _invalid("tool_choice", "type must be auto, any, none or tool (with a name)")


def message_object(
    outcome: CallOutcome, model: str, stop_sequences: Mapping[int, str]
) -> AnthropicMessage:
    """The Message answering ``outcome``: its blocks (thinking, text, tool_use), the stop
    reason (a stop sequence when the last token is one of ``stop_sequences``, by token id)."""
    message = outcome.message
    content: list[JSONObject] = []
    if message.get("reasoning_content") is not None:
        thinking = message["reasoning_content"]
        content.append({"type": "thinking", "thinking": thinking, "signature": ""})
    calls = message.get("tool_calls") or ()
    if message.get("content") or not calls:
        content.append({"type": "text", "text": message.get("content") or ""})
    for call in calls:
        function = call["function"]
        arguments = json.loads(function["arguments"])
        content.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}
        )
    reason, stop = _stop_reason(outcome, stop_sequences)
    usage = MessagesUsage(
        input_tokens=outcome.prompt_tokens, output_tokens=len(outcome.generation.token_ids)
    )
    return AnthropicMessage(
        id=outcome.response_id,
        model=model,
        content=content,
        stop_reason=reason,
        usage=usage,
        stop_sequence=stop,
    )


def _stop_reason(
    outcome: CallOutcome, stop_sequences: Mapping[int, str]
) -> tuple[StopReason, str | None]:
    """Why the generation stopped, and the stop sequence that stopped it (None: none did)."""
    last = outcome.generation.token_ids[-1]
    if outcome.finish_reason == "tool_calls":
        return "tool_use", None
    if outcome.finish_reason == "length":
        return "max_tokens", None
    if last in stop_sequences:
        return "stop_sequence", stop_sequences[last]
    return "end_turn", None


def message_events(message: AnthropicMessage) -> list[JSONObject]:
    """The Messages stream events of a finished Message, in order: ``message_start`` (no content,
    no stop reason), per block ``content_block_start``, one delta (``thinking_delta`` and a
    ``signature_delta``, ``text_delta``, or ``input_json_delta`` with the whole input) and
    ``content_block_stop``, then ``message_delta`` (stop reason, output tokens) and
    ``message_stop``."""
    started = message.model_dump()
    started.update(content=[], stop_reason=None, stop_sequence=None)
    started["usage"] = {**started["usage"], "output_tokens": 0}
    events: list[JSONObject] = [{"type": "message_start", "message": started}]
    for index, block in enumerate(message.content):
        if block["type"] == "thinking":
            opened = {**block, "thinking": "", "signature": ""}
            deltas = [
                {"type": "thinking_delta", "thinking": block["thinking"]},
                {"type": "signature_delta", "signature": block["signature"]},
            ]
        elif block["type"] == "text":
            opened = {**block, "text": ""}
            deltas = [{"type": "text_delta", "text": block["text"]}]
        else:
            opened = {**block, "input": {}}
            partial = json.dumps(block["input"], ensure_ascii=False)
            deltas = [{"type": "input_json_delta", "partial_json": partial}]
        events.append({"type": "content_block_start", "index": index, "content_block": opened})
        events += [{"type": "content_block_delta", "index": index, "delta": d} for d in deltas]
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": message.stop_reason, "stop_sequence": message.stop_sequence},
            "usage": {"output_tokens": message.usage.output_tokens},
        }
    )
    events.append({"type": "message_stop"})
    return events


def messages_sse(message: AnthropicMessage) -> Iterator[str]:
    """The Message's events as server-sent ``event:`` and ``data:`` lines."""
    for event in message_events(message):
        data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
        yield f"event: {event['type']}\ndata: {data}\n\n"


def _system_text(system: str | list[JSONObject]) -> str:
    if isinstance(system, str):
        return system
    blocks = [_block(f"system[{n}]", block) for n, block in enumerate(system)]
    for n, block in enumerate(blocks):
        if block["type"] != "text":
            raise _invalid(f"system[{n}]", "the system prompt holds text blocks only")
    return "".join(block["text"] for block in blocks)


def _block(where: str, block: Any) -> dict[str, Any]:
    """A content block, checked: a known type with known fields (``None`` values dropped)."""
    if not isinstance(block, Mapping) or not isinstance(block.get("type"), str):
        raise _invalid(where, "a content block must be an object with a type")
    kind = block["type"]
    if kind in _REFUSED_BLOCKS:
        raise Refused(400, "unsupported_content", f"{where}: {_REFUSED_BLOCKS[kind]}", where)
    if kind not in _BLOCK_KEYS:
        raise _invalid(where, f"block type {kind!r} is not one Grove serves")
    fields = {k: v for k, v in block.items() if v is not None and v != []}
    extra = set(fields) - _BLOCK_KEYS[kind]
    if extra:
        raise _unsupported_field(where, sorted(extra)[0])
    if kind == "text" and not isinstance(fields.get("text"), str):
        raise _invalid(where, "a text block's text must be a string")
    return fields


def _user_items(blocks: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A user turn's blocks: a tool message per tool result, consecutive text blocks joined."""
    items: list[dict[str, Any]] = []
    for block in blocks:
        if block["type"] == "tool_result":
            text = _result_text(block)
            items.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        elif items and items[-1]["role"] == "user":
            items[-1]["content"] += block["text"]
        else:
            items.append({"role": "user", "content": block["text"]})
    return items


def _result_text(block: Mapping[str, Any]) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        parts = [_block(f"tool_result {block.get('tool_use_id')!r}", part) for part in content]
        if any(part["type"] != "text" for part in parts):
            raise _invalid("tool_result.content", "a tool result holds a string or text blocks")
        content = "".join(part["text"] for part in parts)
    if not isinstance(content, str):
        raise _invalid("tool_result.content", "a tool result holds a string or text blocks")
    return TOOL_ERROR_PREFIX + content if block.get("is_error") else content


def _assistant_item(blocks: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """An assistant turn as one assistant message (reasoning, content, tool calls)."""
    message: dict[str, Any] = {"role": "assistant"}
    thinking = [b["thinking"] for b in blocks if b["type"] == "thinking"]
    text = [b["text"] for b in blocks if b["type"] == "text"]
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input", {}))},
        }
        for b in blocks
        if b["type"] == "tool_use"
    ]
    if thinking:
        message["reasoning_content"] = "".join(thinking)
    if "".join(text) or not calls:
        message["content"] = "".join(text)
    if calls:
        message["tool_calls"] = calls
    return message


def _invalid(where: str, rule: str) -> Refused:
    return Refused(
        400, "invalid_request", f"{where}: {rule} (see docs/gateway.md, Messages API)", where
    )


def _unsupported_field(where: str, field: str) -> Refused:
    reason = (
        "prompt caching is not supported: Grove renders and records every prompt whole"
        if field == "cache_control"
        else "Grove does not accept this field"
    )
    return Refused(
        400, "unsupported_field", f"{where}.{field}: {reason} (see docs/gateway.md)", where
    )
