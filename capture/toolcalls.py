"""Reasoning and tool calls in generated text: the model's markup parsed into message fields.

The chat template writes an assistant message as ``<think>REASONING</think>`` (when it has
reasoning), then its content, then one ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
per tool call (``capture/embedded.py``; Qwen-style templates write the same markup). A generation
in that markup is parsed back into the message a client expects (``docs/gateway.md``, "Tool calls
and reasoning"):

1. **Reasoning.** Text that starts with ``<think>`` and contains ``</think>`` has as reasoning the
   text between the two tags; the rest follows. Otherwise (no opening tag at the very start, or a
   generation cut before the closing tag) there is no reasoning.
2. **Tool calls** (only when the request offers tools). From the first ``<tool_call>`` on, the
   rest must be tool-call blocks and nothing else but whitespace between and after them; each
   block holds one JSON object with exactly the keys ``name`` (a non-empty string) and
   ``arguments`` (an object). The content is the text before the first block; content that is
   only whitespace is no content.
3. **Everything else is content, verbatim.** If any block does not parse (bad JSON, no name,
   arguments that are not an object, other text after a block), there are no tool calls and the
   whole rest is content: nothing the model wrote is dropped, except whitespace around blocks.

Parsing decides the message the client gets and the fingerprints the call is matched by later;
the ledger keeps the exact generated tokens. A continuation resumes from those tokens even where
the template renders the parsed message with other spacing or key order (``capture/splice.py``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "THINK_CLOSE",
    "THINK_OPEN",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ParsedOutput",
    "ToolCall",
    "assistant_message",
    "parse_output",
]

THINK_OPEN: Final = "<think>"
THINK_CLOSE: Final = "</think>"
TOOL_CALL_OPEN: Final = "<tool_call>"
TOOL_CALL_CLOSE: Final = "</tool_call>"
_CALL_KEYS: Final = frozenset({"name", "arguments"})


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call: the function's name and its arguments as JSON text.

    ``arguments`` is the canonical JSON of the arguments object (``json.dumps``, UTF-8 kept), the
    string OpenAI's wire format carries; it always parses to an object.
    """

    name: str
    arguments: str


@dataclass(frozen=True)
class ParsedOutput:
    """A generation's text split into message fields (producer: :func:`parse_output`).

    ``content`` is None only when there are tool calls and no other text; ``reasoning`` is None
    when the text has no complete ``<think>…</think>`` at its start ("" for an empty one).
    """

    content: str | None
    reasoning: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()


def parse_output(text: str, *, tool_calls: bool) -> ParsedOutput:
    """Parse generated ``text`` (stop token excluded) by the rules in the module docstring;
    ``tool_calls`` False (the request offers no tools) leaves tool-call markup as content."""
    reasoning = None
    rest = text
    if text.startswith(THINK_OPEN):
        end = text.find(THINK_CLOSE, len(THINK_OPEN))
        if end >= 0:
            reasoning = text[len(THINK_OPEN) : end]
            rest = text[end + len(THINK_CLOSE) :]
    start = rest.find(TOOL_CALL_OPEN) if tool_calls else -1
    calls = _tool_call_blocks(rest[start:]) if start >= 0 else None
    if not calls:
        return ParsedOutput(content=rest, reasoning=reasoning)
    content = rest[:start]
    return ParsedOutput(
        content=content if content.strip() else None, reasoning=reasoning, tool_calls=calls
    )


def assistant_message(parsed: ParsedOutput, call_ids: Sequence[str]) -> dict[str, Any]:
    """The Chat Completions assistant message for ``parsed``, its tool calls named ``call_ids``
    (one per call): ``content`` (None with tool calls only), ``reasoning_content`` when there is
    reasoning, ``tool_calls`` when there are calls."""
    if len(call_ids) != len(parsed.tool_calls):
        raise ValueError(
            f"one call id per tool call: {len(parsed.tool_calls)} calls, {len(call_ids)} ids"
        )
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call, call_id in zip(parsed.tool_calls, call_ids, strict=True)
        ]
    return message


def _tool_call_blocks(text: str) -> tuple[ToolCall, ...] | None:
    """The tool calls of ``text`` (which starts with an opening tag) when it is nothing but
    well-formed blocks and whitespace; None otherwise."""
    calls = []
    position = 0
    while position < len(text):
        if not text.startswith(TOOL_CALL_OPEN, position):
            return None
        end = text.find(TOOL_CALL_CLOSE, position)
        if end < 0:
            return None
        call = _tool_call(text[position + len(TOOL_CALL_OPEN) : end])
        if call is None:
            return None
        calls.append(call)
        position = end + len(TOOL_CALL_CLOSE)
        while position < len(text) and text[position].isspace():
            position += 1
    return tuple(calls)


def _tool_call(body: str) -> ToolCall | None:
    try:
        value = json.loads(body, parse_constant=_no_constant)
    except ValueError:
        return None
    if not isinstance(value, Mapping) or value.keys() != _CALL_KEYS:
        return None
    name, arguments = value["name"], value["arguments"]
    if not isinstance(name, str) or not name or not isinstance(arguments, Mapping):
        return None
    return ToolCall(name=name, arguments=json.dumps(arguments, ensure_ascii=False))


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python's extension, not JSON
