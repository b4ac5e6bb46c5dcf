"""The lineage views are current when a gateway call returns: the next statement sees it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from .support import Gateway, serve

MESSAGES = [{"role": "user", "content": "Count the apples."}]


@pytest.fixture
def gateway(database_url: str, tmp_path: Path) -> Iterator[Gateway]:
    """A gateway on one ledger database and a local blob directory."""
    with serve(database_url, str(tmp_path / "blobs")) as running:
        yield running


def _rows(gateway: Gateway, query: str) -> list[tuple]:
    with gateway.service.log.store.engine.connect() as conn:
        return [tuple(row) for row in conn.execute(text(query))]


def test_a_call_is_in_grove_calls_in_the_next_statement(gateway: Gateway):
    gateway.open("att-1")
    reply = gateway.client("att-1").chat.completions.create(
        model="grove/test-tiny", messages=MESSAGES
    )
    assert _rows(
        gateway, "SELECT rollout_id, status, decision, response_id, selected FROM grove_calls"
    ) == [("r-att-1", "committed", "root", reply.id, False)]


def test_a_continuation_is_in_grove_call_lineage_in_the_next_statement(gateway: Gateway):
    gateway.open("att-1")
    client = gateway.client("att-1")
    first = client.chat.completions.create(model="grove/test-tiny", messages=MESSAGES)
    history = [*MESSAGES, first.choices[0].message.model_dump(exclude_none=True)]
    client.chat.completions.create(
        model="grove/test-tiny", messages=[*history, {"role": "user", "content": "And pears?"}]
    )
    assert _rows(
        gateway, "SELECT depth FROM grove_call_lineage WHERE call_id <> ancestor_call_id"
    ) == [(1,)]
