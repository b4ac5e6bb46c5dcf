"""Access: with an auth token, no route of ``grove serve`` answers or writes for a request without
it; history cannot be changed; one attempt cannot reach into another's calls.

The auth suite takes every operation from the gateway's served OpenAPI schema, so a route added
later is covered without a change here, and sends each one a well-formed request with no token,
a wrong token, the token in another scheme, or the token with its case changed: each is refused
401 and writes nothing, and the same request with the token is not refused for auth.

Specified elsewhere and not repeated here: UPDATE, DELETE (both databases) and TRUNCATE
(PostgreSQL) on the event table are refused by the database, and the SELECT+INSERT application
role cannot change history: ``tests/integration/ledger/test_append_only.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from capture.lifecycle import CaptureService, ModelCall
from grove.workspace import Workspace
from ledger.attempt import AttemptError
from ledger.store import EventStore
from storage import open_blob_store

from .figures import FiguresFile
from .processes import Launcher
from .rollouts import OPTIONS, SAMPLING, play

TOKEN = "s3cret-token"
OPEN = {("get", "/health")}
"""Liveness stays open, as do the schema and its interactive pages (not operations of it)."""
WRONG = {
    "no token": {},
    "a wrong token": {"Authorization": "Bearer wrong"},
    "only the scheme": {"Authorization": "Bearer"},
    "the token in another scheme": {"Authorization": f"Basic {TOKEN}"},
    "the token without a scheme": {"Authorization": TOKEN},
    "the token in upper case": {"Authorization": f"Bearer {TOKEN.upper()}"},
    "the token with more after it": {"Authorization": f"Bearer {TOKEN}x"},
}


class Guarded:
    """A ``grove serve --auth-token`` process with one open attempt holding one committed call,
    and its ledger and blobs read from this process."""

    def __init__(self, base_url: str, workspace: Workspace) -> None:
        self.http = httpx.Client(base_url=base_url, timeout=60)
        self.store = EventStore.open(workspace.database_url)
        self.blobs = open_blob_store(workspace.blob_url)
        authorized = {"Authorization": f"Bearer {TOKEN}"}
        attempt = {
            "capture_key": "att-1",
            "rollout_id": "r1",
            "prompt_group": "g",
            "rollout_index": 0,
        }
        assert self.http.post("/v1/attempts", json=attempt, headers=authorized).is_success
        model = self.http.get("/health").json()["model"]
        call = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        headers = {**authorized, CAPTURE_KEY_HEADER: "att-1", CALL_ID_HEADER: "c0"}
        assert self.http.post("/v1/chat/completions", json=call, headers=headers).is_success

    def written(self) -> tuple[int, int]:
        """(events in the ledger, blobs in the store)."""
        return self.store.count(), len(self.blobs.list_keys())

    def send(self, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
        """A well-formed request: an empty JSON object for a body, the open attempt and its
        committed call in the path and headers."""
        url = path.format(capture_key="att-1", call_id="c0")
        body: dict[str, Any] | None = {} if method == "post" else None
        names = {**headers, CAPTURE_KEY_HEADER: "att-1", CALL_ID_HEADER: "c-new"}
        return self.http.request(method.upper(), url, json=body, headers=names)

    def operations(self) -> list[tuple[str, str]]:
        """Every (method, path) of the served OpenAPI schema."""
        paths = self.http.get("/openapi.json").json()["paths"]
        return sorted((method, path) for path, item in paths.items() for method in item)


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    """``grove serve --auth-token`` on SQLite and a local blob directory, in its own process."""
    directory = tmp_path_factory.mktemp("access")
    workspace = Workspace.resolve(directory / "work")
    process = Launcher(directory).gateway(workspace, options=["--auth-token", TOKEN])
    assert process.base_url is not None
    gateway = Guarded(process.base_url, workspace)
    try:
        yield gateway
    finally:
        gateway.http.close()
        gateway.store.close()
        process.stop()


@pytest.mark.parametrize("credentials", list(WRONG), ids=list(WRONG))
def test_every_route_of_the_schema_refuses_a_missing_or_wrong_token_and_writes_nothing(
    guarded: Guarded, credentials: str, figures: FiguresFile
):
    operations = [op for op in guarded.operations() if op not in OPEN]
    before = guarded.written()
    answers = {op: guarded.send(*op, WRONG[credentials]) for op in operations}
    refused = {op: answer.status_code for op, answer in answers.items()}
    assert refused == dict.fromkeys(operations, 401)
    assert all(a.json()["error"]["code"] == "invalid_api_key" for a in answers.values())
    assert all(a.headers["www-authenticate"] == "Bearer" for a in answers.values())
    assert guarded.written() == before
    figures.record(
        f"access/auth/{credentials}",
        {"operations": len(operations), "refused_401": len(answers), "events_written": 0},
    )


def test_every_route_of_the_schema_passes_auth_with_the_token(guarded: Guarded):
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    statuses = {op: guarded.send(*op, authorized).status_code for op in guarded.operations()}
    assert 401 not in statuses.values(), statuses
    assert ("post", "/v1/chat/completions") in statuses  # the schema's operations were all sent


def test_an_intent_naming_another_attempts_call_as_parent_is_refused(capture: CaptureService):
    play(capture, "att-a", group="g0", index=0, turns=1, select=False)
    capture.open_attempt("att-b", rollout_id="g0-r1", prompt_group="g0", rollout_index=1)
    foreign = capture.log.load("att-a").calls["t0"].intended
    before = capture.log.store.count()
    with pytest.raises(AttemptError, match="parent t0 is not a committed call of this attempt"):
        capture.log.intend(
            "att-b", foreign.model_copy(update={"call_id": "t1", "parent_call_id": "t0"})
        )
    assert capture.log.store.count() == before


def test_a_request_carrying_another_attempts_call_never_continues_it(capture: CaptureService):
    a = play(capture, "att-a", group="g0", index=0, turns=1, select=False)
    capture.open_attempt("att-b", rollout_id="g0-r1", prompt_group="g0", rollout_index=1)
    task = a.result["output"][0]
    capture.generate("att-b", ModelCall([task], OPTIONS, SAMPLING, "b0"))  # b's own history
    # b sends a's call (its request and answer) followed by an observation.
    answer = {"role": "assistant", "content": a.result["output"][1]["content"]}
    carried = [task, answer, {"role": "user", "content": "Go on."}]
    outcome = capture.generate("att-b", ModelCall(carried, OPTIONS, SAMPLING, "b1"))
    assert (outcome.decision.kind.value, outcome.decision.parent_call_id) == ("root", None)
    assert "t0" not in outcome.decision.matched_call_ids
    assert capture.log.load("att-b").calls["b1"].parent_call_id is None
    same = capture.generate("att-a", ModelCall(carried, OPTIONS, SAMPLING, "t1"))
    assert same.decision.parent_call_id == "t0"  # in its own attempt the request continues it
