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

from grove.ledger.events import SourceCall
from grove.storage import BlobRef, BlobStore

__all__ = ["chain_conversation", "chat_messages"]


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
