"""``grove serve`` starts the gateway on a workspace and answers over HTTP."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_grove_serve_answers_health_and_lists_the_model(tmp_path: Path):
    port = free_port()
    grove = str(Path(sys.executable).parent / "grove")
    server = subprocess.Popen(
        [grove, "serve", "--workdir", str(tmp_path), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read()
                assert time.monotonic() < deadline, "grove serve did not start in 60 s"
                time.sleep(0.2)
        assert health.status_code == 200
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["grove/embedded-tiny"]
        assert (tmp_path / "ledger.db").exists()
    finally:
        server.terminate()
        server.wait(timeout=30)
