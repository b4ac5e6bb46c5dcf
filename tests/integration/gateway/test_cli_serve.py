"""``grove serve`` starts the gateway on a workspace and answers over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

GROVE = str(Path(sys.executable).parent / "grove")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def grove_serve(workdir: Path, *options: str) -> Iterator[str]:
    """``grove serve --workdir WORKDIR OPTIONS`` on a free port; yields its base URL once
    ``/health`` answers (within 60 s), and stops it."""
    port = free_port()
    server = subprocess.Popen(
        [GROVE, "serve", "--workdir", str(workdir), "--port", str(port), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "grove serve did not start in 60 s"
                time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_grove_serve_answers_health_and_lists_the_model(tmp_path: Path):
    with grove_serve(tmp_path) as base_url:
        health = httpx.get(f"{base_url}/health", timeout=5)
        assert health.status_code == 200
        models = httpx.get(f"{base_url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["grove/embedded-tiny"]
        assert (tmp_path / "ledger.db").exists()


def test_grove_serve_gives_attempts_its_selection_policy_and_forest_mode(tmp_path: Path):
    options = ("--selection-policy", "all_captured", "--forest-training")
    with grove_serve(tmp_path, *options) as base_url:
        body = {"capture_key": "a1", "rollout_id": "r1", "prompt_group": "g", "rollout_index": 0}
        opened = httpx.post(f"{base_url}/v1/attempts", json=body, timeout=10).json()
        custom = "tests.unit.trainer.selection_policies:select_all"
        refused = httpx.post(
            f"{base_url}/v1/attempts", json={**body, "selection_policy": custom}, timeout=10
        )
    assert (opened["selection_policy"], opened["forest_mode"]) == ("all_captured", True)
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "unregistered_selection_policy"


def test_grove_serve_refuses_a_selection_policy_that_does_not_resolve(tmp_path: Path):
    served = subprocess.run(
        [GROVE, "serve", "--workdir", str(tmp_path), "--selection-policy", "no_such_grove_mod:f"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert served.returncode == 2
    assert "unknown_module" in served.stderr
    assert not (tmp_path / "ledger.db").exists()
