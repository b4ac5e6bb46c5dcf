"""Attempt tokens over real HTTP: opening an attempt answers its secret, every later request on it
must carry it, and a request without it (401) or with another (403) writes and reveals nothing
(``capture/capabilities.py``, ``docs/security.md``)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import httpx
import pytest

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER, attempt_token_digest
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER

from .conftest import MODEL, Gateway
from .test_completions import USER

OPENING = {
    "capture_key": "att-1",
    "rollout_id": "r-att-1",
    "prompt_group": "g0",
    "rollout_index": 0,
}
CHAT = {"model": MODEL, "messages": [USER], "max_tokens": 4}
WRONG = "w" * 43  # a well-formed token that is no attempt's

Send = Callable[[httpx.Client, dict[str, str]], httpx.Response]

ACTIONS: dict[str, Send] = {
    "chat_completion": lambda http, headers: http.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={CAPTURE_KEY_HEADER: "att-1", CALL_ID_HEADER: "c9", **headers},
    ),
    "response": lambda http, headers: http.post(
        "/v1/responses",
        json={"model": MODEL, "input": "Count the apples.", "max_output_tokens": 4},
        headers={CAPTURE_KEY_HEADER: "att-1", **headers},
    ),
    "reject": lambda http, headers: http.post(
        "/v1/attempts/att-1/calls/c0/reject", json={"detail": "no"}, headers=headers
    ),
    "close": lambda http, headers: http.post("/v1/attempts/att-1/close", headers=headers),
    "result": lambda http, headers: http.post(
        "/v1/attempts/att-1/result", json={"reward": 1e300, "output": []}, headers=headers
    ),
    "measure": lambda http, headers: http.post(
        "/v1/attempts/att-1/measure", json=CHAT, headers=headers
    ),
    "status": lambda http, headers: http.get("/v1/attempts/att-1", headers=headers),
}


@pytest.fixture
def opened(local_gateway: Gateway) -> Gateway:
    """A gateway with attempt ``att-1`` open and one committed call ``c0``."""
    local_gateway.open()
    call = local_gateway.http.post(
        "/v1/chat/completions",
        json=CHAT,
        headers={CAPTURE_KEY_HEADER: "att-1", CALL_ID_HEADER: "c0"},
    )
    assert call.status_code == 200, call.text
    return local_gateway


def test_opening_an_attempt_answers_a_fresh_url_safe_token(local_gateway: Gateway):
    first = local_gateway.open("att-1")["attempt_token"]
    second = local_gateway.open("att-2")["attempt_token"]
    assert re.fullmatch(r"[A-Za-z0-9_-]{43}", first)
    assert first != second


def test_the_ledger_records_the_token_digest_never_the_token(local_gateway: Gateway):
    token = local_gateway.open()["attempt_token"]
    (stored,) = local_gateway.service.log.store.read_stream("att-1")
    assert token not in json.dumps(stored.payload)
    assert local_gateway.state().attempt_token_digest == attempt_token_digest("att-1", token)


@pytest.mark.parametrize("action", ACTIONS)
def test_a_request_on_an_attempt_without_its_token_is_unauthorized_and_writes_nothing(
    opened: Gateway, action: str
):
    before = opened.written()
    answer = ACTIONS[action](opened.bare, {})
    assert answer.status_code == 401
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("missing_attempt_token", "authentication_error")
    assert ATTEMPT_TOKEN_HEADER in error["message"]
    assert opened.written() == before


@pytest.mark.parametrize("action", ACTIONS)
def test_a_request_on_an_attempt_with_a_wrong_token_is_forbidden_and_writes_nothing(
    opened: Gateway, action: str
):
    before = opened.written()
    answer = ACTIONS[action](opened.bare, {ATTEMPT_TOKEN_HEADER: WRONG})
    assert answer.status_code == 403
    error = answer.json()["error"]
    assert (error["code"], error["type"]) == ("invalid_attempt_token", "permission_error")
    assert opened.written() == before


@pytest.mark.parametrize("action", ["chat_completion", "response", "measure", "status", "close"])
def test_a_request_on_an_attempt_with_its_token_is_served(opened: Gateway, action: str):
    answer = ACTIONS[action](opened.bare, {ATTEMPT_TOKEN_HEADER: opened.token()})
    assert answer.status_code == 200, answer.text


def test_a_rejection_with_the_token_is_recorded(opened: Gateway):
    answer = ACTIONS["reject"](opened.bare, {ATTEMPT_TOKEN_HEADER: opened.token()})
    assert answer.status_code == 200, answer.text
    assert opened.state().calls["c0"].failure.reason == "rejected_by_harness"


def test_the_token_of_one_attempt_does_not_open_another(opened: Gateway):
    other = opened.open("att-2")["attempt_token"]
    answer = ACTIONS["status"](opened.bare, {ATTEMPT_TOKEN_HEADER: other})
    assert answer.status_code == 403


def test_an_unknown_attempt_is_answered_as_a_known_one_so_a_key_cannot_be_probed(opened: Gateway):
    def answers(key: str, headers: dict[str, str]) -> tuple[int, str, str]:
        answer = opened.bare.get(f"/v1/attempts/{key}", headers=headers)
        error = answer.json()["error"]
        return answer.status_code, error["code"], error["message"].replace(key, "KEY")

    for headers in ({}, {ATTEMPT_TOKEN_HEADER: WRONG}):
        assert answers("att-1", headers) == answers("att-none", headers)


def test_an_attempt_opened_without_a_token_cannot_be_driven(local_gateway: Gateway):
    local_gateway.service.open_attempt("old-1", rollout_id="r", prompt_group="g", rollout_index=0)
    assert local_gateway.state("old-1").attempt_token_digest is None
    before = local_gateway.written()
    missing = local_gateway.bare.post("/v1/attempts/old-1/close")
    wrong = local_gateway.bare.post(
        "/v1/attempts/old-1/close", headers={ATTEMPT_TOKEN_HEADER: WRONG}
    )
    reopened = local_gateway.bare.post(
        "/v1/attempts",
        json={**OPENING, "capture_key": "old-1", "rollout_id": "r", "prompt_group": "g"},
    )
    assert (missing.status_code, wrong.status_code, reopened.status_code) == (401, 403, 409)
    assert local_gateway.written() == before


def test_opening_again_with_the_token_and_the_same_fields_answers_the_first_opening(
    local_gateway: Gateway,
):
    first = local_gateway.open()
    before = local_gateway.written()
    again = local_gateway.bare.post(
        "/v1/attempts", json=OPENING, headers={ATTEMPT_TOKEN_HEADER: first["attempt_token"]}
    )
    assert again.status_code == 200
    assert again.json() == first
    assert local_gateway.written() == before


@pytest.mark.parametrize("headers", [{}, {ATTEMPT_TOKEN_HEADER: WRONG}], ids=["none", "wrong"])
def test_opening_again_without_the_token_is_a_conflict_that_hands_out_no_token(
    local_gateway: Gateway, headers: dict[str, str]
):
    local_gateway.open()
    before = local_gateway.written()
    again = local_gateway.bare.post("/v1/attempts", json=OPENING, headers=headers)
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "attempt_exists"
    assert "attempt_token" not in again.text
    assert local_gateway.written() == before


def test_opening_again_with_the_token_and_other_fields_names_the_fields(local_gateway: Gateway):
    token = local_gateway.open()["attempt_token"]
    again = local_gateway.bare.post(
        "/v1/attempts",
        json={**OPENING, "rollout_index": 1},
        headers={ATTEMPT_TOKEN_HEADER: token},
    )
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "conflicting_event"
    assert "rollout_index: got 1, recorded 0" in again.json()["error"]["message"]


def test_an_opening_may_propose_its_own_token_and_repeat_with_it(local_gateway: Gateway):
    proposed = {ATTEMPT_TOKEN_HEADER: "p" * 40}
    first = local_gateway.bare.post("/v1/attempts", json=OPENING, headers=proposed)
    again = local_gateway.bare.post("/v1/attempts", json=OPENING, headers=proposed)
    assert first.status_code == again.status_code == 200
    assert first.json()["attempt_token"] == again.json()["attempt_token"] == "p" * 40
    served = local_gateway.bare.get("/v1/attempts/att-1", headers=proposed)
    assert served.status_code == 200


@pytest.mark.parametrize("proposed", ["short", "p" * 129, "p" * 39 + "!"])
def test_a_malformed_proposed_token_is_refused_and_writes_nothing(
    local_gateway: Gateway, proposed: str
):
    answer = local_gateway.bare.post(
        "/v1/attempts", json=OPENING, headers={ATTEMPT_TOKEN_HEADER: proposed}
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_attempt_token"
    assert local_gateway.written() == (0, 0)


def test_the_gateway_token_still_guards_opening(serve_gateway: Callable[..., Gateway]):
    guarded = serve_gateway(auth_token="s3cret")
    refused = guarded.bare.post("/v1/attempts", json=OPENING)
    assert refused.status_code == 401
    assert refused.json()["error"]["code"] == "invalid_api_key"
    assert guarded.written() == (0, 0)
    opened = guarded.bare.post(
        "/v1/attempts", json=OPENING, headers={"Authorization": "Bearer s3cret"}
    )
    assert opened.status_code == 200


def test_with_a_gateway_token_a_request_on_an_attempt_needs_both_secrets(
    serve_gateway: Callable[..., Gateway],
):
    guarded = serve_gateway(auth_token="s3cret")
    bearer = {"Authorization": "Bearer s3cret"}
    token = guarded.bare.post("/v1/attempts", json=OPENING, headers=bearer).json()["attempt_token"]
    only_attempt = guarded.bare.get("/v1/attempts/att-1", headers={ATTEMPT_TOKEN_HEADER: token})
    only_gateway = guarded.bare.get("/v1/attempts/att-1", headers=bearer)
    both = guarded.bare.get("/v1/attempts/att-1", headers={**bearer, ATTEMPT_TOKEN_HEADER: token})
    assert (only_attempt.status_code, only_gateway.status_code, both.status_code) == (401, 401, 200)
    assert only_attempt.json()["error"]["code"] == "invalid_api_key"
    assert only_gateway.json()["error"]["code"] == "missing_attempt_token"


@pytest.mark.parametrize("path", ["/v1/attempts/att-1/result", "/v1/attempts/att-1/measure"])
def test_the_token_is_checked_before_the_body_is_read(opened: Gateway, path: str):
    answer = opened.bare.post(path, json={"not": "a valid body"})
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "missing_attempt_token"
