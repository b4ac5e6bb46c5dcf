"""The official ``anthropic`` client on ``POST /v1/messages``: a tool loop, streamed and not.

The agent is the loop the client's documentation teaches: send the messages with the tools,
append the answer's ``content`` as the assistant turn, answer each ``tool_use`` block with a
``tool_result`` block in the next user turn, and send again until the model stops without a tool
call. The scripted model thinks, calls a tool, thinks and calls another, then answers: three
calls, each continuing the one before from its exact tokens. Then the agent compacts: it sends a
summary of its history as a new conversation, which starts a new root. Its result names the
calls by the answers' Message ids, or returns its history in the Messages form (each assistant
turn with its ``response_id``, or each answer sent back as the whole Message).
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Iterator, Sequence
from typing import Any

import anthropic
import pytest

from grove.capture.engine import Generation, SamplingParams
from grove.client import ATTEMPT_TOKEN_HEADER, CAPTURE_KEY_HEADER, GroveClient, anthropic_client
from tests.integration.gateway.support import MODEL, Gateway, ScriptedEngine, engine

from .attempts import Link, Played, chain, finish, open_attempt
from .conftest import served
from .weather import SCRIPT, USER, WEATHER_IN

pytestmark = pytest.mark.xdist_group("frameworks-anthropic")

WEATHER: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SUMMARY = "Rome is warmer."


def bound(gateway: Gateway, capture_key: str) -> anthropic.Anthropic:
    """The official client pointed at the gateway's root, bound to the attempt by its headers."""
    headers = {CAPTURE_KEY_HEADER: capture_key, ATTEMPT_TOKEN_HEADER: gateway.token(capture_key)}
    return anthropic.Anthropic(
        base_url=gateway.base_url, api_key="unused", default_headers=headers, max_retries=0
    )


def agent(client: anthropic.Anthropic, *, stream: bool) -> list[anthropic.types.Message]:
    """The tool loop, then one compaction; the Messages it was answered, in order."""
    return conversation(client, stream=stream)[0]


def conversation(
    client: anthropic.Anthropic, *, stream: bool
) -> tuple[list[anthropic.types.Message], list[dict[str, Any]]]:
    """The tool loop, then one compaction: the Messages it was answered, in order, and its
    history in the Messages form (the turns sent, then the compacted conversation), each
    assistant turn naming its Message by ``response_id``."""
    messages: list[dict[str, Any]] = [USER]
    history: list[dict[str, Any]] = [USER]
    answers = []
    while True:
        if stream:
            with client.messages.stream(
                model=MODEL, max_tokens=64, messages=messages, tools=[WEATHER]
            ) as events:
                message = events.get_final_message()
        else:
            message = client.messages.create(
                model=MODEL, max_tokens=64, messages=messages, tools=[WEATHER]
            )
        answers.append(message)
        messages.append({"role": "assistant", "content": message.content})
        history.append(assistant_turn(message))
        calls = [block for block in message.content if block.type == "tool_use"]
        if not calls:
            break
        results = [
            {"type": "tool_result", "tool_use_id": c.id, "content": WEATHER_IN[c.input["city"]]}
            for c in calls
        ]
        messages.append({"role": "user", "content": results})
        history.append(messages[-1])
    compacted = [{"role": "user", "content": "Notes: Paris 21 C, Rome 25 C. Summarize."}]
    summary = client.messages.create(
        model=MODEL, max_tokens=64, messages=compacted, tools=[WEATHER]
    )
    answers.append(summary)
    history += [*compacted, assistant_turn(summary)]
    return answers, history


def assistant_turn(message: anthropic.types.Message) -> dict[str, Any]:
    """The answer as the assistant turn of a returned history, naming its Message."""
    content = [block.model_dump(exclude_none=True) for block in message.content]
    return {"role": "assistant", "content": content, "response_id": message.id}


@pytest.fixture(scope="module", params=["plain", "streamed"])
def played(gateway: Gateway, request: pytest.FixtureRequest) -> tuple[Played, list[Any]]:
    key = open_attempt(gateway, f"anthropic-{request.param}")
    gateway.engine.say(*SCRIPT, SUMMARY)
    answers = agent(bound(gateway, key), stream=request.param == "streamed")
    references = [{"response_id": message.id} for message in answers]
    return finish(gateway, key, {"reward": 1.0, "model_calls": references}), answers


def whole_messages(
    history: list[dict[str, Any]], answers: list[anthropic.types.Message]
) -> list[Any]:
    """``history`` with each assistant turn replaced by its whole Message, as the client
    returned it (the Message's ``id`` names the call)."""
    messages = iter(answers)
    return [
        next(messages).model_dump(mode="json") if turn["role"] == "assistant" else turn
        for turn in history
    ]


@pytest.fixture(scope="module", params=["response_ids", "whole_messages"])
def returned(gateway: Gateway, request: pytest.FixtureRequest) -> Played:
    """The agent's attempt after a result whose ``output`` is its Messages history."""
    key = open_attempt(gateway, f"anthropic-history-{request.param}")
    gateway.engine.say(*SCRIPT, SUMMARY)
    answers, history = conversation(bound(gateway, key), stream=False)
    if request.param == "whole_messages":
        history = whole_messages(history, answers)
    return finish(gateway, key, {"reward": 1.0, "output": history})


def test_a_returned_messages_history_selects_every_call(returned: Played) -> None:
    assert returned.selection == returned.call_ids
    assert {outcome for _, _, outcome in returned.replay_checks} == {"same"}


def test_a_messages_history_that_names_another_response_is_refused(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-history-wrong-id")
    gateway.engine.say(*SCRIPT, SUMMARY)
    answers, history = conversation(bound(gateway, key), stream=False)
    last = history[-1]
    history[-1] = {**last, "response_id": answers[0].id}  # the first answer's id
    answer = gateway.http.post(
        f"/v1/attempts/{key}/result", json={"reward": 1.0, "output": history}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "selection_refused"
    assert "no returned span containing it equals that call's whole generation" in answer.text
    assert gateway.status(key)["selection"] is None


def test_a_history_turn_with_a_refused_block_is_no_evidence_and_selects_nothing(
    gateway: Gateway,
) -> None:
    key = open_attempt(gateway, "anthropic-history-refused-block")
    gateway.engine.say(*SCRIPT, SUMMARY)
    _, history = conversation(bound(gateway, key), stream=False)
    redacted = {"type": "redacted_thinking", "data": "x"}
    history[1] = {**history[1], "content": [redacted, *history[1]["content"]]}
    answer = gateway.http.post(
        f"/v1/attempts/{key}/result", json={"reward": 1.0, "output": history}
    )
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == "selection_refused"
    assert "'contradictory_evidence'" in answer.text  # the turn is not the call's generation
    assert gateway.status(key)["selection"] is None


def test_the_answers_carry_thinking_tool_use_and_text_blocks(
    played: tuple[Played, list[Any]],
) -> None:
    _, answers = played
    first = answers[0]
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    assert first.content[0].thinking == "Paris first."
    assert (first.content[1].name, first.content[1].input) == ("get_weather", {"city": "Paris"})
    assert first.stop_reason == "tool_use"
    assert [block.type for block in answers[2].content] == ["thinking", "text"]
    assert answers[2].content[1].text == "It is warmer in Rome."
    assert answers[2].stop_reason == "end_turn"


def test_every_call_is_committed_once(played: tuple[Played, list[Any]]) -> None:
    attempt, _ = played
    assert attempt.statuses == ["committed"] * 4
    assert attempt.committed == attempt.call_ids


def test_echoed_turns_continue_and_the_compacted_history_starts_a_new_root(
    played: tuple[Played, list[Any]],
) -> None:
    attempt, _ = played
    assert attempt.links == [
        *chain(attempt.call_ids[:3]),
        Link("root", None, "history_rewritten"),
    ]


def test_the_message_ids_select_every_call(played: tuple[Played, list[Any]]) -> None:
    attempt, _ = played
    assert attempt.selection == attempt.call_ids


def test_replay_verifies_every_decision(played: tuple[Played, list[Any]]) -> None:
    attempt, _ = played
    assert {outcome for _, _, outcome in attempt.replay_checks} == {"same"}


def test_usage_counts_the_prompt_and_the_generated_tokens(
    played: tuple[Played, list[Any]],
) -> None:
    _, answers = played
    assert all(m.usage.input_tokens > 0 and m.usage.output_tokens > 0 for m in answers)


def test_an_image_block_is_refused_as_a_bad_request_and_nothing_is_written(
    gateway: Gateway,
) -> None:
    key = open_attempt(gateway, "anthropic-image")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    with pytest.raises(anthropic.BadRequestError, match="unsupported_content") as raised:
        bound(gateway, key).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [image]}]
        )
    assert raised.value.body["type"] == "error"  # type: ignore[index]
    assert raised.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
    assert gateway.status(key)["calls"] == []


def test_a_text_block_whose_text_is_no_string_is_refused_and_nothing_is_written(
    gateway: Gateway,
) -> None:
    key = open_attempt(gateway, "anthropic-number-text")
    blocks = [{"type": "text", "text": 2147483647}, {"type": "text", "text": "a"}]
    with pytest.raises(anthropic.BadRequestError, match="text must be a string"):
        bound(gateway, key).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[{"role": "user", "content": blocks}],
        )
    assert gateway.status(key)["calls"] == []


def test_prompt_caching_is_refused_and_nothing_is_written(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-cache")
    block = {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}
    with pytest.raises(anthropic.BadRequestError, match="prompt caching is not supported"):
        bound(gateway, key).messages.create(
            model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [block]}]
        )
    assert gateway.status(key)["calls"] == []


def test_a_server_tool_is_refused(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-server-tool")
    tool = {"type": "web_search_20250305", "name": "web_search"}
    with pytest.raises(anthropic.BadRequestError, match="server tools are not available"):
        bound(gateway, key).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[USER],
            tools=[tool],  # type: ignore[list-item]
        )
    assert gateway.status(key)["calls"] == []


def test_another_model_is_not_found(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-model")
    with pytest.raises(anthropic.NotFoundError, match="model_not_found"):
        bound(gateway, key).messages.create(model="claude-x", max_tokens=8, messages=[USER])


def test_a_wrong_attempt_token_is_an_authentication_error(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-token")
    client = anthropic.Anthropic(
        base_url=gateway.base_url,
        api_key="unused",
        default_headers={CAPTURE_KEY_HEADER: key, ATTEMPT_TOKEN_HEADER: "wrong"},
        max_retries=0,
    )
    with pytest.raises((anthropic.AuthenticationError, anthropic.PermissionDeniedError)):
        client.messages.create(model=MODEL, max_tokens=8, messages=[USER])
    assert gateway.status(key)["calls"] == []


def test_a_thinking_budget_not_below_max_tokens_is_refused(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-thinking")
    with pytest.raises(anthropic.BadRequestError, match="budget_tokens"):
        bound(gateway, key).messages.create(
            model=MODEL,
            max_tokens=8,
            messages=[USER],
            thinking={"type": "enabled", "budget_tokens": 8},
        )
    assert gateway.status(key)["calls"] == []


def test_a_tool_error_result_reaches_the_model_marked_as_an_error(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-tool-error")
    gateway.engine.say(SCRIPT[0], "Paris is unknown.")
    client = bound(gateway, key)
    first = client.messages.create(model=MODEL, max_tokens=64, messages=[USER], tools=[WEATHER])
    call: Any = first.content[1]
    failed = {"type": "tool_result", "tool_use_id": call.id, "content": "no data", "is_error": True}
    messages: list[Any] = [
        USER,
        {"role": "assistant", "content": first.content},
        {"role": "user", "content": [failed]},
    ]
    client.messages.create(model=MODEL, max_tokens=64, messages=messages, tools=[WEATHER])
    calls = gateway.status(key)["calls"]
    assert [c["decision"] for c in calls] == ["root", "continuation"]
    prompt = gateway.service.renderer.decode(gateway.engine.prompts[-1])
    assert "Error: no data" in prompt


def test_a_messages_call_continues_a_chat_call_of_its_attempt(gateway: Gateway) -> None:
    key = open_attempt(gateway, "anthropic-after-chat")
    gateway.engine.say(SCRIPT[0], "Paris is sunny.")
    function = {"name": "get_weather", "description": WEATHER["description"]}
    tool = {"type": "function", "function": {**function, "parameters": WEATHER["input_schema"]}}
    chat = gateway.client(key).chat.completions.create(
        model=MODEL, messages=[USER], tools=[tool], max_tokens=64
    )
    message: Any = chat.choices[0].message
    (call,) = message.tool_calls
    echoed = [
        {"type": "thinking", "thinking": message.reasoning_content, "signature": ""},
        {
            "type": "tool_use",
            "id": call.id,
            "name": call.function.name,
            "input": json.loads(call.function.arguments),
        },
    ]
    result = {"type": "tool_result", "tool_use_id": call.id, "content": WEATHER_IN["Paris"]}
    turns: Any = [
        USER,
        {"role": "assistant", "content": echoed},
        {"role": "user", "content": [result]},
    ]
    bound(gateway, key).messages.create(model=MODEL, max_tokens=64, messages=turns, tools=[WEATHER])
    calls = gateway.status(key)["calls"]
    assert [(c["decision"], c["parent_call_id"]) for c in calls] == [
        ("root", None),
        ("continuation", calls[0]["call_id"]),
    ]


def test_concurrent_attempts_are_captured_apart(gateway: Gateway) -> None:
    keys = [open_attempt(gateway, "anthropic-concurrent") for _ in range(4)]
    gateway.engine.say(*["A short answer."] * 4)

    def call(key: str) -> str:
        answer = bound(gateway, key).messages.create(model=MODEL, max_tokens=16, messages=[USER])
        return answer.id

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        ids = list(pool.map(call, keys))
    assert len(set(ids)) == 4
    assert [len(gateway.status(key)["calls"]) for key in keys] == [1, 1, 1, 1]


def test_an_attempt_of_grove_client_binds_the_anthropic_client(gateway: Gateway) -> None:
    gateway.engine.say("Bound.")
    with GroveClient(f"{gateway.base_url}/v1") as grove:
        attempt = grove.open_attempt(
            "anthropic-bound", rollout_id="anthropic-bound", prompt_group="g0", rollout_index=0
        )
        answer = attempt.anthropic().messages.create(model=MODEL, max_tokens=8, messages=[USER])
        assert answer.content[0].type == "text"
        assert [c["response_id"] for c in attempt.status()["calls"]] == [answer.id]


def test_the_anthropic_client_of_a_bound_openai_client_shares_its_attempt(
    gateway: Gateway,
) -> None:
    gateway.engine.say("Bound.")
    with GroveClient(f"{gateway.base_url}/v1") as grove:
        attempt = grove.open_attempt(
            "anthropic-shared", rollout_id="anthropic-shared", prompt_group="g0", rollout_index=0
        )
        with attempt.openai() as handed, anthropic_client(handed) as client:
            answer = client.messages.create(model=MODEL, max_tokens=8, messages=[USER])
        assert [c["response_id"] for c in attempt.status()["calls"]] == [answer.id]


class StoppingEngine(ScriptedEngine):
    """The scripted engine, ending each answer at its first stop token as a real engine does."""

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        scripted = super().generate(prompt_token_ids, sampling)
        stops = set(sampling.stop_token_ids)
        ends = [n + 1 for n, token in enumerate(scripted.token_ids) if token in stops]
        if not ends:
            return scripted
        return Generation(scripted.token_ids[: ends[0]], scripted.logprobs[: ends[0]], "stop")


@pytest.fixture(scope="module")
def stopping(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A gateway whose scripted engine stops at the call's stop sequences."""
    with served(tmp_path_factory.mktemp("stopping"), StoppingEngine(engine())) as running:
        yield running


def test_an_answer_ended_by_a_stop_sequence_names_it(stopping: Gateway) -> None:
    key = open_attempt(stopping, "anthropic-stop-sequence")
    stopping.engine.say("It is warmer in Rome. Paris is cooler.")
    answer = bound(stopping, key).messages.create(
        model=MODEL, max_tokens=32, messages=[USER], stop_sequences=["."]
    )
    assert (answer.stop_reason, answer.stop_sequence) == ("stop_sequence", ".")
    assert [block.type for block in answer.content] == ["text"]
    assert answer.content[0].text == "It is warmer in Rome"  # type: ignore[union-attr]
