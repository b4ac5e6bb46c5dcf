"""Requests the gateway refuses: a 4xx, an OpenAI-style error body that says why, nothing written.

The official client raises its status errors; ``error.code`` is Grove's code and the message
names the rule. Each refusal is checked against the ledger's event count and the blob count.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai
import pytest

from grove.capture.gateway import CALL_ID_HEADER

from .conftest import CONTEXT, MODEL, Gateway
from .test_completions import USER, ask, observe, reply

RESPONSES_TOOL = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def chat(gateway: Gateway, capture_key: str | None = "att-1", **options: Any) -> Any:
    options.setdefault("messages", [USER])
    options.setdefault("max_tokens", 4)
    return gateway.client(capture_key).chat.completions.create(model=MODEL, **options)


def respond(gateway: Gateway, **options: Any) -> Any:
    options.setdefault("input", "How many apples?")
    return gateway.client().responses.create(model=MODEL, max_output_tokens=4, **options)


def close(gateway: Gateway) -> None:
    assert gateway.http.post("/v1/attempts/att-1/close").status_code == 200


def call_c1(gateway: Gateway) -> None:
    chat(gateway, extra_headers={CALL_ID_HEADER: "c1"})


@dataclass(frozen=True)
class Refusal:
    request: Callable[[Gateway], Any]
    status: int
    code: str
    match: str
    setup: Callable[[Gateway], None] | None = None


REFUSALS = {
    "n_above_one": Refusal(lambda g: chat(g, n=2), 400, "unsupported_n", "n must be 1, got 2"),
    "previous_response_id": Refusal(
        lambda g: respond(g, previous_response_id="resp-earlier"),
        400,
        "unsupported_provider_state",
        "send the whole input",
    ),
    "assistant_prefill": Refusal(
        lambda g: chat(g, messages=[USER, {"role": "assistant", "content": "There are"}]),
        400,
        "assistant_prefill",
        "Assistant prefill is not supported",
    ),
    "prompt_too_long": Refusal(
        lambda g: chat(g, max_tokens=CONTEXT),
        400,
        "prompt_too_long",
        rf"prompts are never truncated.*context is {CONTEXT}",
    ),
    "truncation_auto": Refusal(
        lambda g: respond(g, truncation="auto"), 400, "unsupported_truncation", "never truncated"
    ),
    "unknown_attempt": Refusal(
        lambda g: chat(g, "att-unknown"), 401, "missing_attempt_token", "need its token"
    ),
    "closed_attempt": Refusal(
        lambda g: chat(g), 409, "attempt_closed", "admissions are closed", setup=close
    ),
    "missing_capture_key": Refusal(
        lambda g: chat(g, None), 400, "missing_capture_key", "X-Grove-Capture-Key"
    ),
    "invalid_capture_key": Refusal(
        lambda g: chat(g, "../etc"), 400, "invalid_capture_key", "Invalid stream id"
    ),
    "reused_call_id": Refusal(
        lambda g: call_c1(g), 409, "call_id_reused", "'c1' is already recorded", setup=call_c1
    ),
    "invalid_call_id": Refusal(
        lambda g: chat(g, extra_headers={CALL_ID_HEADER: "a/b"}),
        400,
        "invalid_key",
        "call id",
    ),
    "zero_temperature": Refusal(
        lambda g: chat(g, temperature=0), 400, "invalid_sampling", "temperature: got 0"
    ),
    "zero_max_tokens": Refusal(
        lambda g: chat(g, max_tokens=0), 400, "invalid_sampling", "max_tokens: got 0"
    ),
    "conflicting_max_tokens": Refusal(
        lambda g: chat(g, max_tokens=4, max_completion_tokens=5),
        400,
        "conflicting_max_tokens",
        "disagree",
    ),
    "multi_token_stop": Refusal(
        lambda g: chat(g, stop=["the apples"]),
        400,
        "unsupported_stop",
        r"'the apples' is \d+ tokens",
    ),
    "top_logprobs": Refusal(
        lambda g: chat(g, logprobs=True, top_logprobs=2),
        400,
        "unsupported_top_logprobs",
        "sampled token's logprob only",
    ),
    "unknown_model": Refusal(
        lambda g: g.client().chat.completions.create(model="gpt-4o", messages=[USER]),
        404,
        "model_not_found",
        "'gpt-4o' is not served here",
    ),
    "unknown_field": Refusal(
        lambda g: chat(g, frequency_penalty=0.5),
        400,
        "invalid_request",
        "frequency_penalty: Grove does not accept this field",
    ),
    "empty_input": Refusal(lambda g: respond(g, input=[]), 400, "empty_request", "got 0 items"),
    "tool_choice_required_without_tools": Refusal(
        lambda g: chat(g, tool_choice="required"),
        400,
        "invalid_tool_choice",
        "'required' needs tools",
    ),
    "tool_choice_named_not_offered": Refusal(
        lambda g: respond(g, tools=[RESPONSES_TOOL], tool_choice={"type": "function", "name": "g"}),
        400,
        "invalid_tool_choice",
        "names function 'g', which is not among the tools",
    ),
    "response_format_unsupported_type": Refusal(
        lambda g: chat(g, response_format={"type": "regex"}),
        400,
        "unsupported_response_format",
        "type 'regex' is not supported",
    ),
    "hosted_tool": Refusal(
        lambda g: respond(g, tools=[{"type": "web_search"}]),
        400,
        "unsupported_tool",
        "'web_search': Grove serves function tools only",
    ),
    "include_encrypted_reasoning": Refusal(
        lambda g: respond(g, include=["reasoning.encrypted_content"]),
        400,
        "unsupported_include",
        "'reasoning.encrypted_content' cannot be provided",
    ),
    "responses_top_logprobs": Refusal(
        lambda g: respond(g, top_logprobs=3), 400, "unsupported_top_logprobs", "logprob only"
    ),
}


@pytest.mark.parametrize("name", list(REFUSALS))
def test_a_refused_request_answers_its_status_and_reason_and_writes_nothing(
    local_gateway: Gateway, name: str
):
    refusal = REFUSALS[name]
    local_gateway.open()
    if refusal.setup is not None:
        refusal.setup(local_gateway)
    before = local_gateway.written()
    with pytest.raises(openai.APIStatusError, match=refusal.match) as raised:
        refusal.request(local_gateway)
    assert (raised.value.status_code, raised.value.code) == (refusal.status, refusal.code)
    assert local_gateway.written() == before


def test_equal_candidates_without_an_echoed_id_are_an_ambiguous_parent(local_gateway: Gateway):
    local_gateway.open()
    client = local_gateway.client()
    first, first_headers = ask(client, [USER], seed=5)
    twin, twin_headers = ask(client, [USER], seed=5)
    assert reply(first) == reply(twin)  # same prompt, same seed: two identical calls
    before = local_gateway.written()
    with pytest.raises(openai.ConflictError, match="Ambiguous parent") as raised:
        ask(client, [USER, reply(first), observe("apples=3")])
    assert raised.value.code == "ambiguous_parent"
    assert first_headers["x-grove-call-id"] in str(raised.value)
    assert twin_headers["x-grove-call-id"] in str(raised.value)
    assert local_gateway.written() == before


def test_an_echoed_response_id_picks_the_parent_among_equal_candidates(local_gateway: Gateway):
    local_gateway.open()
    client = local_gateway.client()
    ask(client, [USER], seed=5)
    twin, twin_headers = ask(client, [USER], seed=5)
    echoed = {
        "type": "message",
        "role": "assistant",
        "id": twin.id,
        "content": [{"type": "output_text", "text": twin.choices[0].message.content}],
    }
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=[USER, echoed, observe("apples=3")], max_output_tokens=4
    )
    assert raw.headers["x-grove-parent-call-id"] == twin_headers["x-grove-call-id"]


def test_sampling_the_engine_cannot_honour_is_refused_before_anything_is_written(
    local_gateway: Gateway,
):
    # The embedded engine samples the raw distribution only; the lifecycle asks the engine to
    # check the request before it records the intent.
    local_gateway.open()
    before = local_gateway.written()
    with pytest.raises(openai.BadRequestError, match=r"temperature must be 1\.0") as raised:
        chat(local_gateway, temperature=0.7, extra_headers={CALL_ID_HEADER: "c1"})
    assert raised.value.code == "unsupported_sampling"
    assert local_gateway.written() == before
    assert "c1" not in local_gateway.state().calls


def test_without_max_tokens_the_default_is_capped_to_the_room_left_in_the_context(
    serve_gateway: Callable[..., Gateway],
):
    gateway = serve_gateway(max_context=40, default_max_tokens=100)
    gateway.open()
    completion = gateway.client().chat.completions.create(model=MODEL, messages=[USER])
    usage = completion.usage
    assert usage.completion_tokens <= 40 - usage.prompt_tokens
    assert completion.choices[0].finish_reason == "stop" or usage.total_tokens == 40
