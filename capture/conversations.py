"""A recorded call's conversation, rebuilt from the blobs of its chain (``docs/fork.md``, "The
conversation").

Each call's blob records the conversation items the call adds to its context, as its tokens do:
its request's items after its parent's conversation (a root: all of them), then its own answer,
as normalized Chat messages (``docs/normalization.md``). A call's whole conversation is the
concatenation along its chain, root first; a fork's chain crosses into its source attempt, so
the conversation does too. The items are normalized, so a tool call's arguments are a JSON
object; ``chat_messages`` writes them back as the JSON string Chat Completions sends, so the
conversation can be sent again as it is.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from grove.capture.errors import NormalizationError
from grove.capture.messages_api import TOOL_ERROR_PREFIX, MessagesRequest, messages_items
from grove.capture.refusals import Refused
from grove.capture.render import normalize_messages
from grove.ledger.events import SourceCall
from grove.storage import BlobRef, BlobStore

__all__ = [
    "chain_conversation",
    "chat_messages",
    "messages_conversation",
    "responses_input",
]


def chain_conversation(
    blobs: BlobStore, chain: Sequence[SourceCall]
) -> tuple[dict[str, Any], ...] | None:
    """The normalized conversation through the last call of ``chain`` (root first), its answer
    included, read from the chain's blobs (digests verified); None when a blob of the chain was
    written before Grove recorded conversations."""
    items: list[dict[str, Any]] = []
    for call in chain:
        delta = blobs.get_delta(BlobRef(call.blob_key, call.blob_sha256, call.blob_bytes))
        if delta.messages is None:
            return None
        items.extend(delta.messages)
    return tuple(items)


def chat_messages(normalized: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Normalized messages as Chat Completions messages: each tool call's arguments as the JSON
    string a client sends (normalization parsed them)."""
    return [_chat_message(message) for message in normalized]


def _chat_message(message: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(message)
    calls = message.get("tool_calls")
    if isinstance(calls, list):
        out["tool_calls"] = [_chat_tool_call(call) for call in calls]
    return out


def _chat_tool_call(call: Mapping[str, Any]) -> dict[str, Any]:
    function = call.get("function")
    if not isinstance(function, Mapping) or isinstance(function.get("arguments"), str):
        return dict(call)
    arguments = json.dumps(function.get("arguments", {}), ensure_ascii=False)
    return {**call, "function": {**function, "arguments": arguments}}


def responses_input(normalized: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]] | None:
    """Normalized messages as Responses input items; None when they have no exact such form."""
    items: list[dict[str, Any]] = []
    for message in chat_messages(normalized):
        role = message["role"]
        if role == "tool":
            output = {"type": "function_call_output", "output": message.get("content", "")}
            if "tool_call_id" in message:
                output["call_id"] = message["tool_call_id"]
            items.append(output)
        elif role != "assistant":
            items.append(message)
        else:
            items.extend(_responses_output(message))
    return items if _normalizes_to(items, normalized) else None


def _responses_output(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """An assistant message as the output items it was, in order: reasoning, text, calls."""
    items: list[dict[str, Any]] = []
    if "reasoning_content" in message:
        text = message["reasoning_content"]
        items.append({"type": "reasoning", "summary": [], "content": [_text("reasoning", text)]})
    if "content" in message:
        content = message["content"]
        parts = [_text("output", content)] if isinstance(content, str) else content
        items.append({"type": "message", "role": "assistant", "content": parts})
    for call in message.get("tool_calls") or []:
        item = {"type": "function_call", **call["function"]}
        if "id" in call:
            item["call_id"] = call["id"]
        items.append(item)
    return items


def _text(kind: str, text: str) -> dict[str, Any]:
    return {"type": f"{kind}_text", "text": text}


def messages_conversation(normalized: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Normalized messages as a Messages API conversation, ``{"system": ..., "messages":
    [...]}``: None when they have no exact such form."""
    system = [m for m in normalized[:1] if m["role"] == "system"]
    turns: list[dict[str, Any]] = []
    for message in normalized[len(system) :]:
        role = "user" if message["role"] == "tool" else message["role"]
        blocks = _blocks(message)
        if role not in ("user", "assistant") or blocks is None:
            return None
        if turns and turns[-1]["role"] == role == "user":
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})
    conversation = {"system": system[0].get("content") if system else None, "messages": turns}
    try:
        request = MessagesRequest.model_validate({"model": "-", "max_tokens": 1, **conversation})
        again = messages_items(request) if turns else list(system)
    except (Refused, ValueError):
        return None
    return conversation if _normalizes_to(again, normalized) else None


def _blocks(message: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A message's content blocks: a tool result, text, or thinking, text and tool uses."""
    content = message.get("content", "")
    if not isinstance(content, str):
        return None
    if message["role"] == "tool":
        result = {"type": "tool_result", "tool_use_id": message.get("tool_call_id")}
        if content.startswith(TOOL_ERROR_PREFIX):
            return [
                {**result, "content": content.removeprefix(TOOL_ERROR_PREFIX), "is_error": True}
            ]
        return [{**result, "content": content}]
    blocks: list[dict[str, Any]] = []
    if "reasoning_content" in message:
        blocks.append({"type": "thinking", "thinking": message["reasoning_content"]})
    if content or not message.get("tool_calls"):
        blocks.append({"type": "text", "text": content})
    for call in message.get("tool_calls") or []:
        function = call["function"]
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function["name"],
                "input": function.get("arguments"),
            }
        )
    return blocks


def _normalizes_to(
    items: Sequence[Mapping[str, Any]], normalized: Sequence[Mapping[str, Any]]
) -> bool:
    """Whether ``items`` normalize to exactly ``normalized``."""
    try:
        return list(normalize_messages(items).messages) == [dict(m) for m in normalized]
    except NormalizationError:
        return False
