"""Buffered streaming through the official client: the call is captured whole, then sent as SSE.

Chat Completions ``stream=true`` answers with ``chat.completion.chunk`` objects in OpenAI's order
(``capture/streaming.py``), optionally with a final usage chunk; the ledger records the call once.
"""

from __future__ import annotations

from .conftest import MODEL, Gateway
from .test_completions import USER


def test_a_streamed_chat_completion_sends_the_recorded_call_as_chunks(local_gateway: Gateway):
    # The same seeded call twice, plain in att-1 and streamed in att-2: the embedded engine
    # samples the same tokens, so the chunks must carry the plain call's text, and the tokens
    # stored for the streamed call must decode to it.
    gateway = local_gateway
    gateway.open("att-1")
    gateway.open("att-2")
    plain = gateway.client("att-1").chat.completions.create(
        model=MODEL, messages=[USER], max_tokens=8, seed=7
    )
    raw = gateway.client("att-2").chat.completions.with_raw_response.create(
        model=MODEL, messages=[USER], max_tokens=8, seed=7, stream=True
    )
    chunks = list(raw.parse())
    (call,) = gateway.state("att-2").calls.values()
    committed = call.committed
    assert raw.headers["x-grove-call-id"] == call.call_id
    assert {chunk.id for chunk in chunks} == {committed.response_id}
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert text != ""
    assert text == plain.choices[0].message.content
    generated, _ = gateway.generated("att-2", call.call_id)
    content = generated if committed.finish_reason == "length" else generated[:-1]
    assert gateway.service.renderer.decode(content) == text
    assert [c.choices[0].finish_reason for c in chunks][-1] == committed.finish_reason
    assert all(chunk.usage is None for chunk in chunks)


def test_include_usage_ends_the_stream_with_a_usage_chunk_without_choices(local_gateway: Gateway):
    gateway = local_gateway
    gateway.open()
    chunks = list(
        gateway.client().chat.completions.create(
            model=MODEL,
            messages=[USER],
            max_tokens=8,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    (call,) = gateway.state().calls.values()
    last = chunks[-1]
    assert last.choices == []
    assert last.usage.prompt_tokens == call.intended.prompt_tokens
    assert last.usage.completion_tokens == call.committed.generated_len
    assert all(chunk.usage is None for chunk in chunks[:-1])
    assert gateway.service.log.store.count() == 3  # opened, intended, committed: recorded once


def test_the_stream_helper_accumulates_the_same_completion_as_a_plain_call(
    local_scripted_gateway: Gateway,
):
    gateway = local_scripted_gateway
    gateway.open()
    gateway.engine.say("Déjà vu → 日本 😀", "Déjà vu → 日本 😀")
    client = gateway.client()
    plain = client.chat.completions.create(model=MODEL, messages=[USER], max_tokens=40)
    with client.chat.completions.stream(
        model=MODEL, messages=[USER], max_tokens=40, logprobs=True
    ) as stream:
        streamed = stream.get_final_completion()
    assert streamed.choices[0].message.content == plain.choices[0].message.content
    assert streamed.choices[0].message.content == "Déjà vu → 日本 😀"
    assert streamed.choices[0].finish_reason == plain.choices[0].finish_reason == "stop"
    assert [c["response_id"] for c in gateway.status()["calls"]] == [plain.id, streamed.id]
    content = streamed.choices[0].logprobs.content
    assert b"".join(bytes(entry.bytes) for entry in content) == "Déjà vu → 日本 😀".encode()
