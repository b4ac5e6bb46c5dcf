"""A LangGraph ReAct agent over ``ChatOpenAI``, streamed with ``stream_mode="messages"``.

The agent is ``langchain.agents.create_agent`` (LangGraph's prebuilt ``create_react_agent``
moved there in LangGraph 1.0 and is deprecated): a graph of a model node and a tool node over the
message state. Streaming messages makes ``ChatOpenAI`` stream each call (``stream=True``), so the
gateway answers with buffered chunks that LangChain merges into the message it keeps. The agent
also streams the state's values, and the harness returns the last state's messages, converted
with ``convert_to_openai_messages``.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessageChunk, HumanMessage, convert_to_openai_messages

from tests.integration.gateway.support import Gateway

from .attempts import Played, chain, finish, open_attempt, verified
from .langchain_agent import PARIS_CALL, ROME_CALL, chat_model, get_weather

# One worker plays each module-scoped agent run once (``make test`` distributes by group).
pytestmark = pytest.mark.xdist_group("frameworks-langgraph")


@pytest.fixture(scope="module")
def streamed(gateway: Gateway) -> tuple[Played, list[tuple[str, str]]]:
    """The agent asked one question (two tool calls, an answer); also each streamed message's
    type and the node that produced it."""
    key = open_attempt(gateway, "langgraph")
    gateway.engine.say(PARIS_CALL, ROME_CALL, "It is warmer in Rome.")
    agent = create_agent(
        chat_model(gateway, key),
        [get_weather],
        system_prompt="You answer questions about the weather.",
    )
    question: dict[str, Any] = {"messages": [HumanMessage("Is it warmer in Paris or in Rome?")]}
    messages: list[tuple[str, str]] = []
    state: dict[str, Any] = {}
    for mode, payload in agent.stream(question, stream_mode=["messages", "values"]):
        if mode == "messages":
            message, metadata = payload
            messages.append((type(message).__name__, metadata["langgraph_node"]))
        else:
            state = payload
    output = convert_to_openai_messages(state["messages"])
    return finish(gateway, key, {"reward": 1.0, "output": output}), messages


def test_each_model_call_streams_its_message_in_chunks(
    streamed: tuple[Played, list[tuple[str, str]]],
):
    _, messages = streamed
    # Each call's four chunks (role; the tool call or the text; the finish reason; the usage),
    # then the tool node's result.
    call = [(AIMessageChunk.__name__, "model")] * 4
    tool = [("ToolMessage", "tools")]
    assert messages == [*call, *tool, *call, *tool, *call]


def test_each_streamed_call_is_committed_once(streamed: tuple[Played, list[tuple[str, str]]]):
    played, _ = streamed
    assert played.statuses == ["committed"] * 3
    assert played.committed == played.call_ids


def test_each_call_after_the_tool_node_continues_the_call_before(
    streamed: tuple[Played, list[tuple[str, str]]],
):
    played, _ = streamed
    assert played.links == chain(played.call_ids)


def test_the_last_states_messages_select_every_call(
    streamed: tuple[Played, list[tuple[str, str]]],
):
    played, _ = streamed
    assert played.selection == played.call_ids


def test_replay_verify_re_runs_every_decision_of_the_agent_alike(
    streamed: tuple[Played, list[tuple[str, str]]],
):
    played, _ = streamed
    assert played.replay_checks == verified(played)
