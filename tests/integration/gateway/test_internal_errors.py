"""A failure the gateway does not expect is answered 500 ``internal_error`` with an incident id and
none of the exception's text, which may hold secrets; the log keeps the text and the traceback
under that id (capture/refusals.py)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import pytest

from grove.ledger.attempt import AttemptState

from .conftest import Gateway

SECRET = "postgresql://grove:hunter2@db.internal/ledger"


def _failing_selector(state: AttemptState, result: dict[str, Any]) -> Any:
    raise RuntimeError(f"selection store at {SECRET} is gone")


@pytest.fixture
def failing(serve_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway whose selector fails with an error no rule of the gateway knows."""
    gateway = serve_gateway(selector=_failing_selector)
    gateway.open()
    return gateway


def test_an_unexpected_failure_is_answered_500_without_its_text(failing: Gateway):
    answer = failing.http.post("/v1/attempts/att-1/result", json={"reward": 1.0})
    error = answer.json()["error"]
    assert (answer.status_code, error["code"], error["type"]) == (
        500,
        "internal_error",
        "server_error",
    )
    assert re.fullmatch(
        r"Internal error [0-9a-f]{12}: the gateway failed in a way it does not expect; its log "
        r"holds the details under this id",
        error["message"],
    )
    assert "hunter2" not in answer.text and "RuntimeError" not in answer.text


def test_an_unexpected_failure_is_logged_with_its_traceback_under_the_answered_id(
    failing: Gateway, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.ERROR, logger="grove.capture.refusals"):
        answer = failing.http.post("/v1/attempts/att-1/result", json={"reward": 1.0})
    incident = answer.json()["error"]["message"].split()[2].rstrip(":")
    (record,) = [r for r in caplog.records if r.name == "grove.capture.refusals"]
    assert record.getMessage() == (
        f"internal error {incident} answering POST /v1/attempts/att-1/result"
    )
    assert record.exc_info is not None
    assert str(record.exc_info[1]) == f"selection store at {SECRET} is gone"


def test_an_unexpected_failure_before_any_write_writes_nothing(failing: Gateway):
    before = failing.written()
    assert failing.http.post("/v1/attempts/att-1/result", json={"reward": 1.0}).status_code == 500
    assert failing.written() == before
