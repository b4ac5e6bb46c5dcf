"""A custom selection policy that raises (here a ``ValueError``, the class a refusal of the result
has too) is the server's fault, not the harness's: the gateway
answers 500 ``internal_error`` with an incident id and logs the policy's traceback under it; a
policy that refuses a result on purpose (``SelectionError``) is still a 422
(``training/selection.py``, ``SelectionPolicyFailed``; docs/gateway.md)."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from grove.client import GatewayServerError, GroveClient, GroveClientError
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace

POLICIES = "tests.integration.training.faulty_policies"


def _post_a_result(tmp_path: Path, policy: str) -> GroveClientError:
    """One call under ``policy``, then its result; the error the result is answered with."""
    app = build_gateway(
        Workspace.resolve(tmp_path), selection_policy=policy, forest_mode=True, settle_timeout_s=5
    )
    with ServerThread(app) as server, GroveClient(f"{server.base_url}/v1") as grove:
        attempt = grove.open_attempt("a1", rollout_id="r1", prompt_group="g", rollout_index=0)
        llm = attempt.openai()
        messages = [{"role": "user", "content": "hi"}]
        answer = llm.chat.completions.create(model=grove.model(), messages=messages, max_tokens=2)
        llm.close()
        with pytest.raises(GroveClientError) as raised:
            attempt.post_result({"output": [answer.choices[0].message.model_dump()], "reward": 1})
    return raised.value


def _selection(tmp_path: Path) -> object:
    store = EventStore.open(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        return AttemptLog(store).load("a1").selection
    finally:
        store.close()


def test_a_policy_that_raises_is_answered_500_with_an_incident_id(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.ERROR, logger="grove.capture.refusals"):
        error = _post_a_result(tmp_path, f"{POLICIES}:misparse")
    assert isinstance(error, GatewayServerError)
    assert (error.status, error.code) == (500, "internal_error")
    found = re.fullmatch(r"Internal error (\w+): .*", error.message)
    assert found is not None
    assert "no_such_number" not in error.message  # the policy's text stays in the log
    (record,) = [r for r in caplog.records if found.group(1) in r.getMessage()]
    assert record.exc_info is not None
    assert "SelectionPolicyFailed" in type(record.exc_info[1]).__name__
    assert isinstance(record.exc_info[1].__cause__, ValueError)
    assert _selection(tmp_path) is None  # nothing selected


def test_a_policy_that_refuses_the_result_is_still_a_422(tmp_path: Path):
    error = _post_a_result(tmp_path, f"{POLICIES}:refuse_every_result")
    assert not isinstance(error, GatewayServerError)
    assert error.status == 422
    assert "this policy selects nothing" in error.message
    assert _selection(tmp_path) is None
