"""A gateway over real HTTP: uvicorn on 127.0.0.1 (a free port), a real ledger and blob store.

- ``gateway``: on every ledger database and blob backend (``database_url`` x ``blob_url``), for
  the capture flows that touch storage;
- ``local_gateway``: SQLite and a local blob directory, for refusals, attempts and auth, whose
  behaviour does not depend on the backend;
- ``serve_gateway``: a factory for a gateway with other ``create_app`` options (auth, no
  selector), on SQLite and local blobs;
- ``scripted_gateway`` (every backend) and ``local_scripted_gateway`` (SQLite, local blobs): a
  gateway whose engine answers with scripted text (``ScriptedEngine``), for the flows a random
  tiny model almost never produces by itself (tool calls, reasoning, multi-byte text).
- ``held``: a local gateway whose engine holds the calls that ask for 7 tokens until released
  (``HeldEngine``), for a call still running while the test acts (a settle wait, a disconnect).

Each gateway serves ``MODEL`` with the embedded engine (one per session; its calls are
serialized) and the application's selector (``grove.services.serve.LedgerSelector``). Clients are
the official ``openai`` client with retries off, naming the attempt in ``default_headers``. The
gateway itself (``serve``, ``Gateway``, ``ScriptedEngine``) is in ``support.py``, which the
agent-framework suite (``tests/integration/frameworks``) shares.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from .support import (
    CONTEXT,
    MODEL,
    Gateway,
    HeldEngine,
    ScriptedEngine,
    engine,
    serve,
    tokenizer,
)

# The test modules import these from here.
__all__ = [
    "CONTEXT",
    "MODEL",
    "Gateway",
    "HeldEngine",
    "ScriptedEngine",
    "engine",
    "serve",
    "tokenizer",
]


@pytest.fixture
def gateway(database_url: str, blob_url: str) -> Iterator[Gateway]:
    """A gateway on one ledger database and one blob backend (all four combinations)."""
    with serve(database_url, blob_url) as running:
        yield running


@pytest.fixture
def serve_gateway(tmp_path: Path) -> Iterator[Callable[..., Gateway]]:
    """``serve_gateway(**create_app_options)``: a gateway on SQLite and local blobs."""
    with ExitStack() as stack:
        numbers = itertools.count()

        def start(**options: Any) -> Gateway:
            n = next(numbers)
            ledger, blobs = f"sqlite:///{tmp_path / f'ledger-{n}.db'}", str(tmp_path / f"blobs-{n}")
            return stack.enter_context(serve(ledger, blobs, **options))

        yield start


@pytest.fixture
def held(serve_gateway: Callable[..., Gateway]) -> Iterator[tuple[Gateway, HeldEngine]]:
    """A gateway on SQLite and local blobs whose engine holds calls (``HeldEngine``); a result
    waits 0.3 s for pending calls."""
    gateway = serve_gateway(settle_timeout_s=0.3)
    held_engine = HeldEngine()
    gateway.service.engine = held_engine
    try:
        yield gateway, held_engine
    finally:
        held_engine.release.set()


@pytest.fixture
def local_gateway(serve_gateway: Callable[..., Gateway]) -> Gateway:
    """A gateway on SQLite and local blobs with the default options."""
    return serve_gateway()


@pytest.fixture
def scripted_gateway(database_url: str, blob_url: str) -> Iterator[Gateway]:
    """A scripted gateway (``ScriptedEngine``) on one ledger database and one blob backend."""
    with serve(database_url, blob_url, ScriptedEngine(engine())) as running:
        yield running


@pytest.fixture
def local_scripted_gateway(tmp_path: Path) -> Iterator[Gateway]:
    """A scripted gateway (``ScriptedEngine``) on SQLite and local blobs."""
    with serve(
        f"sqlite:///{tmp_path / 'ledger.db'}", str(tmp_path / "blobs"), ScriptedEngine(engine())
    ) as running:
        yield running
