"""What OpenAI clients send besides the model call, and the gateway's answers to what is wrong.

The OpenAI Agents SDK sends ``include: []`` on every Responses request, and clients commonly send
``metadata`` and ``store``: harmless fields are accepted (``metadata`` is echoed by Responses),
an ``include`` Grove cannot honour is refused naming the value. Logprob bytes are each token's
exact bytes. Unknown routes and malformed bodies answer with the gateway's error object.
"""

from __future__ import annotations

from .conftest import MODEL, Gateway
from .test_completions import USER

TEXT = "Déjà vu → 日本 😀"


def test_empty_include_metadata_and_store_are_accepted_on_both_endpoints(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    client = gateway.client()
    response = client.responses.create(
        model=MODEL,
        input="How many apples?",
        max_output_tokens=4,
        include=[],
        metadata={"run": "r1"},
        store=False,
    )
    completion = client.chat.completions.create(
        model=MODEL, messages=[USER], max_tokens=4, metadata={"run": "r1"}, store=True
    )
    assert response.metadata == {"run": "r1"}
    assert [c["response_id"] for c in gateway.status()["calls"]] == [response.id, completion.id]


def test_included_output_text_logprobs_are_the_recorded_ones(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(TEXT)
    raw = gateway.client().responses.with_raw_response.create(
        model=MODEL, input="Say it.", max_output_tokens=40, include=["message.output_text.logprobs"]
    )
    part = raw.parse().output[0].content[0]
    _, logprobs = gateway.generated("att-1", raw.headers["x-grove-call-id"])
    assert [entry.logprob for entry in part.logprobs] == logprobs[:-1]
    assert b"".join(bytes(entry.bytes) for entry in part.logprobs) == TEXT.encode()


def test_logprob_bytes_of_a_multi_byte_text_join_to_its_utf8(local_scripted_gateway: Gateway):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say(TEXT)
    completion = gateway.client().chat.completions.create(
        model=MODEL, messages=[USER], max_tokens=40, logprobs=True
    )
    entries = completion.choices[0].logprobs.content
    assert completion.choices[0].message.content == TEXT
    assert b"".join(bytes(entry.bytes) for entry in entries) == TEXT.encode()
    # A token inside a multi-byte character shows U+FFFD as text, but its own bytes.
    partial = [entry for entry in entries if entry.token == "\ufffd"]
    assert partial and all(entry.bytes != list("\ufffd".encode()) for entry in partial)


def test_an_unknown_route_answers_the_error_object(local_gateway: Gateway):
    answer = local_gateway.http.get("/v1/responses/resp-1")
    assert answer.status_code == 404
    error = answer.json()["error"]
    assert error["code"] == "not_found"
    assert "GET /v1/responses/resp-1" in error["message"]
    wrong_method = local_gateway.http.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


def test_malformed_json_is_refused_with_its_position_in_the_message(local_gateway: Gateway):
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post(
        "/v1/chat/completions",
        content=b'{"model": "m",, "messages": []}',
        headers={"Content-Type": "application/json", "X-Grove-Capture-Key": "att-1"},
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", None)
    assert "not valid JSON" in error["message"] and "at character 14" in error["message"]
    assert local_gateway.written() == before
