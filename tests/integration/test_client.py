"""``grove.client``: open an attempt, call the model through bound ``openai`` clients, reject a
response, post the result — against a real gateway over HTTP (SQLite, local blobs)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from grove.client import (
    ATTEMPT_TOKEN_HEADER,
    CAPTURE_KEY_HEADER,
    GroveClient,
    GroveClientError,
    reject,
)
from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace

MESSAGES = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def grove(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroveClient]:
    workspace = Workspace.resolve(Path(tmp_path_factory.mktemp("client")))
    server = ServerThread(build_gateway(workspace, settle_timeout_s=5)).start()
    try:
        with GroveClient(f"{server.base_url}/v1") as client:
            yield client
    finally:
        server.stop()


def _open(grove: GroveClient, key: str):
    return grove.open_attempt(key, rollout_id=key, prompt_group="g", rollout_index=0)


def test_a_bound_client_records_its_calls_in_the_attempt(grove: GroveClient) -> None:
    attempt = _open(grove, "bound")
    completion = attempt.openai().chat.completions.create(
        model=grove.model(), messages=MESSAGES, max_tokens=4
    )
    (call,) = attempt.status()["calls"]
    assert (call["status"], call["response_id"]) == ("committed", completion.id)


def test_an_async_bound_client_records_its_calls_in_the_attempt(grove: GroveClient) -> None:
    attempt = _open(grove, "async")

    async def call() -> str:
        async with attempt.async_openai() as llm:
            answer = await llm.chat.completions.create(
                model=grove.model(), messages=MESSAGES, max_tokens=4
            )
            return answer.id

    response_id = asyncio.run(call())
    assert [c["response_id"] for c in attempt.status()["calls"]] == [response_id]


def test_rejecting_a_response_marks_its_call_rejected_by_the_harness(grove: GroveClient) -> None:
    attempt = _open(grove, "rejected")
    completion = attempt.openai().chat.completions.create(
        model=grove.model(), messages=MESSAGES, max_tokens=4
    )
    attempt.reject(completion.id, "too short")
    (call,) = attempt.status()["calls"]
    # the response was served, so the call stays committed; the rejection is its failure reason
    assert (call["status"], call["failure_reason"]) == ("committed", "rejected_by_harness")


def test_reject_works_from_the_bound_openai_client_alone(grove: GroveClient) -> None:
    attempt = _open(grove, "rejected-by-client")
    llm = attempt.openai()
    completion = llm.chat.completions.create(model=grove.model(), messages=MESSAGES, max_tokens=4)
    reject(llm, completion.id)
    assert attempt.status()["calls"][0]["failure_reason"] == "rejected_by_harness"


def test_reject_refuses_a_client_not_bound_to_an_attempt(grove: GroveClient) -> None:
    with pytest.raises(ValueError, match="not bound to an attempt"):
        reject(OpenAI(base_url=grove.base_url, api_key="grove"), "resp-x")


def test_rejecting_an_unknown_response_names_it(grove: GroveClient) -> None:
    attempt = _open(grove, "unknown-response")
    with pytest.raises(GroveClientError, match="served no response 'resp-none'") as caught:
        attempt.reject("resp-none")
    assert caught.value.code == "unknown_response"


def test_posting_the_result_selects_the_returned_calls(grove: GroveClient) -> None:
    attempt = _open(grove, "result")
    completion = attempt.openai().chat.completions.create(
        model=grove.model(), messages=MESSAGES, max_tokens=4
    )
    answer = {"role": "assistant", "content": completion.choices[0].message.content}
    status = attempt.post_result({"output": [*MESSAGES, answer], "reward": 0.5})
    assert status["settled"] is True
    assert status["selection"]["reward"] == 0.5
    assert status["selection"]["call_ids"] == [status["calls"][0]["call_id"]]


def test_a_gateway_refusal_arrives_with_its_code(grove: GroveClient) -> None:
    attempt = _open(grove, "refused")
    attempt.openai().chat.completions.create(model=grove.model(), messages=MESSAGES, max_tokens=4)
    with pytest.raises(GroveClientError) as caught:
        attempt.post_result({"output": [], "reward": 1.0})
    assert caught.value.status == 422
    assert caught.value.code == "selection_refused"


def test_an_attempt_opened_without_policy_or_forest_mode_gets_the_servers(
    grove: GroveClient,
) -> None:
    status = _open(grove, "defaults").status()
    # the schema's defaults (token_capture.selection_policy, token_capture.forest_training)
    assert (status["selection_policy"], status["forest_mode"]) == ("returned_history", False)


def test_an_attempt_naming_a_policy_the_server_does_not_run_is_refused(grove: GroveClient) -> None:
    with pytest.raises(GroveClientError) as caught:
        grove.open_attempt(
            "unregistered", rollout_id="u", prompt_group="g", rollout_index=0,
            selection_policy="os:getcwd",
        )  # fmt: skip
    assert (caught.value.status, caught.value.code) == (400, "unregistered_selection_policy")


def test_reopening_an_attempt_with_the_same_fields_is_idempotent(grove: GroveClient) -> None:
    first = _open(grove, "twice")
    again = _open(grove, "twice")
    assert first.status() == again.status()


def test_the_bound_clients_carry_the_attempts_token(grove: GroveClient) -> None:
    attempt = _open(grove, "token-headers")
    headers = attempt.openai().default_headers
    assert headers[ATTEMPT_TOKEN_HEADER] == attempt.attempt_token
    assert headers[CAPTURE_KEY_HEADER] == "token-headers"
    assert attempt.attempt_token not in repr(attempt)


def test_a_client_without_the_attempts_token_cannot_call_in_it(grove: GroveClient) -> None:
    _open(grove, "token-thief")
    thief = OpenAI(
        base_url=grove.base_url,
        api_key="grove",
        default_headers={CAPTURE_KEY_HEADER: "token-thief"},
    )
    with pytest.raises(openai.AuthenticationError) as caught:
        thief.chat.completions.create(model=grove.model(), messages=MESSAGES, max_tokens=4)
    assert caught.value.code == "missing_attempt_token"


def test_another_client_cannot_take_over_an_open_attempt(grove: GroveClient) -> None:
    _open(grove, "taken")
    with GroveClient(grove.base_url) as other, pytest.raises(GroveClientError) as caught:
        _open(other, "taken")
    assert (caught.value.status, caught.value.code) == (409, "attempt_exists")


def test_a_reward_beyond_the_bound_is_refused_by_the_client(grove: GroveClient) -> None:
    attempt = _open(grove, "huge-reward")
    with pytest.raises(GroveClientError) as caught:
        attempt.post_result({"output": [], "reward": 1e300})
    assert (caught.value.status, caught.value.code) == (422, "reward_out_of_range")
    assert attempt.status()["selection"] is None
