"""Model calls through the official openai client: chat, responses, compaction, retries, measure.

The flows that write and read blobs run on every ledger database and blob backend (``gateway``);
the ones whose behaviour cannot depend on the backend run on SQLite and local blobs.
"""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from .conftest import MODEL, Gateway, tokenizer

USER = {"role": "user", "content": "Count the apples in the basket."}


def ask(client: OpenAI, messages: list[dict[str, Any]], **options: Any) -> tuple[Any, Any]:
    """One chat completion and the gateway's answer headers."""
    options.setdefault("max_tokens", 6)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, **options
    )
    return raw.parse(), raw.headers


def reply(completion: Any) -> dict[str, Any]:
    """The assistant message as a harness appends it to its history."""
    return completion.choices[0].message.model_dump()


def observe(text: str) -> dict[str, Any]:
    return {"role": "tool", "content": text}


def test_a_chat_completion_answers_with_the_recorded_call(gateway: Gateway):
    gateway.open()
    completion, headers = ask(gateway.client(), [USER])
    call = gateway.state().calls[headers["x-grove-call-id"]]
    committed = call.committed
    generated, _ = gateway.generated("att-1", call.call_id)
    content = generated[:-1] if committed.finish_reason == "stop" else generated
    assert completion.id == committed.response_id
    assert completion.model == MODEL
    assert completion.choices[0].message.content == tokenizer().decode(content)
    assert completion.choices[0].finish_reason == committed.finish_reason
    assert completion.usage.prompt_tokens == call.intended.prompt_tokens
    assert completion.usage.completion_tokens == committed.generated_len == len(generated)
    assert (headers["x-grove-decision"], headers["x-grove-root-reason"]) == ("root", "first_call")


def test_a_follow_up_with_a_tool_observation_continues_the_previous_call(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    client = gateway.client()
    first, first_headers = ask(client, [USER])
    _, headers = ask(client, [USER, reply(first), observe("apples=3")])
    assert headers["x-grove-decision"] == "continuation"
    assert headers["x-grove-parent-call-id"] == first_headers["x-grove-call-id"]
    calls = gateway.status()["calls"]
    assert [(c["decision"], c["parent_call_id"]) for c in calls] == [
        ("root", None),
        ("continuation", first_headers["x-grove-call-id"]),
    ]


def test_chat_logprobs_are_the_recorded_logprobs_of_the_content_tokens(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    completion, headers = ask(gateway.client(), [USER], logprobs=True, max_tokens=8)
    generated, logprobs = gateway.generated("att-1", headers["x-grove-call-id"])
    content = len(generated) - (completion.choices[0].finish_reason == "stop")
    answered = completion.choices[0].logprobs.content
    assert [entry.logprob for entry in answered] == logprobs[:content]
    assert [entry.token for entry in answered] == [tokenizer().decode([t]) for t in generated][
        :content
    ]


def test_an_echoed_responses_output_item_continues_its_call(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    client = gateway.client()
    first = client.responses.create(
        model=MODEL, instructions="Be brief.", input="How many apples?", max_output_tokens=6
    )
    assert first.output[0].id == first.id
    echoed = [
        {"role": "user", "content": "How many apples?"},
        *[item.model_dump() for item in first.output],
        {"role": "user", "content": "And pears?"},
    ]
    raw = client.responses.with_raw_response.create(
        model=MODEL, instructions="Be brief.", input=echoed, max_output_tokens=6
    )
    second = raw.parse()
    first_call = gateway.status()["calls"][0]
    assert first_call["response_id"] == first.id
    assert raw.headers["x-grove-decision"] == "continuation"
    assert raw.headers["x-grove-parent-call-id"] == first_call["call_id"]
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens


def test_a_streamed_response_iterates_the_standard_events_of_the_whole_text(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    stream = gateway.client().responses.create(
        model=MODEL, input="How many apples?", max_output_tokens=6, stream=True
    )
    events = list(stream)
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event.sequence_number for event in events] == list(range(9))
    final = events[-1].response
    assert events[4].delta == events[5].text == final.output_text
    assert [c["response_id"] for c in gateway.status()["calls"]] == [final.id]


def test_a_compaction_roots_a_new_segment(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    client = gateway.client()
    history = [USER]
    for turn in range(3):
        completion, _ = ask(client, history)
        history += [reply(completion), observe(f"apples={turn}")]
    compacted = [{"role": "user", "content": "Summary: three apples so far. Continue."}]
    summary, summary_headers = ask(client, compacted)
    _, headers = ask(client, [*compacted, reply(summary), observe("apples=4")])
    assert summary_headers["x-grove-decision"] == "root"
    assert summary_headers["x-grove-root-reason"] == "history_rewritten"
    assert headers["x-grove-parent-call-id"] == summary_headers["x-grove-call-id"]
    roots = [c["root_reason"] for c in gateway.status()["calls"] if c["decision"] == "root"]
    assert roots == ["first_call", "history_rewritten"]


def test_a_rejected_response_and_its_resample_are_siblings(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    client = gateway.client()
    first, first_headers = ask(client, [USER])
    request = [USER, reply(first), observe("apples=3")]
    _, rejected = ask(client, request)
    answer = gateway.http.post(
        f"/v1/attempts/att-1/calls/{rejected['x-grove-call-id']}/reject",
        json={"detail": "the guard refused the answer"},
    )
    _, resampled = ask(client, request)
    assert answer.status_code == 200, answer.text
    parent = first_headers["x-grove-call-id"]
    assert rejected["x-grove-parent-call-id"] == resampled["x-grove-parent-call-id"] == parent
    calls = {c["call_id"]: c for c in gateway.status()["calls"]}
    assert calls[rejected["x-grove-call-id"]]["failure_reason"] == "rejected_by_harness"
    assert calls[resampled["x-grove-call-id"]]["failure_reason"] is None


def test_measure_returns_the_decision_and_prompt_length_and_writes_nothing(gateway: Gateway):
    gateway.open()
    client = gateway.client()
    first, first_headers = ask(client, [USER])
    request = [USER, reply(first), observe("apples=3")]
    before = gateway.written()
    measured = gateway.http.post(
        "/v1/attempts/att-1/measure", json={"model": MODEL, "messages": request, "max_tokens": 6}
    )
    assert gateway.written() == before
    completion, _ = ask(client, request)
    assert measured.status_code == 200, measured.text
    assert measured.json() == {
        "prompt_tokens": completion.usage.prompt_tokens,
        "decision": "continuation",
        "parent_call_id": first_headers["x-grove-call-id"],
        "reason": None,
    }


def test_a_result_settles_the_attempt_and_records_the_selection(gateway: Gateway):
    gateway.open()
    client = gateway.client()
    first, _ = ask(client, [USER])
    second, _ = ask(client, [USER, reply(first), observe("apples=3")])
    answer = gateway.http.post(
        "/v1/attempts/att-1/result",
        json={"reward": 0.75, "output": [USER, reply(first), observe("apples=3"), reply(second)]},
    )
    assert answer.status_code == 200, answer.text
    status = answer.json()
    assert (status["closed"], status["settled"], status["timed_out"]) == (True, True, False)
    assert status["selection"] == {
        "policy": "returned_history",
        "call_ids": [c["call_id"] for c in status["calls"]],
        "terminal_response_id": second.id,
        "reward": 0.75,
    }


def test_measure_takes_a_responses_body_as_well(local_gateway: Gateway):
    local_gateway.open()
    body = {"model": MODEL, "instructions": "Be brief.", "input": "How many apples?"}
    measured = local_gateway.http.post("/v1/attempts/att-1/measure", json=body)
    response = local_gateway.client().responses.create(**body, max_output_tokens=4)
    assert measured.json() == {
        "prompt_tokens": response.usage.input_tokens,
        "decision": "root",
        "parent_call_id": None,
        "reason": "first_call",
    }
