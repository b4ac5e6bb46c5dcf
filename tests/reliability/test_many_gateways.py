"""Many gateways, no stickiness: four ``grove serve`` processes on one PostgreSQL and one S3.

Any call of an attempt may reach any gateway (``docs/gateway.md``): a gateway that did not serve
the previous call reads it from the ledger (the attempt's events after the version it holds, the
parent chain's blobs from the store), and two gateways appending to one attempt at once meet at
the stream's expected version — the loser reads the events it missed and checks its rule again,
so nothing is lost or recorded twice. The reference is the same attempts played through one
gateway, on a ledger of its own: every lineage (``grove lineage``) must be equal.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from sqlalchemy.engine import make_url

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER
from grove.ledger import migrate
from grove.ledger.store import EventStore
from grove.tools.lineage import attempt_lineages
from grove.workspace import Workspace
from tests.fixtures.postgres import PostgresServer
from tests.fixtures.s3 import S3Server

from .conftest import MODEL
from .figures import FiguresFile
from .harness import Ack
from .invariants import LedgerView, lost_acknowledgements, repeated_intents, version_gaps
from .processes import Child, Launcher, s3_environment
from .roaming import Gateways, RoamingHarness

pytestmark = [pytest.mark.postgres, pytest.mark.s3]

GATEWAYS = 4
ATTEMPTS = 64
GROUP_SIZE = 8
THREADS = 8  # attempts played at once


@dataclass
class Deployment:
    """Four gateways on one ledger and blob store; one more gateway on a ledger of its own."""

    many: list[Child]
    one: Child
    many_url: str
    one_url: str


def _admin(server: PostgresServer) -> psycopg.Connection:
    dsn = make_url(server.url).set(drivername="postgresql")
    return psycopg.connect(dsn.render_as_string(hide_password=False), autocommit=True)


def _database(server: PostgresServer) -> str:
    """A fresh database on ``server`` (two per module: ``postgres_url`` gives one per test)."""
    name = f"grove_test_{uuid.uuid4().hex[:12]}"
    with _admin(server) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server.database_url(name)


def _drop(server: PostgresServer, url: str) -> None:
    with _admin(server) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory,
    postgres_server: PostgresServer,
    s3_server: S3Server,
) -> Iterator[Deployment]:
    """The gateways on their migrated ledgers (``grove db upgrade`` first, as an operator does)."""
    directory = tmp_path_factory.mktemp("gateways")
    many_url, one_url = _database(postgres_server), _database(postgres_server)
    migrate.upgrade(many_url)
    migrate.upgrade(one_url)
    launcher = Launcher(directory, s3_environment(s3_server))
    many_blobs = s3_server.fresh_url()
    children: list[Child] = []
    try:
        for n in range(GATEWAYS):
            workspace = Workspace.resolve(directory / f"work-{n}", many_url, many_blobs)
            children.append(launcher.gateway(workspace))
        one = Workspace.resolve(directory / "work-one", one_url, s3_server.fresh_url())
        children.append(launcher.gateway(one))
        yield Deployment(children[:GATEWAYS], children[GATEWAYS], many_url, one_url)
    finally:
        for child in children:
            child.stop()
        _drop(postgres_server, many_url)
        _drop(postgres_server, one_url)


def _urls(children: list[Child]) -> list[str]:
    urls = [child.base_url for child in children]
    assert all(url is not None for url in urls)
    return urls  # type: ignore[return-value]


def _play_all(children: list[Child]) -> tuple[list[Ack], list[tuple[int, str, str]]]:
    """Play the ``ATTEMPTS`` rollouts through ``children``, each request to a gateway drawn at
    random; the acknowledgements, and ``(gateway, capture key, call id)`` of each model call."""
    gateways = Gateways.connect(_urls(children))

    def one(n: int) -> tuple[list[Ack], list[tuple[int, str, str]]]:
        harness = RoamingHarness(gateways, seed=n, route_seed=10_000 + n)
        key = f"a{n:02d}"
        progress = harness.play(key, key, f"g{n // GROUP_SIZE}", n % GROUP_SIZE)
        assert harness.post_result(progress), f"{key}: result refused"
        calls = [a for a in harness.acks if a.event_type == "call.committed"]
        assert len(calls) == len(harness.served)
        return harness.acks, [
            (g, a.capture_key, a.call_id or "") for g, a in zip(harness.served, calls, strict=True)
        ]

    try:
        with ThreadPoolExecutor(THREADS) as pool:
            played = list(pool.map(one, range(ATTEMPTS)))
    finally:
        gateways.close()
    return [a for acks, _ in played for a in acks], [c for _, calls in played for c in calls]


def _lineages(url: str) -> dict[str, dict[str, Any]]:
    """Every attempt's lineage, without the response ids (fresh random ids on every run)."""
    store = EventStore.open(url)
    try:
        store.wait_for_horizon()
        lineages = {}
        for n in range(ATTEMPTS):
            (lineage,) = attempt_lineages(store, f"a{n:02d}")
            record = lineage.as_dict()
            for call in record["calls"]:
                call.pop("response_id")
            record["rollout"].pop("terminal_response_id")
            lineages[lineage.capture_key] = record
        return lineages
    finally:
        store.close()


def test_attempts_served_by_four_gateways_at_random_have_the_lineages_of_one_gateway(
    deployment: Deployment, figures: FiguresFile
):
    started = time.monotonic()
    acks, served = _play_all(deployment.many)
    roaming_s = time.monotonic() - started
    _play_all([deployment.one])
    many, one = _lineages(deployment.many_url), _lineages(deployment.one_url)

    store = EventStore.open(deployment.many_url)
    try:
        view = LedgerView.read(store)
    finally:
        store.close()
    assert lost_acknowledgements(view, acks) == []
    assert repeated_intents(view) == []
    assert version_gaps(view) == []
    assert sorted(many) == sorted(one) == [f"a{n:02d}" for n in range(ATTEMPTS)]
    differing = [key for key in many if many[key] != one[key]]
    assert differing == []
    # The draw spread the calls, and most continuations reached a gateway that had not served
    # their parent: it read the parent from the ledger and its tokens from the blob store.
    gateway_of = {(key, call): g for g, key, call in served}
    assert sorted(Counter(g for g, _, _ in served)) == list(range(GATEWAYS))
    continuations = [
        (key, call["call_id"], call["parent_call_id"])
        for key, record in many.items()
        for call in record["calls"]
        if call["decision"] == "continuation"
    ]
    crossed = [c for c in continuations if gateway_of[c[0], c[1]] != gateway_of[c[0], c[2]]]
    assert len(continuations) >= ATTEMPTS and len(crossed) >= len(continuations) // 2
    figures.record(
        "concurrency/many-gateways",
        {
            "gateways": GATEWAYS,
            "attempts": ATTEMPTS,
            "calls": len(served),
            "continuations": len(continuations),
            "continuations_on_another_gateway": len(crossed),
            "lineages_equal_to_one_gateway": ATTEMPTS - len(differing),
            "roaming_seconds": round(roaming_s, 1),
        },
    )


def _race_body(text: str) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4}


def _open(base_url: str, key: str) -> str:
    """Open attempt ``key`` through one gateway; its token, which every gateway checks."""
    body = {"capture_key": key, "rollout_id": key, "prompt_group": key, "rollout_index": 0}
    answer = httpx.post(f"{base_url}/v1/attempts", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    return str(answer.json()["attempt_token"])


def test_one_call_id_sent_to_four_gateways_at_once_is_inferred_once(deployment: Deployment):
    urls = _urls(deployment.many)
    key = f"race-{uuid.uuid4().hex[:8]}"
    token = _open(urls[0], key)
    barrier = threading.Barrier(GATEWAYS)

    def send(url: str) -> int:
        barrier.wait(30)
        headers = {CAPTURE_KEY_HEADER: key, ATTEMPT_TOKEN_HEADER: token, CALL_ID_HEADER: "c0"}
        answer = httpx.post(
            f"{url}/v1/chat/completions", json=_race_body("Race."), headers=headers, timeout=120
        )
        return answer.status_code

    with ThreadPoolExecutor(GATEWAYS) as pool:
        statuses = Counter(pool.map(send, urls))
    store = EventStore.open(deployment.many_url)
    try:
        events = [(e.event_type, e.payload.get("call_id")) for e in store.read_stream(key)]
    finally:
        store.close()
    assert statuses == {200: 1, 409: GATEWAYS - 1}
    assert events == [
        ("attempt.opened", None),
        ("call.intended", "c0"),
        ("call.committed", "c0"),
    ]


def test_calls_of_one_attempt_sent_through_four_gateways_at_once_are_each_recorded_once(
    deployment: Deployment,
):
    urls = _urls(deployment.many)
    key = f"shared-{uuid.uuid4().hex[:8]}"
    token = _open(urls[0], key)
    calls_each = 3
    barrier = threading.Barrier(GATEWAYS)

    def send(gateway: int) -> list[int]:
        barrier.wait(30)
        statuses = []
        for n in range(calls_each):
            headers = {
                CAPTURE_KEY_HEADER: key,
                ATTEMPT_TOKEN_HEADER: token,
                CALL_ID_HEADER: f"g{gateway}-{n}",
            }
            answer = httpx.post(
                f"{urls[gateway]}/v1/chat/completions",
                json=_race_body(f"Gateway {gateway}, question {n}."),
                headers=headers,
                timeout=120,
            )
            statuses.append(answer.status_code)
        return statuses

    with ThreadPoolExecutor(GATEWAYS) as pool:
        statuses = [s for sent in pool.map(send, range(GATEWAYS)) for s in sent]
    store = EventStore.open(deployment.many_url)
    try:
        events = store.read_stream(key)
    finally:
        store.close()
    assert statuses == [200] * GATEWAYS * calls_each
    assert [e.stream_version for e in events] == list(range(1, len(events) + 1))
    intended = Counter(e.payload["call_id"] for e in events if e.event_type == "call.intended")
    committed = Counter(e.payload["call_id"] for e in events if e.event_type == "call.committed")
    expected = {f"g{g}-{n}": 1 for g in range(GATEWAYS) for n in range(calls_each)}
    assert intended == committed == expected
