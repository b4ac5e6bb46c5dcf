"""What one model call costs the ledger through the gateway: no read (the capture service's view
of the attempt holds the gateway's own appends), one plan, two appends."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import capture.lifecycle
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
    planner = counting(capture.lifecycle.plan_call, plans)
    monkeypatch.setattr(capture.lifecycle, "plan_call", planner)
    with statements(gateway.service.log.store) as counts:
        raw = client.chat.completions.with_raw_response.create(
            model="grove/test-tiny", messages=history
        )
    assert raw.headers["X-Grove-Decision"] == "continuation"
    # On the event table (each append also folds its event into the projection tables).
    assert (counts["SELECT"], counts["INSERT"], len(plans)) == (0, 2, 1)
