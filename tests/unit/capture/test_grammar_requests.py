"""Structured output requests become the call's output constraint, or are refused before anything
is recorded (``capture/constraints.py``; ``docs/gateway.md``, "Structured output")."""

from __future__ import annotations

from typing import Any

import pytest

from grove.capture.chat_api import ChatCompletionRequest
from grove.capture.conversion import RequestConverter
from grove.capture.engine import FunctionSchema, OutputConstraint
from grove.capture.refusals import Refused
from grove.capture.render import Renderer
from grove.capture.responses_api import ResponsesRequest

MODEL = "grove/test-tiny"
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
PARAMETERS = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
CHAT_TOOLS = [
    {"type": "function", "function": {"name": "search", "parameters": PARAMETERS}},
    {"type": "function", "function": {"name": "clock"}},
]
RESPONSES_TOOLS = [
    {"type": "function", "name": "search", "parameters": PARAMETERS},
    {"type": "function", "name": "clock"},
]
SEARCH, CLOCK = FunctionSchema("search", PARAMETERS), FunctionSchema("clock", None)


@pytest.fixture(scope="module")
def converter(renderer: Renderer) -> RequestConverter:
    return RequestConverter(MODEL, 16, renderer)


def chat(converter: RequestConverter, **fields: Any) -> OutputConstraint | None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}
    request = ChatCompletionRequest.model_validate(body)
    return converter.chat_call(request, None).call.sampling.constraint


def respond(converter: RequestConverter, **fields: Any) -> OutputConstraint | None:
    request = ResponsesRequest.model_validate({"model": MODEL, "input": "hi", **fields})
    return converter.responses_call(request, None).call.sampling.constraint


def refusal(convert, converter: RequestConverter, match: str, **fields: Any) -> Refused:
    with pytest.raises(Refused, match=match) as raised:
        convert(converter, **fields)
    return raised.value


def test_a_chat_json_schema_response_format_constrains_the_content_to_the_schema(
    converter: RequestConverter,
):
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    assert chat(converter, response_format=response_format) == OutputConstraint(
        content="json_schema", schema=SCHEMA, name="answer", strict=True
    )


def test_a_responses_text_format_is_the_same_constraint_as_chats_response_format(
    converter: RequestConverter,
):
    text = {"format": {"type": "json_schema", "name": "answer", "schema": SCHEMA, "strict": True}}
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True},
    }
    assert respond(converter, text=text) == chat(converter, response_format=response_format)


def test_json_object_mode_constrains_the_content_to_any_object(converter: RequestConverter):
    expected = OutputConstraint(content="json_object")
    assert chat(converter, response_format={"type": "json_object"}) == expected
    assert respond(converter, text={"format": {"type": "json_object"}}) == expected


def test_a_text_format_or_none_leaves_sampling_unconstrained(converter: RequestConverter):
    constraints = (
        chat(converter, response_format={"type": "text"}),
        chat(converter, tools=CHAT_TOOLS),
        respond(converter, text={"format": {"type": "text"}}),
        respond(converter, text={}),
    )
    assert constraints == (None, None, None, None)


def test_a_json_format_beside_tools_on_auto_allows_content_or_tool_calls(
    converter: RequestConverter,
):
    constraint = chat(converter, response_format={"type": "json_object"}, tools=CHAT_TOOLS)
    assert constraint == OutputConstraint(
        content="json_object", tools=(SEARCH, CLOCK), tool_calls="auto"
    )


def test_a_json_format_with_tool_choice_none_allows_content_only(converter: RequestConverter):
    constraint = chat(
        converter, response_format={"type": "json_object"}, tools=CHAT_TOOLS, tool_choice="none"
    )
    assert constraint == OutputConstraint(content="json_object")


def test_tool_choice_required_forces_a_call_of_any_tool(converter: RequestConverter):
    assert chat(converter, tools=CHAT_TOOLS, tool_choice="required") == OutputConstraint(
        tools=(SEARCH, CLOCK), tool_calls="required"
    )


def test_a_named_tool_choice_forces_a_call_of_that_tool_on_either_api(
    converter: RequestConverter,
):
    expected = OutputConstraint(tools=(SEARCH,), tool_calls="required", parallel_tool_calls=False)
    named_chat = {"type": "function", "function": {"name": "search"}}
    named_responses = {"type": "function", "name": "search"}
    got = (
        chat(converter, tools=CHAT_TOOLS, tool_choice=named_chat, parallel_tool_calls=False),
        respond(
            converter,
            tools=RESPONSES_TOOLS,
            tool_choice=named_responses,
            parallel_tool_calls=False,
        ),
    )
    assert got == (expected, expected)


def test_a_forced_call_leaves_no_content_to_format(converter: RequestConverter):
    constraint = chat(
        converter,
        response_format={"type": "json_object"},
        tools=CHAT_TOOLS,
        tool_choice="required",
    )
    assert constraint == OutputConstraint(tools=(SEARCH, CLOCK), tool_calls="required")


def test_a_forced_tool_choice_still_renders_every_tool(converter: RequestConverter):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": CHAT_TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "clock"}},
    }
    call = converter.chat_call(ChatCompletionRequest.model_validate(body), None).call
    assert [tool["function"]["name"] for tool in call.options.tools or ()] == ["search", "clock"]


@pytest.mark.parametrize(
    ("convert", "fields", "code", "param", "match"),
    [
        (
            chat,
            {"tools": CHAT_TOOLS, "tool_choice": {"type": "function", "function": {"name": "x"}}},
            "invalid_tool_choice",
            "tool_choice",
            "names function 'x', which is not among the tools",
        ),
        (
            chat,
            {"tool_choice": "required"},
            "invalid_tool_choice",
            "tool_choice",
            "'required' needs tools",
        ),
        (
            respond,
            {"tools": RESPONSES_TOOLS, "tool_choice": {"type": "allowed_tools", "tools": []}},
            "unsupported_tool_choice",
            "tool_choice",
            "send 'auto', 'none', 'required' or a function by name",
        ),
        (
            chat,
            {"response_format": {"type": "regex", "regex": "a+"}},
            "unsupported_response_format",
            "response_format",
            "type 'regex' is not supported",
        ),
        (
            chat,
            {"response_format": {"type": "json_schema", "json_schema": {"name": "n"}}},
            "invalid_response_format",
            "response_format",
            "needs 'schema', a JSON schema object",
        ),
        (
            respond,
            {"text": {"verbosity": "low"}},
            "unsupported_verbosity",
            "text",
            "text.verbosity 'low' is not supported",
        ),
        (
            respond,
            {"text": {"format": {"type": "json_schema", "schema": {"type": "wat"}}}},
            "unsupported_schema",
            "text",
            'Unsupported type "wat"',
        ),
        (
            chat,
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": "f",
                            "parameters": {"type": "array", "uniqueItems": True},
                        },
                    }
                ],
                "tool_choice": "required",
            },
            "unsupported_schema",
            "tools",
            r"tools\[0\] \(f\) cannot be enforced",
        ),
    ],
    ids=[
        "named-tool-not-offered",
        "required-without-tools",
        "allowed-tools-choice",
        "regex-format",
        "schema-missing",
        "verbosity",
        "invalid-schema",
        "tool-schema-unenforceable",
    ],
)
def test_a_structured_output_request_grove_cannot_honour_is_refused_with_the_reason(
    converter: RequestConverter,
    convert,
    fields: dict[str, Any],
    code: str,
    param: str,
    match: str,
):
    refused = refusal(convert, converter, match, **fields)
    assert (refused.status, refused.code, refused.param) == (400, code, param)
