"""Parsing reasoning and tool calls out of generated text (capture/toolcalls.py).

Round trips render a message with the embedded ChatML template, take the assistant's text as the
model would have generated it, and parse it back: the parsed message normalizes to the original.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from grove.capture.render import Renderer, RenderOptions, normalize_messages
from grove.capture.toolcalls import ParsedOutput, ToolCall, assistant_message, parse_output

USER = {"role": "user", "content": "What is the weather in Paris?"}
SEARCH = {"name": "search", "arguments": {"query": "weather in Paris", "limit": 3}}
ADD = {"name": "add", "arguments": {"a": 1, "b": 2}}


def call(function: dict[str, Any], call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": function["name"], "arguments": json.dumps(function["arguments"])},
    }


def generated_text(renderer: Renderer, message: dict[str, Any]) -> str:
    """The assistant turn's text as the template renders it (what a model trained on it writes)."""
    options = RenderOptions(model="m")
    before = renderer.render(normalize_messages([USER]).messages, options)
    full = renderer.render(
        normalize_messages([USER, message]).messages, options, add_generation_prompt=False
    )
    assert full.startswith(before)
    return full[len(before) :].removesuffix("<|im_end|>\n")


def round_trip(renderer: Renderer, message: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_output(generated_text(renderer, message), tool_calls=True)
    ids = [c["id"] for c in message.get("tool_calls", ())]
    return assistant_message(parsed, ids)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": None, "tool_calls": [call(SEARCH, "c1")]},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [call(SEARCH, "c1")]},
        {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Check first."},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Two lookups.",
            "tool_calls": [call(SEARCH, "c1"), call(ADD, "c2")],
        },
        {
            "role": "assistant",
            "content": "Both: ",
            "reasoning_content": "",
            "tool_calls": [call(ADD, "c1"), call(SEARCH, "c2"), call(ADD, "c3")],
        },
    ],
    ids=["call", "content_and_call", "reasoning", "reasoning_and_two_calls", "three_calls"],
)
def test_a_rendered_message_parses_back_to_itself(renderer: Renderer, message: dict[str, Any]):
    parsed = round_trip(renderer, message)
    assert normalize_messages([parsed]).messages == normalize_messages([message]).messages


def test_tool_calls_in_any_key_order_and_spacing_parse():
    text = '<tool_call>\n{"name": "add", "arguments": {"b": 2, "a": 1}}\n</tool_call>\n'
    assert parse_output(text, tool_calls=True) == ParsedOutput(
        content=None, tool_calls=(ToolCall("add", '{"b": 2, "a": 1}'),)
    )


def test_whitespace_between_and_after_blocks_is_not_content():
    text = 'Sure.\n<tool_call>{"name": "a", "arguments": {}}</tool_call>\n\n'
    text += '<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    parsed = parse_output(text, tool_calls=True)
    assert parsed.content == "Sure.\n"
    assert [c.name for c in parsed.tool_calls] == ["a", "b"]


@pytest.mark.parametrize(
    "tail",
    [
        '<tool_call>{"name": "add", "arguments": {"a": 1}</tool_call>',  # bad JSON
        '<tool_call>{"arguments": {"a": 1}}</tool_call>',  # no name
        '<tool_call>{"name": "", "arguments": {}}</tool_call>',  # empty name
        '<tool_call>{"name": "add", "arguments": "a=1"}</tool_call>',  # arguments not an object
        '<tool_call>{"name": "add", "arguments": {}, "id": "x"}</tool_call>',  # another key
        '<tool_call>{"name": "add", "arguments": {"a": NaN}}</tool_call>',  # not JSON
        '<tool_call>{"name": "add", "arguments": {}}',  # not closed
        '<tool_call>{"name": "add", "arguments": {}}</tool_call> and then text',
        '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>oops</tool_call>',
    ],
    ids=[
        "bad_json",
        "no_name",
        "empty_name",
        "string_arguments",
        "extra_key",
        "nan",
        "unclosed",
        "text_after",
        "one_bad_block",
    ],
)
def test_a_malformed_tool_call_stays_content_verbatim(tail: str):
    text = "I will call it: " + tail
    assert parse_output(text, tool_calls=True) == ParsedOutput(content=text)


def test_without_tools_offered_tool_call_markup_is_content():
    text = '<tool_call>{"name": "add", "arguments": {}}</tool_call>'
    assert parse_output(text, tool_calls=False) == ParsedOutput(content=text)


def test_reasoning_needs_its_opening_tag_at_the_start_and_a_closing_tag():
    assert parse_output("<think>a</think>b", tool_calls=False) == ParsedOutput("b", "a")
    assert parse_output("<think></think>", tool_calls=False) == ParsedOutput("", "")
    for text in (" <think>a</think>b", "<think>cut by the length limit", "a</think>b"):
        assert parse_output(text, tool_calls=False) == ParsedOutput(content=text)


def test_reasoning_and_malformed_call_keep_the_reasoning_and_the_text():
    text = "<think>plan</think>Calling <tool_call>{broken}</tool_call>"
    assert parse_output(text, tool_calls=True) == ParsedOutput(
        content="Calling <tool_call>{broken}</tool_call>", reasoning="plan"
    )


def test_the_assistant_message_carries_one_id_per_call():
    parsed = parse_output(
        '<tool_call>{"name": "f", "arguments": {"x": "é"}}</tool_call>', tool_calls=True
    )
    message = assistant_message(parsed, ["call_1"])
    assert message == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "f", "arguments": '{"x": "é"}'},
            }
        ],
    }
    with pytest.raises(ValueError, match="one call id per tool call"):
        assistant_message(parsed, [])
