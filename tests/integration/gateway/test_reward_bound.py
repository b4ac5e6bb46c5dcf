"""The reward bound over real HTTP: a result is taken only with a finite reward whose magnitude is
at most ``grpo.max_abs_reward`` (default 1e6); otherwise it is refused and nothing is written
(``capture/reward_bound.py``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from grove.capture.gateway import create_app
from grove.capture.reward_bound import DEFAULT_MAX_ABS_REWARD
from grove.config import GroveConfig
from grove.services.serve import ServerThread, build_gateway, gateway_options
from grove.workspace import Workspace

from .conftest import Gateway
from .support import AttemptTokens


def post_reward(gateway: Gateway, reward: float, key: str = "att-1") -> tuple[int, str | None]:
    """Open ``key`` (no calls: its result is taken whatever its evidence) and post ``reward``;
    the answer's status and error code."""
    gateway.open(key)
    answer = gateway.http.post(f"/v1/attempts/{key}/result", json={"reward": reward, "output": []})
    code = answer.json()["error"]["code"] if answer.status_code >= 400 else None
    return answer.status_code, code


def test_the_default_bound_is_a_million():
    assert DEFAULT_MAX_ABS_REWARD == 1e6
    assert GroveConfig().grpo.max_abs_reward == DEFAULT_MAX_ABS_REWARD


def test_a_huge_reward_is_refused_and_writes_nothing(local_gateway: Gateway):
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post(
        "/v1/attempts/att-1/result", json={"reward": 1e300, "output": []}
    )
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert (error["code"], error["param"]) == ("reward_out_of_range", "reward")
    assert "at most 1e+06 (grpo.max_abs_reward)" in error["message"]
    assert local_gateway.written() == before
    assert local_gateway.state().selection is None


@pytest.mark.parametrize("reward", [1e6, -1e6, 0.0])
def test_a_reward_within_the_bound_is_taken(local_gateway: Gateway, reward: float):
    assert post_reward(local_gateway, reward) == (200, None)
    assert local_gateway.state().selection.reward == reward


@pytest.mark.parametrize("reward", ["NaN", "Infinity", "-Infinity"])
def test_a_reward_that_is_not_finite_is_refused_and_writes_nothing(
    local_gateway: Gateway, reward: str
):
    local_gateway.open()
    before = local_gateway.written()
    answer = local_gateway.http.post(
        "/v1/attempts/att-1/result",
        content=f'{{"reward": {reward}, "output": []}}',
        headers={"Content-Type": "application/json"},
    )
    assert 400 <= answer.status_code < 500
    assert answer.json()["error"]["param"] == "reward"
    assert local_gateway.written() == before


def test_a_configured_bound_refuses_what_it_excludes(serve_gateway: Callable[..., Gateway]):
    # Bound 10: 10 is taken, 10.5 and -10.5 are refused.
    gateway = serve_gateway(max_abs_reward=10)
    assert post_reward(gateway, 10.0, "att-1") == (200, None)
    assert post_reward(gateway, 10.5, "att-2") == (422, "reward_out_of_range")
    assert post_reward(gateway, -10.5, "att-3") == (422, "reward_out_of_range")


@pytest.mark.parametrize("bound", [0.0, -1.0, float("inf"), float("nan"), 1e16])
def test_a_gateway_refuses_an_unusable_bound(local_gateway: Gateway, bound: float):
    with pytest.raises(ValueError, match="max_abs_reward must be in"):
        create_app(local_gateway.service, selector=None, model_name="m", max_abs_reward=bound)


def test_the_configuration_key_sets_the_bound_of_the_gateway(tmp_path: Path):
    config = GroveConfig.model_validate({"grpo": {"max_abs_reward": 2.0}})
    app = build_gateway(Workspace.resolve(tmp_path), **gateway_options(config))
    tokens = AttemptTokens()
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.base_url, event_hooks=tokens.hooks) as http,
    ):
        gateway = Gateway(server.base_url, app.state.gateway.service, http)
        assert post_reward(gateway, 2.0, "att-1") == (200, None)
        assert post_reward(gateway, 3.0, "att-2") == (422, "reward_out_of_range")
