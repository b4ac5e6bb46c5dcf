"""A fork's source conversation, as the gateway answers it (docs/fork.md, "The conversation").

Each call's blob records the conversation items it adds (its request's new items and its own
answer), so the gateway rebuilds the conversation of a fork's source call from the source chain's
blobs: the harness sends it again, with its next observation, and continues the source call.
"""

from __future__ import annotations

import json
from typing import Any

from grove.capture.conversations import (
    chain_conversation,
    messages_conversation,
    responses_input,
)
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from grove.ledger.events import SourceCall
from grove.storage import CallDelta, staging_key

from .conftest import MODEL, Gateway
from .test_completions import USER, ask, observe, reply
from .test_forks import _fork
from .test_tool_calls import ANSWER, CALL, THINK, WEATHER, chat


def _assistant(completion: Any) -> dict[str, Any]:
    """A text answer as the blob records it: normalized (no None fields)."""
    return {"role": "assistant", "content": completion.choices[0].message.content}


def test_a_forks_opening_answers_the_source_calls_whole_conversation(gateway: Gateway):
    gateway.open("src")
    client = gateway.client("src")
    first, _ = ask(client, [USER], extra_headers={CALL_ID_HEADER: "c1"})
    second, _ = ask(
        client, [USER, reply(first), observe("apples=3")], extra_headers={CALL_ID_HEADER: "c2"}
    )
    answer = _fork(gateway, "fork-1", "src", "c2").json()
    assert answer["fork_from"]["messages"] == [
        USER,
        _assistant(first),
        observe("apples=3"),
        _assistant(second),
    ]


def test_the_answered_conversation_sent_again_continues_the_source_call(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open("src")
    ask(gateway.client("src"), [USER], extra_headers={CALL_ID_HEADER: "c1"})
    messages = _fork(gateway, "fork-1", "src", "c1").json()["fork_from"]["messages"]
    _, headers = ask(gateway.client("fork-1"), [*messages, observe("apples=4")])
    call = gateway.state("fork-1").calls[headers["x-grove-call-id"]]
    assert (call.parent_call_id, call.intended.source_capture_key) == ("c1", "src")


def test_a_tool_call_comes_back_with_its_id_and_its_arguments_as_a_json_string(
    local_scripted_gateway: Gateway,
):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(THINK + CALL, ANSWER)
    first, headers = chat(gateway, [{"role": "user", "content": "Weather in Paris?"}])
    sent = first.choices[0].message.tool_calls[0]
    answer = _fork(gateway, "fork-1", "att-1", headers["x-grove-call-id"]).json()
    [_, assistant] = answer["fork_from"]["messages"]
    [tool_call] = assistant["tool_calls"]
    assert tool_call["id"] == sent.id
    assert tool_call["function"]["name"] == "get_weather"
    assert json.loads(tool_call["function"]["arguments"]) == {"city": "Paris", "unit": "C"}
    observation = {"role": "tool", "tool_call_id": sent.id, "content": "sunny, 21 C"}
    follow = gateway.client("fork-1").chat.completions.with_raw_response.create(
        model=MODEL, messages=[*answer["fork_from"]["messages"], observation], tools=[WEATHER]
    )
    assert (follow.headers["x-grove-decision"], follow.headers["x-grove-parent-call-id"]) == (
        "continuation",
        headers["x-grove-call-id"],
    )


def test_a_fork_of_a_forks_conversation_runs_through_both_sources(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open("src")
    first, _ = ask(gateway.client("src"), [USER], extra_headers={CALL_ID_HEADER: "c1"})
    source = _fork(gateway, "fork-1", "src", "c1").json()["fork_from"]["messages"]
    forked, _ = ask(
        gateway.client("fork-1"),
        [*source, observe("apples=4")],
        extra_headers={CALL_ID_HEADER: "f1"},
    )
    answer = _fork(gateway, "fork-2", "fork-1", "f1").json()
    assert answer["fork_from"]["messages"] == [
        USER,
        _assistant(first),
        observe("apples=4"),
        _assistant(forked),
    ]


def test_a_chain_with_a_blob_that_records_no_conversation_has_none(local_gateway: Gateway):
    blobs = local_gateway.service.blobs
    ref = blobs.put_delta(staging_key("old", "c1"), CallDelta.from_lists([1, 2], [3], [-0.5]))
    chain = [
        SourceCall(
            capture_key="old",
            call_id="c1",
            blob_key=ref.key,
            blob_sha256=ref.sha256,
            blob_bytes=ref.size,
            chain_digest="0" * 64,
            finish_reason="stop",
            response_id="resp-old",
            output_fingerprint="0" * 64,
        )
    ]
    assert chain_conversation(blobs, chain) is None


def test_a_responses_source_continues_from_its_input_items_sent_again(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open("src")
    first = gateway.client("src").responses.create(
        model=MODEL, instructions="Be brief.", input="How many apples?", max_output_tokens=6
    )
    call_id = gateway.status("src")["calls"][0]["call_id"]
    forked = _fork(gateway, "fork-1", "src", call_id).json()["fork_from"]
    assert forked["input"][:2] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "How many apples?"},
    ]
    assert forked["input"][2]["content"][0]["text"] == first.output_text
    raw = gateway.client("fork-1").responses.with_raw_response.create(
        model=MODEL,
        input=[*forked["input"], {"role": "user", "content": "And pears?"}],
        max_output_tokens=6,
    )
    assert (raw.headers["x-grove-decision"], raw.headers["x-grove-parent-call-id"]) == (
        "continuation",
        call_id,
    )


MESSAGES_WEATHER = {"name": "get_weather", "input_schema": {"type": "object"}}  # short: 256 tokens


def _messages_call(gateway: Gateway, capture_key: str, messages: list) -> Any:
    body = {"model": MODEL, "max_tokens": 40, "messages": messages, "tools": [MESSAGES_WEATHER]}
    answer = gateway.http.post("/v1/messages", json=body, headers={CAPTURE_KEY_HEADER: capture_key})
    assert answer.status_code == 200, answer.text
    return answer


def test_a_messages_source_continues_from_its_messages_api_form_sent_again(
    local_scripted_gateway: Gateway,
):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(CALL)
    question = {"role": "user", "content": "Weather in Paris?"}
    first = _messages_call(gateway, "att-1", [question])
    use = first.json()["content"][-1]
    call_id = first.headers["x-grove-call-id"]
    forked = _fork(gateway, "fork-1", "att-1", call_id).json()["fork_from"]
    conversation = forked["messages_api"]
    assert conversation["messages"][1]["content"][-1] == {
        "type": "tool_use",
        "id": use["id"],
        "name": "get_weather",
        "input": {"city": "Paris", "unit": "C"},
    }
    result = {"type": "tool_result", "tool_use_id": use["id"], "content": "sunny, 21 C"}
    gateway.engine.say(ANSWER)
    turns = [*conversation["messages"], {"role": "user", "content": [result]}]
    answer = _messages_call(gateway, "fork-1", turns)
    assert (answer.headers["x-grove-decision"], answer.headers["x-grove-parent-call-id"]) == (
        "continuation",
        call_id,
    )


def test_a_conversation_with_a_late_system_message_has_no_messages_api_form():
    normalized = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "a rule set mid-way"},
    ]
    assert messages_conversation(normalized) is None
    assert responses_input(normalized) == normalized
