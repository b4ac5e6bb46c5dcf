"""The attempt endpoints: open, status, reject, result (settle and selection)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from grove.capture.gateway import CALL_ID_HEADER
from grove.ledger.events import CallFailed

from .conftest import MODEL, Gateway, HeldEngine
from .test_completions import USER, ask, observe, reply


def post(gateway: Gateway, path: str, body: dict[str, Any] | None = None) -> Any:
    return gateway.http.post(f"/v1/attempts{path}", json=body)


def test_opening_an_attempt_again_with_the_same_fields_is_idempotent(local_gateway: Gateway):
    first = local_gateway.open(policy_version=3)
    events = local_gateway.written()
    assert local_gateway.open(policy_version=3) == first
    assert local_gateway.written() == events
    assert (first["policy_version"], first["calls"], first["closed"]) == (3, [], False)


def test_opening_an_attempt_again_with_other_fields_is_a_conflict(local_gateway: Gateway):
    local_gateway.open()
    before = local_gateway.written()
    answer = post(
        local_gateway,
        "",
        {"capture_key": "att-1", "rollout_id": "other", "prompt_group": "g0", "rollout_index": 0},
    )
    assert answer.status_code == 409
    error = answer.json()["error"]
    assert error["code"] == "conflicting_event"
    assert "rollout_id: got 'other', recorded 'r-att-1'" in error["message"]
    assert "Event id" not in error["message"]
    assert local_gateway.written() == before


def test_an_attempt_with_a_negative_rollout_index_is_refused(local_gateway: Gateway):
    answer = post(
        local_gateway,
        "",
        {"capture_key": "att-1", "rollout_id": "r", "prompt_group": "g", "rollout_index": -1},
    )
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "rollout_index"
    assert local_gateway.written() == (0, 0)


def test_the_status_of_an_unknown_attempt_is_answered_as_a_known_one_without_its_token(
    local_gateway: Gateway,
):
    local_gateway.open("att-known")
    unknown = local_gateway.http.get("/v1/attempts/att-none")
    known = local_gateway.bare.get("/v1/attempts/att-known")
    assert unknown.status_code == known.status_code == 401
    assert unknown.json()["error"]["code"] == known.json()["error"]["code"]
    assert unknown.json()["error"]["code"] == "missing_attempt_token"


def test_closing_an_attempt_is_shown_in_its_status(local_gateway: Gateway):
    local_gateway.open()
    answer = post(local_gateway, "/att-1/close")
    assert answer.status_code == 200
    assert (answer.json()["closed"], answer.json()["settled"]) == (True, False)


def test_rejecting_an_unknown_call_is_not_found(local_gateway: Gateway):
    local_gateway.open()
    answer = post(local_gateway, "/att-1/calls/c9/reject")
    assert answer.status_code == 404
    assert answer.json()["error"]["code"] == "unknown_call"


def test_rejecting_a_call_that_failed_is_a_conflict(local_gateway: Gateway):
    local_gateway.open()
    root = local_gateway.http.post(
        "/v1/chat/completions",
        json={"model": MODEL, "messages": [USER], "max_tokens": 4},
        headers={"X-Grove-Capture-Key": "att-1", CALL_ID_HEADER: "c0"},
    )
    assert root.status_code == 200
    log = local_gateway.service.log
    log.intend("att-1", log.load("att-1").calls["c0"].intended.model_copy(update={"call_id": "c1"}))
    log.fail("att-1", CallFailed(call_id="c1", reason="engine_error"))
    before = local_gateway.written()
    answer = post(local_gateway, "/att-1/calls/c1/reject")
    assert answer.status_code == 409
    assert "is failed" in answer.json()["error"]["message"]
    assert local_gateway.written() == before


def test_a_result_without_evidence_is_refused_before_anything_is_written(local_gateway: Gateway):
    local_gateway.open()
    ask(local_gateway.client(), [USER])
    before = local_gateway.written()
    answer = post(local_gateway, "/att-1/result", {"reward": 1.0})
    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "selection_refused"
    assert "missing_evidence" in answer.json()["error"]["message"]
    assert local_gateway.written() == before
    assert local_gateway.status()["closed"] is False


def test_a_result_whose_reward_is_not_a_number_is_refused(local_gateway: Gateway):
    local_gateway.open()
    answer = post(local_gateway, "/att-1/result", {"reward": "high", "model_calls": []})
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "reward"


def test_a_result_that_returns_a_rejected_response_is_refused(local_gateway: Gateway):
    local_gateway.open()
    client = local_gateway.client()
    first, headers = ask(client, [USER])
    post(local_gateway, f"/att-1/calls/{headers['x-grove-call-id']}/reject")
    answer = post(local_gateway, "/att-1/result", {"reward": 1.0, "output": [reply(first)]})
    assert answer.status_code == 422
    assert "item 0 starts no whole generation of a committed call" in answer.text


def test_a_result_selects_the_resample_and_not_the_rejected_response(local_gateway: Gateway):
    local_gateway.open()
    client = local_gateway.client()
    first, first_headers = ask(client, [USER])
    request = [USER, reply(first), observe("apples=3")]
    _, rejected = ask(client, request, seed=1)
    post(local_gateway, f"/att-1/calls/{rejected['x-grove-call-id']}/reject")
    retry, retry_headers = ask(client, request, seed=2)
    answer = post(
        local_gateway, "/att-1/result", {"reward": 1.0, "output": [*request, reply(retry)]}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["selection"]["call_ids"] == [
        first_headers["x-grove-call-id"],
        retry_headers["x-grove-call-id"],
    ]


def test_a_result_selects_responses_items_by_their_echoed_ids(local_gateway: Gateway):
    local_gateway.open()
    response = local_gateway.client().responses.create(
        model=MODEL, input="How many apples?", max_output_tokens=4
    )
    answer = post(
        local_gateway,
        "/att-1/result",
        {"reward": 0.5, "output": [item.model_dump() for item in response.output]},
    )
    assert answer.status_code == 200, answer.text
    selection = answer.json()["selection"]
    assert selection["terminal_response_id"] == response.id
    assert selection["call_ids"] == [answer.json()["calls"][0]["call_id"]]


def test_posting_the_same_result_again_is_idempotent_and_another_is_a_conflict(
    local_gateway: Gateway,
):
    local_gateway.open()
    first, _ = ask(local_gateway.client(), [USER])
    result = {"reward": 1.0, "output": [reply(first)]}
    assert post(local_gateway, "/att-1/result", result).status_code == 200
    events = local_gateway.written()
    assert post(local_gateway, "/att-1/result", result).status_code == 200
    conflict = post(local_gateway, "/att-1/result", {**result, "reward": 0.0})
    assert conflict.status_code == 409
    error = conflict.json()["error"]
    assert error["code"] == "conflicting_event"
    assert "A result was already recorded for attempt 'att-1'" in error["message"]
    assert "reward: got 0.0, recorded 1.0" in error["message"]
    unselectable = post(local_gateway, "/att-1/result", {"reward": 1.0, "output": []})
    assert unselectable.status_code == 409
    assert "already recorded" in unselectable.json()["error"]["message"]
    assert local_gateway.written() == events


def test_a_gateway_without_a_selector_refuses_results(serve_gateway: Callable[..., Gateway]):
    gateway = serve_gateway(selector=None)
    gateway.open()
    before = gateway.written()
    answer = post(gateway, "/att-1/result", {"reward": 1.0})
    assert answer.status_code == 501
    assert answer.json()["error"]["code"] == "selection_not_configured"
    assert gateway.written() == before


def test_a_result_settles_after_the_timeout_with_the_pending_call_recorded(
    held: tuple[Gateway, HeldEngine],
):
    gateway, held_engine = held
    gateway.open()
    client = gateway.client()
    first, _ = ask(client, [USER])
    pending = threading.Thread(
        target=ask, args=(client, [USER, reply(first), observe("x")]), kwargs={"max_tokens": 7}
    )
    pending.start()
    assert held_engine.started.wait(30)
    answer = post(gateway, "/att-1/result", {"reward": 1.0, "output": [reply(first)]})
    held_engine.release.set()
    pending.join(30)
    status = answer.json()
    assert answer.status_code == 200, answer.text
    assert (status["settled"], status["timed_out"], len(status["pending"])) == (True, True, 1)
    assert status["selection"]["call_ids"] == [status["calls"][0]["call_id"]]
    late = gateway.status()["calls"][1]
    assert (late["status"], late["late"]) == ("committed", True)
