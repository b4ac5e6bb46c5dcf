"""A first-call failure: the engine fails on the attempt's only call, and the harness's result is
still taken, so the rollout is finalized masked and its siblings train (docs/forest.md,
"Failures and drops")."""

from __future__ import annotations

from collections.abc import Callable

import openai
import pytest

from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import EngineError
from grove.ledger.event_replay import CheckOutcome
from grove.tools.replay import replay
from grove.training.projector import Projector, ProjectorSettings

from .conftest import Gateway, engine
from .test_completions import USER, ask, reply

FAILING_MAX_TOKENS = 5  # the marker of a call the engine fails


class FailingEngine:
    """The embedded engine, failing every call whose max_tokens is ``FAILING_MAX_TOKENS``."""

    def check(self, prompt_token_ids: list[int], sampling: SamplingParams) -> None:
        engine().check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: list[int], sampling: SamplingParams) -> Generation:
        if sampling.max_tokens == FAILING_MAX_TOKENS:
            raise EngineError("the inference server went away")
        return engine().generate(prompt_token_ids, sampling)


@pytest.fixture
def failing(serve_gateway: Callable[..., Gateway]) -> Gateway:
    gateway = serve_gateway(settle_timeout_s=5)
    gateway.service.engine = FailingEngine()
    return gateway


def fail_first_call(gateway: Gateway, capture_key: str) -> None:
    with pytest.raises(openai.APIStatusError) as failed:
        ask(gateway.client(capture_key), [USER], max_tokens=FAILING_MAX_TOKENS)
    assert failed.value.status_code == 502


def post_result(gateway: Gateway, capture_key: str, result: dict) -> dict:
    answer = gateway.http.post(f"/v1/attempts/{capture_key}/result", json=result)
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_the_result_of_an_attempt_whose_first_call_failed_is_recorded_with_no_call(
    failing: Gateway,
):
    failing.open("att-0")
    fail_first_call(failing, "att-0")

    status = post_result(failing, "att-0", {"reward": 0.0})

    assert [c["failure_reason"] for c in status["calls"]] == ["engine_error"]
    assert (status["settled"], status["timed_out"]) == (True, False)
    assert status["selection"] == {
        "policy": "returned_history",
        "call_ids": [],
        "terminal_response_id": None,
        "reward": 0.0,
    }


def test_a_first_call_failure_is_masked_and_its_sibling_trains(failing: Gateway):
    failing.open("att-0", rollout_index=0)
    fail_first_call(failing, "att-0")
    post_result(failing, "att-0", {"reward": 0.0})
    failing.open("att-1", rollout_index=1)
    completion, _ = ask(failing.client("att-1"), [USER])
    post_result(failing, "att-1", {"reward": 1.0, "output": [reply(completion)]})
    projector = Projector(
        failing.service.log.store,
        failing.service.blobs,
        ProjectorSettings(rollouts_per_group=2, groups_per_step=1),
    )

    projector.poll()
    published = projector.batch_for_step(0)

    masked = failing.state("att-0").finalized
    assert (masked.trainable, masked.masked_reason) == (False, "capture_failed")
    assert published is not None
    assert {r.rollout_id: len(r.rollout.rows) for r in published.rollouts} == {
        "r-att-0": 0,
        "r-att-1": 1,
    }


def test_replay_verify_re_runs_the_empty_selection_alike(failing: Gateway):
    failing.open("att-0")
    fail_first_call(failing, "att-0")
    post_result(failing, "att-0", {"reward": 0.0, "output": []})

    replayed = replay(failing.service.log.store, "att-0", blobs=failing.service.blobs)

    (selection,) = [c for c in replayed.checks if c.decision == "selection"]
    assert (selection.outcome, replayed.differences) == (CheckOutcome.SAME, 0)


def test_wrong_evidence_is_refused_while_a_committed_call_exists(failing: Gateway):
    failing.open("att-0")
    fail_first_call(failing, "att-0")
    ask(failing.client("att-0"), [USER])
    before = failing.written()

    answer = failing.http.post(
        "/v1/attempts/att-0/result",
        json={"reward": 1.0, "output": [{"role": "assistant", "content": "never said"}]},
    )

    assert answer.status_code == 422
    assert answer.json()["error"]["code"] == "selection_refused"
    assert failing.written() == before
