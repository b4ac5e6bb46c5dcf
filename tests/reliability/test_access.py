"""Access: with an auth token, no route of ``grove serve`` answers or writes for a request without
it; history cannot be changed; one attempt cannot reach into another's calls; and Grove's own
code runs under the least-privileged PostgreSQL role of docs/ledger.md, "Roles".

The auth suite takes every operation from the gateway's served OpenAPI schema, so a route added
later is covered without a change here, and sends each one a well-formed request with no token,
a wrong token, the token in another scheme, or the token with its case changed: each is refused
401 and writes nothing, and the same request with the token is not refused for auth. Every
operation on an attempt (a path naming its capture key, or a model call naming it in its header)
also needs the attempt's own token: with the gateway token but without the attempt's, or with
another attempt's, each is refused (401 or 403) and writes nothing (``docs/security.md``).

The role suite applies the documentation's ``sql`` block as written (role, database and password
substituted) to a fresh ledger upgraded by its owner, then runs ``grove serve`` (played by the
official ``openai`` client), a training step, ``grove lineage`` and ``grove db status`` under the
role, and shows that every kind of DDL, a change of the schema revision, emptying a projection and
``grove db upgrade`` itself are refused for it.

Specified elsewhere and not repeated here: UPDATE, DELETE (both databases) and TRUNCATE
(PostgreSQL) on the event table are refused by the database, and the SELECT+INSERT application
role cannot change history: ``tests/integration/ledger/test_append_only.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.ledger import migrate
from grove.ledger.attempt import AttemptError
from grove.ledger.errors import PrivilegeRefused
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.workspace import Workspace
from tests.integration.tools.grove_cli import run_grove

from .figures import FiguresFile
from .harness import Harness
from .processes import Launcher
from .rollouts import OPTIONS, SAMPLING, play
from .worker import ROLLOUTS_PER_GROUP

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
        opened = self.http.post("/v1/attempts", json=attempt, headers=authorized)
        assert opened.is_success
        self.attempt_token = opened.json()["attempt_token"]
        other = self.http.post(
            "/v1/attempts", json={**attempt, "capture_key": "att-2"}, headers=authorized
        )
        self.other_token = other.json()["attempt_token"]
        model = self.http.get("/health").json()["model"]
        call = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        headers = {
            **authorized,
            CAPTURE_KEY_HEADER: "att-1",
            ATTEMPT_TOKEN_HEADER: self.attempt_token,
            CALL_ID_HEADER: "c0",
        }
        assert self.http.post("/v1/chat/completions", json=call, headers=headers).is_success

    def written(self) -> tuple[int, int]:
        """(events in the ledger, blobs in the store)."""
        return self.store.count(), len(self.blobs.list_keys())

    def send(
        self, method: str, path: str, headers: dict[str, str], attempt_token: str | None = ""
    ) -> httpx.Response:
        """A well-formed request: an empty JSON object for a body, the open attempt and its
        committed call in the path and headers, and the attempt's token (``attempt_token``:
        another one; None: none)."""
        url = path.format(capture_key="att-1", call_id="c0")
        body: dict[str, Any] | None = {} if method == "post" else None
        names = {**headers, CAPTURE_KEY_HEADER: "att-1", CALL_ID_HEADER: "c-new"}
        if attempt_token is not None:
            names[ATTEMPT_TOKEN_HEADER] = attempt_token or self.attempt_token
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


ON_AN_ATTEMPT = {
    ("get", "/v1/attempts/{capture_key}"),
    ("post", "/v1/attempts/{capture_key}/close"),
    ("post", "/v1/attempts/{capture_key}/result"),
    ("post", "/v1/attempts/{capture_key}/calls/{call_id}/reject"),
    ("post", "/v1/attempts/{capture_key}/measure"),
    ("post", "/v1/chat/completions"),
    ("post", "/v1/responses"),
}
"""The operations on an attempt: each needs the attempt's own token."""


@pytest.mark.parametrize(
    ("attempt_token", "status", "code"),
    [(None, 401, "missing_attempt_token"), ("other", 403, "invalid_attempt_token")],
    ids=["without the attempt's token", "with another attempt's token"],
)
def test_every_operation_on_an_attempt_needs_its_own_token_and_writes_nothing_without_it(
    guarded: Guarded, attempt_token: str | None, status: int, code: str
):
    authorized = {"Authorization": f"Bearer {TOKEN}"}
    operations = {op for op in guarded.operations() if "{capture_key}" in op[1]}
    assert operations <= ON_AN_ATTEMPT  # a new route on an attempt is listed here
    token = None if attempt_token is None else guarded.other_token
    before = guarded.written()
    answers = {op: guarded.send(*op, authorized, token) for op in ON_AN_ATTEMPT}
    assert {op: a.status_code for op, a in answers.items()} == dict.fromkeys(ON_AN_ATTEMPT, status)
    assert all(a.json()["error"]["code"] == code for a in answers.values())
    assert guarded.written() == before


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


# -- least privilege ---------------------------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"


def documented_grants(role: str, database: str, password: str) -> list[str]:
    """The statements of the ``sql`` block under docs/ledger.md's "Roles", for ``role`` on
    ``database`` with ``password``."""
    section = DOCS.read_text().split("\n## Roles\n", 1)[1]
    block = section.split("```sql\n", 1)[1].split("```", 1)[0]
    block = block.replace("grove_app", role).replace("'…'", f"'{password}'")
    block = block.replace("ON DATABASE grove TO", f'ON DATABASE "{database}" TO')
    return [statement.strip() for statement in block.split(";") if statement.strip()]


@dataclass(frozen=True)
class Role:
    """A login role granted exactly the documented privileges on a ledger its owner upgraded."""

    name: str
    url: str
    owner_url: str

    def connect(self) -> psycopg.Connection:
        """A connection as the role."""
        return psycopg.connect(_dsn(self.url), autocommit=True)


def _dsn(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def application_role(postgres_url: str) -> Iterator[Role]:
    migrate.upgrade(postgres_url)
    name, password = f"grove_app_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = make_url(postgres_url).database
    assert database is not None
    with psycopg.connect(_dsn(postgres_url), autocommit=True) as owner:
        for statement in documented_grants(name, database, password):
            owner.execute(statement)
    url = make_url(postgres_url).set(username=name, password=password)
    try:
        yield Role(name, url.render_as_string(hide_password=False), postgres_url)
    finally:
        with psycopg.connect(_dsn(postgres_url), autocommit=True) as owner:
            owner.execute(f'DROP OWNED BY "{name}"')
            owner.execute(f'DROP ROLE "{name}"')


REFUSED_TO_THE_ROLE = {
    "create a table": "CREATE TABLE grove_extra (id integer)",
    "create a view": "CREATE VIEW grove_extra AS SELECT 1 AS one",
    "create a function": "CREATE FUNCTION grove_extra() RETURNS integer LANGUAGE sql AS 'SELECT 1'",
    "drop a view": "DROP VIEW grove_calls",
    "alter the event table": "ALTER TABLE grove_events ADD COLUMN extra integer",
    "drop a trigger": "DROP TRIGGER grove_events_no_update_delete ON grove_events",
    "change the schema revision": "UPDATE alembic_version SET version_num = '0003'",
    "update an event": "UPDATE grove_events SET stream_id = 'elsewhere'",
    "empty a projection": "DELETE FROM grove_proj_calls",
    "truncate a projection": "TRUNCATE grove_proj_calls",
}


@pytest.mark.parametrize(
    "statement", list(REFUSED_TO_THE_ROLE.values()), ids=list(REFUSED_TO_THE_ROLE)
)
def test_the_application_role_is_refused_ddl_and_changes_to_history(
    application_role: Role, statement: str
):
    with application_role.connect() as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(statement)
    assert migrate.current_revision(application_role.owner_url) == migrate.head_revision()


def test_grove_db_upgrade_under_the_application_role_is_refused(application_role: Role):
    migrate.downgrade(application_role.owner_url, "0003")
    with pytest.raises(PrivilegeRefused, match="refused a statement for lack of privilege"):
        migrate.upgrade(application_role.url)
    assert migrate.current_revision(application_role.owner_url) == "0003"


def test_grove_serve_and_a_training_step_run_under_the_application_role(
    application_role: Role, tmp_path: Path
):
    workspace = Workspace.resolve(tmp_path / "work", application_role.url, str(tmp_path / "blobs"))
    launcher = Launcher(tmp_path)
    gateway = launcher.gateway(workspace)
    assert gateway.base_url is not None
    harness = Harness(gateway.base_url, seed=3, turns=2, reject_fraction=0.0)
    try:
        for index in range(ROLLOUTS_PER_GROUP):
            progress = harness.play(f"role-{index}", f"g0-r{index}", "g0", index)
            assert harness.post_result(progress)
    finally:
        harness.close()
        gateway.stop()
    worker = launcher.worker(workspace, tmp_path / "checkpoints")
    assert worker.wait() == 0, worker.log_tail()
    assert json.loads(worker.log.read_text().strip().splitlines()[-1])["step"] == 1
    lineage = run_grove("lineage", "role-0", "--json", "--database-url", application_role.url)
    assert lineage.code == 0, lineage.stderr
    status = run_grove("db", "status", "--json", "--database-url", application_role.url)
    assert json.loads(status.stdout)["current_revision"] == migrate.head_revision()
    with psycopg.connect(_dsn(application_role.owner_url)) as owner:
        published = owner.execute(
            "SELECT count(*) FROM grove_events WHERE event_type = 'batch.published'"
        ).fetchone()
    assert published == (1,)
