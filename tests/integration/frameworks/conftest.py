"""Real agent frameworks against a real gateway over HTTP.

Each test module plays an agent with the framework's own code — the official ``openai`` client,
LangChain and LangGraph, the OpenAI Agents SDK — pointed at a gateway served by uvicorn on
127.0.0.1 (``tests/integration/gateway/support.py``) over SQLite and a local blob directory, then
reads what the ledger recorded (``attempts.py``). A random tiny model almost never writes a
parseable tool call, so the engine is scripted (``ScriptedEngine``): each call answers the next
queued text, written in the embedded chat template's markup (``<think>…</think>``,
``<tool_call>{…}</tool_call>``; ``docs/gateway.md``, "Tool calls and reasoning").

Nothing may leave the machine: the frameworks' tracing and telemetry are switched off here,
before any of them is imported.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from grove.capture.engine import Engine
from tests.integration.gateway.support import Gateway, ScriptedEngine, engine, serve

for name, value in {
    "LANGCHAIN_TRACING_V2": "false",
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING": "false",
    "OPENAI_AGENTS_DISABLE_TRACING": "1",
}.items():
    os.environ[name] = value

CONTEXT = 2048
"""The gateway's max_context: the embedded model's whole context, since frameworks render tool
schemas and instructions into every prompt."""


@contextmanager
def served(root: Path, serving: Engine) -> Iterator[Gateway]:
    """A gateway on SQLite and local blobs under ``root``, with ``serving`` as its engine."""
    with serve(
        f"sqlite:///{root / 'ledger.db'}", str(root / "blobs"), serving, max_context=CONTEXT
    ) as running:
        yield running


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """A scripted gateway on SQLite and local blobs, shared by one module's tests (each test plays
    its own attempt)."""
    with served(tmp_path_factory.mktemp("gateway"), ScriptedEngine(engine())) as running:
        yield running
