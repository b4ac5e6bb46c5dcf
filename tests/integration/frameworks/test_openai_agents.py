"""The OpenAI Agents SDK (``agents``) running an agent with a function tool against the gateway.

The agent's model is one of the SDK's two OpenAI models over an ``AsyncOpenAI`` client pointed at
the gateway (``base_url`` …/v1, the attempt's header in ``default_headers``, the served model's
name): ``OpenAIResponsesModel``, or ``OpenAIChatCompletionsModel`` with
``should_replay_reasoning_content`` returning true. It runs with ``Runner.run`` or
``Runner.run_streamed`` (streaming every event) and a ``SQLiteSession`` (in memory), and the
harness posts ``session.get_items()`` as they are as the returned history. Tracing is off
(``agents_sdk.py``): the SDK exports nothing.

The scripted model reasons and calls the tool twice, then answers: three calls, each continuing
the one before. The SDK's chat model replays reasoning only to models it knows want it
(DeepSeek's); by default it sends the assistant turn back without it, so the next call is a root
(``history_rewritten``), and the session items, which keep the reasoning, still select every call.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from agents import Agent, Model, Runner, SQLiteSession
from openai import AsyncOpenAI

from tests.integration.gateway.support import Gateway

from .agents_sdk import chat_model, client, get_weather, responses_model
from .attempts import Link, Played, chain, finish, open_attempt, verified
from .weather import QUESTION, SCRIPT

# One worker plays each module-scoped agent run once (``make test`` distributes by group).
pytestmark = pytest.mark.xdist_group("frameworks-openai-agents")


async def run_agent(
    gateway: Gateway, capture_key: str, model: Callable[[AsyncOpenAI], Model], *, streamed: bool
) -> tuple[str, list[Any]]:
    """Run the agent on one question in a new session: its final output and the session's
    items."""
    async with client(gateway, capture_key) as openai_client:
        agent = Agent(
            name="weather",
            instructions="You answer questions about the weather.",
            tools=[get_weather],
            model=model(openai_client),
        )
        session = SQLiteSession("weather")
        if streamed:
            result = Runner.run_streamed(agent, QUESTION, session=session)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, QUESTION, session=session)
        return result.final_output, await session.get_items()


def play(
    gateway: Gateway, name: str, model: Callable[[AsyncOpenAI], Model], *, streamed: bool
) -> tuple[Played, str]:
    key = open_attempt(gateway, name)
    gateway.engine.say(*SCRIPT)
    final_output, items = asyncio.run(run_agent(gateway, key, model, streamed=streamed))
    return finish(gateway, key, {"reward": 1.0, "output": items}), final_output


RUNS = {
    "responses": (responses_model, False),
    "responses-streamed": (responses_model, True),
    "chat": (chat_model, False),
    "chat-streamed": (chat_model, True),
}


@pytest.fixture(scope="module", params=list(RUNS))
def played(gateway: Gateway, request: pytest.FixtureRequest) -> tuple[Played, str]:
    model, streamed = RUNS[request.param]
    return play(gateway, f"agents-{request.param}", model, streamed=streamed)


def test_the_agent_answers_with_the_last_calls_text(played: tuple[Played, str]):
    _, final_output = played
    assert final_output == "It is warmer in Rome."


def test_every_call_of_the_run_is_committed_once(played: tuple[Played, str]):
    run, _ = played
    assert run.statuses == ["committed"] * 3
    assert run.committed == run.call_ids


def test_each_call_after_a_tool_result_continues_the_call_before(played: tuple[Played, str]):
    run, _ = played
    assert run.links == chain(run.call_ids)


def test_the_session_items_select_every_call(played: tuple[Played, str]):
    run, _ = played
    assert run.selection == run.call_ids


def test_replay_verify_re_runs_every_decision_of_the_run_alike(played: tuple[Played, str]):
    run, _ = played
    assert run.replay_checks == verified(run)


@pytest.fixture(scope="module")
def without_reasoning(gateway: Gateway) -> Played:
    """The chat model as the SDK configures it: reasoning is not sent back."""

    def model(openai_client: AsyncOpenAI) -> Model:
        return chat_model(openai_client, replay_reasoning=False)

    run, _ = play(gateway, "agents-chat-default", model, streamed=False)
    return run


def test_the_chat_model_without_reasoning_replay_makes_each_next_call_a_rewrite(
    without_reasoning: Played,
):
    assert without_reasoning.links == [
        Link("root", None, "first_call"),
        Link("root", None, "history_rewritten"),
        Link("root", None, "history_rewritten"),
    ]


def test_the_session_items_still_select_every_call_of_the_rewritten_run(
    without_reasoning: Played,
):
    assert without_reasoning.selection == without_reasoning.call_ids
    assert without_reasoning.replay_checks == verified(without_reasoning)
