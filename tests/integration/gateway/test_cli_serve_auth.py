"""``grove serve`` and its token: ``GROVE_AUTH_TOKEN`` guards every ``/v1`` route, an empty one
stops the command before anything starts (never "no authentication"), and serving without a
token beyond loopback is warned about on stderr (docs/gateway.md, docs/security.md "Deployment
advice"). Each test runs a real ``grove serve`` process."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from .test_cli_serve import GROVE, free_port

WARNING = "warning: serving on 0.0.0.0 without a token"


def _environment(**variables: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "GROVE_AUTH_TOKEN"}
    env.update({k: v for k, v in variables.items() if v is not None})
    return env


@contextmanager
def served(tmp_path: Path, *argv: str, token: str | None = None) -> Iterator[tuple[str, Path]]:
    """``grove serve --port P ARGV`` with ``GROVE_AUTH_TOKEN`` set to ``token`` (unset: None);
    its base URL and the file its stderr goes to, once ``/health`` answers."""
    port = free_port()
    stderr = tmp_path / "stderr.txt"
    with stderr.open("w") as sink:
        server = subprocess.Popen(
            [GROVE, "serve", "--port", str(port), "--workdir", str(tmp_path / "work"), *argv],
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env=_environment(GROVE_AUTH_TOKEN=token),
            text=True,
        )
        base_url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(f"{base_url}/health", timeout=2)
                    break
                except httpx.TransportError:
                    assert server.poll() is None, stderr.read_text()
                    assert time.monotonic() < deadline, "grove serve did not start in 60 s"
                    time.sleep(0.2)
            yield base_url, stderr
        finally:
            server.terminate()
            server.wait(timeout=30)


@pytest.mark.parametrize("token", ["", "   "], ids=["empty", "blank"])
def test_an_empty_GROVE_AUTH_TOKEN_stops_grove_serve_with_status_2(tmp_path: Path, token: str):
    started = subprocess.run(
        [GROVE, "serve", "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(GROVE_AUTH_TOKEN=token),
    )
    assert started.returncode == 2
    assert started.stderr.startswith("error: GROVE_AUTH_TOKEN is set but empty")
    assert len(started.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "work").exists()  # nothing started, nothing written


def test_an_empty_auth_token_option_stops_grove_serve_with_status_2(tmp_path: Path):
    started = subprocess.run(
        [GROVE, "serve", "--auth-token", "", "--workdir", str(tmp_path / "work")],
        capture_output=True,
        text=True,
        timeout=120,
        env=_environment(),
    )
    assert started.returncode == 2
    assert started.stderr.startswith("error: --auth-token is empty")
    assert not (tmp_path / "work").exists()


def test_a_GROVE_AUTH_TOKEN_guards_the_v1_routes(tmp_path: Path):
    with served(tmp_path, token="s3cret") as (base_url, _):
        bare = httpx.get(f"{base_url}/v1/models", timeout=5)
        wrong = httpx.get(f"{base_url}/v1/models", headers={"Authorization": "Bearer x"})
        right = httpx.get(f"{base_url}/v1/models", headers={"Authorization": "Bearer s3cret"})
    assert (bare.status_code, wrong.status_code, right.status_code) == (401, 401, 200)


def test_serving_beyond_loopback_without_a_token_warns_in_one_line(tmp_path: Path):
    with served(tmp_path, "--host", "0.0.0.0") as (base_url, stderr):
        assert httpx.get(f"{base_url}/v1/models", timeout=5).status_code == 200
    warnings = [line for line in stderr.read_text().splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1
    assert warnings[0].startswith(WARNING)
    assert "GROVE_AUTH_TOKEN" in warnings[0]


@pytest.mark.parametrize(
    ("host", "token"), [("127.0.0.1", None), ("0.0.0.0", "s3cret")], ids=["loopback", "token"]
)
def test_no_warning_on_loopback_or_with_a_token(tmp_path: Path, host: str, token: str | None):
    with served(tmp_path, "--host", host, token=token) as (_, stderr):
        pass
    assert "warning:" not in stderr.read_text()
