"""What one model call costs the ledger through the gateway: no read (the capture service's view
of the attempt holds the gateway's own appends), one plan, two appends; and what the attempt
requests cost: opening appends once and reads nothing (a new attempt's stream is empty until the
append says otherwise), and the first call after it reads nothing either; a result reads nothing
and appends once (closed, settled and selected together) when the attempt's state this process
holds is its latest."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import grove.capture.lifecycle
from tests.integration.ledger.statements import statements

from .support import Gateway, serve

MESSAGES = [{"role": "user", "content": "Count the apples."}]


@pytest.fixture
def gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on one ledger database and a local blob directory, attempt ``att-1`` open."""
    with serve(database_url, str(tmp_path / "blobs")) as running:
        running.open("att-1")
        yield running


def counting(function: Callable[..., Any], calls: list[int]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return function(*args, **kwargs)

    return counted


def test_a_continuation_reads_nothing_plans_once_and_appends_intent_and_commit(
    gateway: Gateway, monkeypatch: pytest.MonkeyPatch
):
    client = gateway.client("att-1")
    first = client.chat.completions.create(model="grove/test-tiny", messages=MESSAGES)
    history = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True)]
    history.append({"role": "user", "content": "And the pears?"})
    plans: list[int] = []
    planner = counting(grove.capture.lifecycle.plan_call, plans)
    monkeypatch.setattr(grove.capture.lifecycle, "plan_call", planner)
    with statements(gateway.service.log.store) as counts:
        raw = client.chat.completions.with_raw_response.create(
            model="grove/test-tiny", messages=history
        )
    assert raw.headers["X-Grove-Decision"] == "continuation"
    # On the event table (each append also folds its event into the projection tables).
    assert (counts["SELECT"], counts["INSERT"], len(plans)) == (0, 2, 1)


def test_opening_an_attempt_appends_once_and_reads_nothing(gateway: Gateway):
    with statements(gateway.service.log.store) as counts:
        status = gateway.open("att-2")
    assert (counts["SELECT"], counts["INSERT"]) == (0, 1)
    assert (status["capture_key"], status["closed"]) == ("att-2", False)


def test_the_first_call_after_opening_reads_nothing(gateway: Gateway):
    gateway.open("att-2")
    with statements(gateway.service.log.store) as counts:
        gateway.client("att-2").chat.completions.create(model="grove/test-tiny", messages=MESSAGES)
    assert (counts["SELECT"], counts["INSERT"]) == (0, 2)


def test_a_result_reads_nothing_and_appends_settlement_and_selection_together(gateway: Gateway):
    client = gateway.client("att-1")
    first = client.chat.completions.create(model="grove/test-tiny", messages=MESSAGES)
    output = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True)]
    (call_id,) = gateway.state("att-1").calls
    body = {"reward": 1, "output": output}
    with statements(gateway.service.log.store) as counts:
        answer = gateway.http.post("/v1/attempts/att-1/result", json=body)
    assert answer.status_code == 200, answer.text
    assert (counts["SELECT"], counts["INSERT"]) == (0, 1)
    status = answer.json()
    assert (status["closed"], status["settled"], status["selection"]["call_ids"]) == (
        True,
        True,
        [call_id],
    )
    assert [e.event_type for e in gateway.service.log.store.read_stream("att-1")][-3:] == [
        "attempt.admissions_closed",
        "attempt.settled",
        "rollout.selected",
    ]
