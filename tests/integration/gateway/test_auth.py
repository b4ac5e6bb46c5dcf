"""Optional bearer-token auth: the openai client's api_key is the token."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from .conftest import MODEL, Gateway
from .test_completions import USER


@pytest.fixture
def guarded(serve_gateway: Callable[..., Gateway]) -> Gateway:
    gateway = serve_gateway(auth_token="s3cret")
    assert gateway.http.post(
        "/v1/attempts",
        json={"capture_key": "att-1", "rollout_id": "r", "prompt_group": "g", "rollout_index": 0},
        headers={"Authorization": "Bearer s3cret"},
    ).is_success
    return gateway


def test_a_request_without_the_token_is_unauthorized(guarded: Gateway):
    answer = guarded.http.get("/v1/attempts/att-1")
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert answer.json()["error"]["type"] == "authentication_error"


def test_a_client_with_a_wrong_token_is_unauthorized_and_writes_nothing(guarded: Gateway):
    before = guarded.written()
    with pytest.raises(openai.AuthenticationError, match="Bearer <token>") as raised:
        guarded.client(api_key="wrong").chat.completions.create(
            model=MODEL, messages=[USER], max_tokens=4
        )
    assert raised.value.code == "invalid_api_key"
    assert guarded.written() == before


def test_a_client_with_the_token_is_served(guarded: Gateway):
    completion = guarded.client(api_key="s3cret").chat.completions.create(
        model=MODEL, messages=[USER], max_tokens=4
    )
    assert completion.usage.completion_tokens >= 1


@pytest.mark.parametrize("path", ["/health", "/openapi.json"])
def test_health_and_the_schema_stay_open(guarded: Gateway, path: str):
    assert guarded.http.get(path).status_code == 200


def test_without_a_token_any_client_is_served(local_gateway: Gateway):
    assert local_gateway.http.get("/v1/models").json()["data"][0]["id"] == MODEL
