"""Structured output from each framework, decoded under a grammar by the random tiny model.

The official client's ``chat.completions.parse`` and ``responses.parse``, LangChain's
``with_structured_output`` (``json_schema``, ``function_calling``: a forced tool choice,
``json_mode``) and an Agents SDK agent's ``output_type`` (the Responses ``text`` format, or
``response_format`` on its chat model) each get an answer the framework parses into the model it
asked for, from the embedded engine sampling under the request's grammar (no script:
``docs/gateway.md``, "Structured output"). The call's intent records the constraint.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Literal

from agents import Agent, Runner
from langchain_core.messages import HumanMessage
from pydantic import BaseModel, Field

from tests.integration.gateway.support import MODEL, Gateway

from .agents_sdk import chat_model as agents_chat_model
from .agents_sdk import client, responses_model
from .attempts import open_attempt
from .langchain_agent import chat_model


class Weather(BaseModel):
    """A schema the random model completes within a few dozen tokens: an enumeration, a bounded
    integer and a boolean (free strings would run long)."""

    city: Literal["Paris", "Rome"]
    degrees: int = Field(ge=-30, le=45)
    sunny: bool


def constraints(gateway: Gateway, capture_key: str) -> list[dict[str, Any] | None]:
    """The constraint each call of the attempt's intent recorded, in intent order."""
    return [call.intended.constraint for call in gateway.state(capture_key).calls.values()]


def test_the_official_clients_parse_gets_its_model_from_a_json_schema_call(gateway: Gateway):
    key = open_attempt(gateway, "parse")
    with gateway.client(key) as official:
        completion = official.chat.completions.parse(
            model=MODEL,
            messages=[{"role": "user", "content": "The weather in Paris?"}],
            response_format=Weather,
        )
    choice = completion.choices[0]
    assert (choice.finish_reason, type(choice.message.parsed)) == ("stop", Weather)
    assert Weather.model_validate_json(choice.message.content or "") == choice.message.parsed
    [recorded] = constraints(gateway, key)
    assert recorded is not None
    assert (recorded["content"], recorded["name"], recorded["strict"]) == (
        "json_schema",
        "Weather",
        True,
    )


def test_the_official_clients_responses_parse_gets_its_model_from_a_text_format(
    gateway: Gateway,
):
    key = open_attempt(gateway, "responses-parse")
    with gateway.client(key) as official:
        response = official.responses.parse(
            model=MODEL, input="The weather in Rome?", text_format=Weather
        )
    assert (response.status, type(response.output_parsed)) == ("completed", Weather)
    [recorded] = constraints(gateway, key)
    assert recorded is not None and recorded["content"] == "json_schema"


def test_a_structured_call_after_an_answer_continues_it(gateway: Gateway):
    key = open_attempt(gateway, "follow-up")
    question = {"role": "user", "content": "The weather in Paris?"}
    gateway.engine.say("Sunny and warm.")
    with gateway.client(key) as official:
        first = official.chat.completions.create(model=MODEL, messages=[question])
        answer = first.choices[0].message.model_dump(exclude_none=True)
        official.chat.completions.parse(
            model=MODEL,
            messages=[question, answer, {"role": "user", "content": "As JSON, please."}],
            response_format=Weather,
        )
    calls = gateway.status(key)["calls"]
    assert [(c["decision"], c["parent_call_id"]) for c in calls] == [
        ("root", None),
        ("continuation", calls[0]["call_id"]),
    ]
    assert [c is None for c in constraints(gateway, key)] == [True, False]


def test_langchain_with_structured_output_returns_the_model(gateway: Gateway):
    key = open_attempt(gateway, "langchain-schema")
    structured = chat_model(gateway, key).with_structured_output(Weather)
    assert isinstance(structured.invoke([HumanMessage("The weather in Paris?")]), Weather)
    [recorded] = constraints(gateway, key)
    assert recorded is not None and recorded["content"] == "json_schema"


def test_langchain_structured_output_by_function_calling_forces_the_tool(gateway: Gateway):
    key = open_attempt(gateway, "langchain-function")
    structured = chat_model(gateway, key).with_structured_output(Weather, method="function_calling")
    assert isinstance(structured.invoke([HumanMessage("The weather in Rome?")]), Weather)
    [recorded] = constraints(gateway, key)
    assert recorded is not None
    assert (recorded["tool_calls"], [t["name"] for t in recorded["tools"]]) == (
        "required",
        ["Weather"],
    )
    assert gateway.status(key)["calls"][0]["finish_reason"] == "tool_calls"


def test_langchain_json_mode_returns_a_json_object(gateway: Gateway):
    key = open_attempt(gateway, "langchain-json")
    model = chat_model(gateway, key, seed=2, max_tokens=256)
    answer = model.with_structured_output(method="json_mode").invoke(
        [HumanMessage("The weather in Paris, as JSON?")]
    )
    assert isinstance(answer, dict)
    [recorded] = constraints(gateway, key)
    assert recorded is not None and recorded["content"] == "json_object"


def test_a_forced_tool_choice_answers_one_call_of_the_named_tool(gateway: Gateway):
    key = open_attempt(gateway, "forced")
    tool = {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Rome"]}},
                "required": ["city"],
            },
        },
    }
    with gateway.client(key) as official:
        completion = official.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "The weather in Paris?"}],
            tools=[tool],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            parallel_tool_calls=False,
        )
    choice = completion.choices[0]
    [call] = choice.message.tool_calls or []
    assert (choice.finish_reason, choice.message.content, call.function.name) == (
        "tool_calls",
        None,
        "get_weather",
    )
    assert json.loads(call.function.arguments)["city"] in ("Paris", "Rome")


def run_agent(gateway: Gateway, model) -> tuple[str, Any]:
    async def play(key: str) -> Any:
        async with client(gateway, key) as openai_client:
            agent = Agent(name="weather", output_type=Weather, model=model(openai_client))
            return (await Runner.run(agent, "The weather in Paris?")).final_output

    key = open_attempt(gateway, "agents")
    return key, asyncio.run(play(key))


def test_an_agents_sdk_output_type_on_the_responses_model_is_the_final_output(
    gateway: Gateway,
):
    key, final = run_agent(gateway, responses_model)
    assert isinstance(final, Weather)
    [recorded] = constraints(gateway, key)
    assert recorded is not None and recorded["content"] == "json_schema"


def test_an_agents_sdk_output_type_on_the_chat_model_is_the_final_output(gateway: Gateway):
    key, final = run_agent(gateway, agents_chat_model)
    assert isinstance(final, Weather)
    [recorded] = constraints(gateway, key)
    assert recorded is not None and recorded["content"] == "json_schema"
