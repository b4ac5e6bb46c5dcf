"""``grove.services.serve.build_gateway``: a workspace's ledger, blobs and the embedded engine;
``ServerThread``: the event loop it serves on."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from fastapi import FastAPI
from openai import OpenAI

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.embedded import EMBEDDED_MODEL_NAME
from grove.capture.gateway import CAPTURE_KEY_HEADER
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway
from grove.workspace import Workspace


def test_build_gateway_serves_a_workspace_on_the_embedded_defaults(tmp_path: Path):
    workspace = Workspace.resolve(tmp_path / "work")
    with ServerThread(build_gateway(workspace, auth_token="t")) as server:
        client = OpenAI(
            base_url=f"{server.base_url}/v1",
            api_key="t",
            max_retries=0,
            default_headers={CAPTURE_KEY_HEADER: "att-1"},
        )
        opened = client.post(
            "/attempts",
            body={
                "capture_key": "att-1",
                "rollout_id": "r",
                "prompt_group": "g",
                "rollout_index": 0,
            },
            cast_to=dict,
        )
        client = client.with_options(
            default_headers={ATTEMPT_TOKEN_HEADER: opened["attempt_token"]}
        )
        raw = client.chat.completions.with_raw_response.create(
            model=EMBEDDED_MODEL_NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    store = EventStore.open(workspace.database_url)
    try:
        assert store.count() == 3  # attempt.opened, call.intended, call.committed
    finally:
        store.close()
    staged = workspace.workdir / "blobs" / "staging" / "att-1"
    assert [blob.name for blob in staged.iterdir()] == [raw.headers["x-grove-call-id"]]
    assert raw.parse().model == EMBEDDED_MODEL_NAME


def test_a_server_thread_serves_on_uvloops_event_loop():
    app = FastAPI()

    @app.get("/loop")
    async def loop() -> str:
        return type(asyncio.get_running_loop()).__module__

    with ServerThread(app) as server:
        answer = httpx.get(f"{server.base_url}/loop", timeout=10)

    assert answer.json().startswith("uvloop")


def test_a_server_thread_writes_access_lines_only_at_info_level_or_below():
    app = FastAPI()
    levels = ("debug", "info", "warning", "error")
    access = [ServerThread(app, log_level=level).server.config.access_log for level in levels]
    assert access == [True, True, False, False]
