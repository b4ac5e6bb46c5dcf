"""A result's environment mask over real HTTP (``docs/forest.md``, "Environment masks"): a
well-formed flag is recorded on ``rollout.selected``; a malformed one is refused and nothing is
written."""

from __future__ import annotations

from typing import Any

import pytest

from .conftest import Gateway


def post_result(gateway: Gateway, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """Open ``att-1`` (no calls) and post ``body`` with reward 0 as its result."""
    gateway.open()
    answer = gateway.http.post("/v1/attempts/att-1/result", json={"reward": 0.0, **body})
    return answer.status_code, answer.json()


def test_an_environment_mask_is_recorded_with_its_reason(local_gateway: Gateway) -> None:
    body = {"environment_masked": True, "environment_mask_reason": "sandbox crashed"}
    assert post_result(local_gateway, body)[0] == 200
    selection = local_gateway.state().selection
    assert (selection.environment_masked, selection.environment_mask_reason) == (
        True,
        "sandbox crashed",
    )


def test_a_result_without_the_flag_is_not_environment_masked(local_gateway: Gateway) -> None:
    assert post_result(local_gateway, {})[0] == 200
    selection = local_gateway.state().selection
    assert (selection.environment_masked, selection.environment_mask_reason) == (False, None)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"environment_masked": "yes"}, "environment_masked"),
        ({"environment_masked": 1}, "environment_masked"),
        (
            {"environment_masked": True, "environment_mask_reason": "x" * 501},
            "environment_mask_reason",
        ),
        ({"environment_masked": True, "environment_mask_reason": ""}, "environment_mask_reason"),
        ({"environment_masked": True, "environment_mask_reason": 7}, "environment_mask_reason"),
    ],
)
def test_a_malformed_environment_mask_is_refused_and_writes_nothing(
    local_gateway: Gateway, body: dict[str, Any], param: str
) -> None:
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post("/v1/attempts/att-1/result", json={"reward": 0.0, **body})
    assert answer.status_code == 400
    assert param in answer.json()["error"]["message"]
    assert local_gateway.written() == before
    assert local_gateway.state().selection is None


def test_a_reason_without_the_flag_is_refused_and_writes_nothing(local_gateway: Gateway) -> None:
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post(
        "/v1/attempts/att-1/result", json={"reward": 0.0, "environment_mask_reason": "crash"}
    )
    assert answer.status_code == 400
    assert "environment_masked is not true" in answer.json()["error"]["message"]
    assert local_gateway.written() == before
