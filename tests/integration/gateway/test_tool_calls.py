"""Tool calls and reasoning through the official client: parsed, echoed back, continued, selected.

A scripted engine (``ScriptedEngine``) writes the markup of the embedded template
(``<think>…</think>``, ``<tool_call>{…}</tool_call>``, ``capture/toolcalls.py``). The tool call is
written name first, as models do, while the template renders the parsed call arguments first: the
continuation must still resume from the exact generated tokens (``capture/splice.py``).
"""

from __future__ import annotations

import json
from typing import Any

from .conftest import MODEL, Gateway, tokenizer
from .test_attempts import post

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RESPONSES_WEATHER = {"type": "function", **WEATHER["function"]}
USER = {"role": "user", "content": "What is the weather in Paris?"}
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}</tool_call>'
THINK = "<think>The user wants the weather; look it up.</think>"
ANSWER = "It is sunny in Paris, 21 degrees."


def chat(gateway: Gateway, messages: list[dict[str, Any]], **options: Any) -> tuple[Any, Any]:
    options.setdefault("tools", [WEATHER])
    raw = gateway.client().chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, **options
    )
    return raw.parse(), raw.headers


def play_chat_agent(gateway: Gateway) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """call → tool_calls → tool result → final answer; the history and each answer's headers."""
    gateway.open()
    gateway.engine.say(THINK + CALL, ANSWER)
    first, first_headers = chat(gateway, [USER])
    message = first.choices[0].message
    history = [USER, message.model_dump()]
    history.append(
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny, 21 C"}
    )
    final, final_headers = chat(gateway, history)
    history.append(final.choices[0].message.model_dump())
    return history, [first, final], [first_headers, final_headers]


def test_a_tool_call_is_parsed_echoed_continued_and_selected(scripted_gateway: Gateway):
    gateway = scripted_gateway
    history, (first, final), (first_headers, final_headers) = play_chat_agent(gateway)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    assert message.content is None
    assert message.model_dump()["reasoning_content"] == "The user wants the weather; look it up."
    (tool_call,) = message.tool_calls
    assert tool_call.id.startswith("call_")
    assert tool_call.function.name == "get_weather"
    assert json.loads(tool_call.function.arguments) == {"city": "Paris", "unit": "C"}
    # The echoed assistant message and tool result continue the call, from its exact tokens.
    assert final_headers["x-grove-decision"] == "continuation"
    assert final_headers["x-grove-parent-call-id"] == first_headers["x-grove-call-id"]
    first_prompt, second_prompt = gateway.engine.prompts
    generated, _ = gateway.generated("att-1", first_headers["x-grove-call-id"])
    chain = [*first_prompt, *generated]
    assert second_prompt[: len(chain)] == chain
    assert tokenizer().decode(generated[:-1]) == THINK + CALL
    assert final.choices[0].message.content == ANSWER
    # The harness returns its history: the selection is both calls, in order.
    answer = post(gateway, "/att-1/result", {"reward": 1.0, "output": history})
    assert answer.status_code == 200, answer.text
    call_ids = [first_headers["x-grove-call-id"], final_headers["x-grove-call-id"]]
    assert answer.json()["selection"]["call_ids"] == call_ids
    assert gateway.status()["selection"]["terminal_response_id"] == final.id
    state = gateway.state()
    assert state.selection is not None and list(state.selection.call_ids) == call_ids
    assert state.calls[call_ids[0]].committed.finish_reason == "tool_calls"


def test_a_later_turn_continues_a_chain_that_holds_a_parsed_tool_call(
    local_scripted_gateway: Gateway,
):
    # Every output of the chain is its exact text in the boundary check, not only the parent's.
    gateway = local_scripted_gateway
    history, _, (_, final_headers) = play_chat_agent(gateway)
    gateway.engine.say("You are welcome.")
    _, headers = chat(gateway, [*history, {"role": "user", "content": "Thanks!"}])
    assert headers["x-grove-decision"] == "continuation"
    assert headers["x-grove-parent-call-id"] == final_headers["x-grove-call-id"]


def test_the_agents_sdk_session_items_select_the_calls(local_scripted_gateway: Gateway):
    # The OpenAI Agents SDK's chat model turns each completion into Responses items that carry
    # provider_data and a placeholder id; session.get_items() returns them as the history.
    gateway = local_scripted_gateway
    _, (first, final), (first_headers, final_headers) = play_chat_agent(gateway)
    provider = {"model": MODEL, "response_id": first.id}
    tool_call = first.choices[0].message.tool_calls[0]
    items = [
        USER,
        {
            "id": "__fake_id__",
            "summary": [
                {
                    "text": first.choices[0].message.model_dump()["reasoning_content"],
                    "type": "summary_text",
                }
            ],
            "type": "reasoning",
            "provider_data": provider,
        },
        {
            "id": "__fake_id__",
            "call_id": tool_call.id,
            "arguments": tool_call.function.arguments,
            "name": "get_weather",
            "type": "function_call",
            "provider_data": provider,
        },
        {"type": "function_call_output", "call_id": tool_call.id, "output": "sunny, 21 C"},
        {
            "id": "__fake_id__",
            "content": [{"annotations": [], "text": ANSWER, "type": "output_text", "logprobs": []}],
            "role": "assistant",
            "status": "completed",
            "type": "message",
            "provider_data": {"model": MODEL, "response_id": final.id},
        },
    ]
    answer = post(gateway, "/att-1/result", {"reward": 1.0, "output": items})
    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["call_ids"] == [
        first_headers["x-grove-call-id"],
        final_headers["x-grove-call-id"],
    ]


def test_responses_function_calls_round_trip_through_the_output_items(
    local_scripted_gateway: Gateway,
):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(THINK + "Let me check." + CALL, ANSWER)
    client = gateway.client()
    first = client.responses.with_raw_response.create(
        model=MODEL, input=[USER], tools=[RESPONSES_WEATHER], include=[]
    )
    response = first.parse()
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert {item.id for item in response.output} == {response.id}
    reasoning, message, call = response.output
    assert reasoning.content[0].text == "The user wants the weather; look it up."
    assert message.content[0].text == "Let me check."
    assert (call.name, json.loads(call.arguments)) == (
        "get_weather",
        {"city": "Paris", "unit": "C"},
    )
    history = [USER, *(item.model_dump(exclude_unset=True) for item in response.output)]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    second = client.responses.with_raw_response.create(
        model=MODEL, input=history, tools=[RESPONSES_WEATHER]
    )
    assert second.headers["x-grove-decision"] == "continuation"
    assert second.headers["x-grove-parent-call-id"] == first.headers["x-grove-call-id"]
    history += [item.model_dump(exclude_unset=True) for item in second.parse().output]
    answer = post(gateway, "/att-1/result", {"reward": 1.0, "output": history})
    assert answer.status_code == 200, answer.text
    assert len(answer.json()["selection"]["call_ids"]) == 2


def test_a_streamed_tool_call_accumulates_in_both_stream_helpers(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(THINK + CALL, THINK + CALL)
    client = gateway.client()
    with client.chat.completions.stream(
        model=MODEL,
        messages=[USER],
        tools=[WEATHER],
    ) as stream:
        completion = stream.get_final_completion()
    message = completion.choices[0].message
    assert completion.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in message.tool_calls] == ["get_weather"]
    assert json.loads(message.tool_calls[0].function.arguments)["city"] == "Paris"
    with client.responses.stream(model=MODEL, input=[USER], tools=[RESPONSES_WEATHER]) as events:
        response = events.get_final_response()
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert response.output[1].name == "get_weather"


def test_a_malformed_tool_call_is_content_and_still_continues(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.open()
    broken = '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>'
    gateway.engine.say(broken, ANSWER)
    first, _ = chat(gateway, [USER])
    assert first.choices[0].message.content == broken
    assert first.choices[0].message.tool_calls is None
    assert first.choices[0].finish_reason == "stop"
    history = [USER, first.choices[0].message.model_dump(), {"role": "user", "content": "Again?"}]
    _, second_headers = chat(gateway, history)
    assert second_headers["x-grove-decision"] == "continuation"


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(CALL, CALL)
    without, _ = chat(gateway, [USER], tools=None)
    none, _ = chat(gateway, [USER], tool_choice="none")
    assert none.choices[0].message.content == CALL
    assert none.choices[0].message.tool_calls is None
    no_tools_prompt, none_prompt = gateway.engine.prompts
    assert none_prompt == no_tools_prompt
    assert without.choices[0].message.content == CALL
