"""The official ``openai`` client in a tool loop: Chat Completions and Responses, streamed and not.

The agent is the loop the client's documentation teaches: send the history with the tools, append
the answer as the client returns it (the chat message; the Responses output items), run each tool
call and append its result, and send again until the model answers without calling a tool. The
scripted model reasons, calls a tool, reasons again and calls another, then answers: three calls,
each continuing the one before from its exact tokens. The harness returns its history as the
result.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.integration.gateway.support import MODEL, Gateway

from .attempts import Played, chain, finish, open_attempt, verified
from .weather import SCRIPT, USER, WEATHER_IN

# One worker plays each module-scoped agent run once (``make test`` distributes by group).
pytestmark = pytest.mark.xdist_group("frameworks-openai-client")

WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
CHAT_TOOLS = [{"type": "function", "function": WEATHER}]
RESPONSES_TOOLS = [{"type": "function", **WEATHER}]


def get_weather(arguments: str) -> str:
    return WEATHER_IN[json.loads(arguments)["city"]]


def chat_agent(client: OpenAI, *, stream: bool) -> list[dict[str, Any]]:
    """The Chat Completions tool loop; its returned history."""
    messages: list[dict[str, Any]] = [USER]
    while True:
        if stream:
            with client.chat.completions.stream(
                model=MODEL, messages=messages, tools=CHAT_TOOLS
            ) as events:
                completion = events.get_final_completion()
        else:
            completion = client.chat.completions.create(
                model=MODEL, messages=messages, tools=CHAT_TOOLS
            )
        message = completion.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return messages
        for call in message.tool_calls:
            result = get_weather(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})


def responses_agent(client: OpenAI, *, stream: bool) -> list[dict[str, Any]]:
    """The Responses tool loop (``input += response.output``); its returned history."""
    items: list[Any] = [USER]
    while True:
        if stream:
            with client.responses.stream(model=MODEL, input=items, tools=RESPONSES_TOOLS) as events:
                response = events.get_final_response()
        else:
            response = client.responses.create(model=MODEL, input=items, tools=RESPONSES_TOOLS)
        items += response.output
        calls = [item for item in response.output if item.type == "function_call"]
        if not calls:
            return [i.model_dump(mode="json") if isinstance(i, BaseModel) else i for i in items]
        for call in calls:
            output = get_weather(call.arguments)
            items.append(
                {"type": "function_call_output", "call_id": call.call_id, "output": output}
            )


AGENTS = {
    "chat": lambda client: chat_agent(client, stream=False),
    "chat-streamed": lambda client: chat_agent(client, stream=True),
    "responses": lambda client: responses_agent(client, stream=False),
    "responses-streamed": lambda client: responses_agent(client, stream=True),
}


@pytest.fixture(scope="module", params=list(AGENTS))
def played(gateway: Gateway, request: pytest.FixtureRequest) -> Played:
    key = open_attempt(gateway, request.param)
    gateway.engine.say(*SCRIPT)
    with gateway.client(key) as client:
        history = AGENTS[request.param](client)
    return finish(gateway, key, {"reward": 1.0, "output": history})


def test_every_call_is_committed_once(played: Played):
    assert played.statuses == ["committed"] * 3
    assert played.committed == played.call_ids


def test_each_call_after_a_tool_result_continues_the_call_before(played: Played):
    assert played.links == chain(played.call_ids)


def test_the_returned_history_selects_every_call(played: Played):
    assert played.selection == played.call_ids


def test_replay_verify_re_runs_every_decision_alike(played: Played):
    assert played.replay_checks == verified(played)


def test_a_prompt_cache_key_is_refused_with_its_reason(gateway: Gateway):
    # The Agents SDK sends one to OpenAI's own endpoint only; a harness may still set it.
    key = open_attempt(gateway, "prompt-cache")
    with gateway.client(key) as client, pytest.raises(openai.BadRequestError) as refusal:
        client.responses.create(model=MODEL, input="Hi", prompt_cache_key="k1")
    assert (refusal.value.code, refusal.value.param) == ("invalid_request", "prompt_cache_key")
    assert "Grove keeps no provider-side prompt cache" in refusal.value.message
