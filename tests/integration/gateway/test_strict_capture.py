"""``build_gateway(strict=True)`` over real HTTP with the official client: an unexplained root is
answered 409 ``unexplained_root`` with its divergence in the message, and nothing is recorded.

The gateway's tokenizer writes `` (turn N)`` into the system prompt of a conversation with N
answers (``tests/fixtures/templates.py``), so the second call of a conversation cannot continue
the first from its exact tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from openai import OpenAI

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.capture.gateway import CAPTURE_KEY_HEADER
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace
from tests.fixtures.templates import turn_marking_tokenizer

SYSTEM = {"role": "system", "content": "You count apples."}
TASK = {"role": "user", "content": "Count the apples."}
FOLLOW_UP = {"role": "user", "content": "And the pears?"}


@contextmanager
def client_of(workspace: Workspace, *, strict: bool) -> Iterator[OpenAI]:
    """The official client on a gateway over ``workspace``, with attempt ``att-1`` opened."""
    app = build_gateway(workspace, tokenizer=turn_marking_tokenizer(), strict=strict)
    with ServerThread(app) as server:
        client = OpenAI(
            base_url=f"{server.base_url}/v1",
            api_key="-",
            max_retries=0,
            default_headers={CAPTURE_KEY_HEADER: "att-1"},
        )
        with client:
            attempt = {"capture_key": "att-1", "rollout_id": "r", "prompt_group": "g"}
            opened = client.post("/attempts", body={**attempt, "rollout_index": 0}, cast_to=dict)
            token = {ATTEMPT_TOKEN_HEADER: opened["attempt_token"]}
            yield client.with_options(default_headers=token)


def two_turns(client: OpenAI) -> tuple[list[dict], list[dict]]:
    """The first call's request, answered; and the follow-up request that echoes its answer."""
    first = [SYSTEM, TASK]
    answer = client.chat.completions.create(model=EMBEDDED_MODEL_NAME, messages=first, max_tokens=4)
    echoed = answer.choices[0].message.model_dump(exclude_none=True)
    return first, [*first, echoed, FOLLOW_UP]


def recorded(workspace: Workspace) -> int:
    store = EventStore.open(workspace.database_url)
    try:
        return store.count()
    finally:
        store.close()


def test_a_strict_gateway_refuses_an_unexplained_root_with_409_and_its_divergence(
    tmp_path: Path,
):
    workspace = Workspace.resolve(tmp_path / "work")
    with client_of(workspace, strict=True) as client:
        _, follow_up = two_turns(client)
        with pytest.raises(openai.ConflictError) as refused:
            client.chat.completions.create(
                model=EMBEDDED_MODEL_NAME, messages=follow_up, max_tokens=4
            )
    error = refused.value
    assert (error.status_code, error.code) == (409, "unexplained_root")
    assert "continues call" in error.message
    assert "diverged at message 0" in error.message
    assert "likely cause: changed content" in error.message
    assert recorded(workspace) == 3  # attempt.opened and the first call's intent and commit


def test_a_gateway_without_strict_records_the_unexplained_root(tmp_path: Path):
    workspace = Workspace.resolve(tmp_path / "work")
    with client_of(workspace, strict=False) as client:
        _, follow_up = two_turns(client)
        client.chat.completions.create(model=EMBEDDED_MODEL_NAME, messages=follow_up, max_tokens=4)
        status = client.get("/attempts/att-1", cast_to=dict)
    assert [(c["decision"], c["root_reason"]) for c in status["calls"]] == [
        ("root", "first_call"),
        ("root", "rendered_history_differs"),
    ]
