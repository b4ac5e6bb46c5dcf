"""LangChain's ``ChatOpenAI`` pointed at the gateway, in the tool loop its documentation teaches.

``ChatOpenAI(base_url=…/v1, api_key=…, model=MODEL, default_headers={capture key})`` with
``bind_tools`` and a ``@tool``: invoke, run each tool call, append a ``ToolMessage``, invoke
again until the model answers. The harness keeps the history as LangChain messages and returns
it converted with ``convert_to_openai_messages``.

- A plain loop: every call after a tool result continues the one before.
- ``trim_messages`` shortening the history before each call (a recency window of four messages,
  counted with ``token_counter=len``): the call after the trim is a root (``history_rewritten``),
  the next one continues it, and the returned untrimmed history still selects every call.
- Reasoning: ``ChatOpenAI`` on Chat Completions keeps only the official API's fields and drops
  ``reasoning_content`` from what it parses (its module docstring says so), so it sends the
  assistant turn back without its reasoning: a rewrite, and a returned history that no longer
  holds the generation. On the Responses API (``use_responses_api=True``) it keeps the reasoning
  items and sends them back: the calls continue.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    convert_to_openai_messages,
    trim_messages,
)
from langchain_openai import ChatOpenAI

from tests.integration.gateway.support import Gateway

from .attempts import Link, Played, chain, finish, open_attempt, verified
from .langchain_agent import PARIS_CALL, ROME_CALL, SYSTEM, chat_model, get_weather

# One worker plays each module-scoped agent run once (``make test`` distributes by group).
pytestmark = pytest.mark.xdist_group("frameworks-langchain")


def run_tools(
    model: ChatOpenAI,
    history: list[BaseMessage],
    prepare: Callable[[list[BaseMessage]], Sequence[BaseMessage]] = list,
) -> None:
    """The tool loop: invoke the model on ``prepare(history)`` until it answers without calling a
    tool, appending each answer and tool result to ``history``."""
    bound = model.bind_tools([get_weather])
    while True:
        answer = bound.invoke(prepare(history))
        history.append(answer)
        if not answer.tool_calls:
            return
        for call in answer.tool_calls:
            history.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))


def recency_window(history: list[BaseMessage]) -> list[BaseMessage]:
    """The system message and the last messages, four in all, starting on a user turn."""
    return trim_messages(
        history,
        max_tokens=4,
        token_counter=len,
        strategy="last",
        include_system=True,
        start_on="human",
    )


@pytest.fixture(scope="module")
def tool_loop(gateway: Gateway) -> Played:
    """One question, two tool calls, an answer: three calls."""
    key = open_attempt(gateway, "langchain-tools")
    gateway.engine.say(PARIS_CALL, ROME_CALL, "It is warmer in Rome.")
    history: list[BaseMessage] = [SYSTEM, HumanMessage("Is it warmer in Paris or in Rome?")]
    run_tools(chat_model(gateway, key), history)
    return finish(gateway, key, {"reward": 1.0, "output": convert_to_openai_messages(history)})


@pytest.fixture(scope="module")
def trimmed(gateway: Gateway) -> tuple[Played, list[int]]:
    """Two questions, each a tool call and an answer (four calls), the history trimmed to four
    messages before each call; also the number of messages each call was sent."""
    key = open_attempt(gateway, "langchain-trim")
    gateway.engine.say(PARIS_CALL, "Sunny in Paris.", ROME_CALL, "Sunny in Rome.")
    sent: list[int] = []

    def prepare(history: list[BaseMessage]) -> list[BaseMessage]:
        window = recency_window(history)
        sent.append(len(window))
        return window

    model = chat_model(gateway, key)
    history: list[BaseMessage] = [SYSTEM, HumanMessage("Weather in Paris?")]
    run_tools(model, history, prepare)
    history.append(HumanMessage("And in Rome?"))
    run_tools(model, history, prepare)
    played = finish(gateway, key, {"reward": 1.0, "output": convert_to_openai_messages(history)})
    return played, sent


def test_each_call_of_the_tool_loop_is_committed_once(tool_loop: Played):
    assert tool_loop.statuses == ["committed"] * 3
    assert tool_loop.committed == tool_loop.call_ids


def test_each_call_after_a_tool_message_continues_the_call_before(tool_loop: Played):
    assert tool_loop.links == chain(tool_loop.call_ids)


def test_the_returned_messages_select_every_call(tool_loop: Played):
    assert tool_loop.selection == tool_loop.call_ids


def test_replay_verify_re_runs_every_decision_of_the_tool_loop_alike(tool_loop: Played):
    assert tool_loop.replay_checks == verified(tool_loop)


def test_the_call_after_trim_messages_is_a_root_whose_history_was_rewritten(
    trimmed: tuple[Played, list[int]],
):
    played, sent = trimmed
    # [S, H1] and [S, H1, AI1, T1] fit; [S, H1, AI1, T1, AI2, H2] is cut to [S, H2], and
    # [S, H1, AI1, T1, AI2, H2, AI3, T3] to [S, H2, AI3, T3]: the third call's own history.
    assert sent == [2, 4, 2, 4]
    first, _, third, _ = played.call_ids
    assert played.links == [
        Link("root", None, "first_call"),
        Link("continuation", first, None),
        Link("root", None, "history_rewritten"),
        Link("continuation", third, None),
    ]


def test_the_untrimmed_returned_history_selects_every_call(trimmed: tuple[Played, list[int]]):
    played, _ = trimmed
    assert played.selection == played.call_ids


def test_replay_verify_re_runs_every_decision_after_a_trim_alike(
    trimmed: tuple[Played, list[int]],
):
    played, _ = trimmed
    assert played.replay_checks == verified(played)


THINKING_CALL = "<think>Look it up.</think>" + PARIS_CALL


def test_chat_completions_drop_reasoning_so_the_next_call_is_a_rewrite(gateway: Gateway):
    key = open_attempt(gateway, "langchain-reasoning")
    gateway.engine.say(THINKING_CALL, "Sunny in Paris.")
    history: list[BaseMessage] = [HumanMessage("Weather in Paris?")]
    run_tools(chat_model(gateway, key), history)
    assert "reasoning_content" not in history[1].additional_kwargs
    assert [c["root_reason"] for c in gateway.status(key)["calls"]] == [
        "first_call",
        "history_rewritten",
    ]


def test_a_history_without_the_dropped_reasoning_cannot_select_its_call(gateway: Gateway):
    key = open_attempt(gateway, "langchain-reasoning-result")
    gateway.engine.say(THINKING_CALL, "Sunny in Paris.")
    history: list[BaseMessage] = [HumanMessage("Weather in Paris?")]
    run_tools(chat_model(gateway, key), history)
    answer = gateway.http.post(
        f"/v1/attempts/{key}/result",
        json={"reward": 1.0, "output": convert_to_openai_messages(history)},
    )
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "selection_refused"
    assert "missing_evidence" in answer.json()["error"]["message"]


def test_the_response_ids_select_calls_whose_reasoning_was_dropped(gateway: Gateway):
    key = open_attempt(gateway, "langchain-reasoning-ids")
    gateway.engine.say(THINKING_CALL, "Sunny in Paris.")
    history: list[BaseMessage] = [HumanMessage("Weather in Paris?")]
    run_tools(chat_model(gateway, key), history)
    response_ids = [m.response_metadata["id"] for m in history if isinstance(m, AIMessage)]
    references = [{"response_id": response_id} for response_id in response_ids]
    played = finish(gateway, key, {"reward": 1.0, "model_calls": references})
    assert played.selection == played.call_ids
    assert played.replay_checks == verified(played)


def test_the_responses_api_sends_reasoning_back_and_continues(gateway: Gateway):
    key = open_attempt(gateway, "langchain-responses")
    gateway.engine.say(THINKING_CALL, "Sunny in Paris.")
    model = chat_model(gateway, key, use_responses_api=True, output_version="responses/v1")
    history: list[BaseMessage] = [HumanMessage("Weather in Paris?")]
    run_tools(model, history)
    assert history[1].content[0]["type"] == "reasoning"
    # LangChain keeps each response's id as its message id.
    references = [{"response_id": m.id} for m in history if isinstance(m, AIMessage)]
    played = finish(gateway, key, {"reward": 1.0, "model_calls": references})
    assert played.links == chain(played.call_ids)
    assert played.selection == played.call_ids
    assert played.replay_checks == verified(played)
