"""``grove serve CONFIG.yaml`` reads the configuration ``grove train`` reads: its keys, the
schema's defaults for the keys it leaves out, and flags that override only the key their help
names (grove/commands/serving.py, docs/gateway.md "Starting it")."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from grove.commands.serving import SERVE_OVERRIDES
from grove.config import load_config
from grove.services.serve import gateway_options

from .test_cli_serve import GROVE, free_port

ATTEMPT = {"capture_key": "a1", "rollout_id": "r1", "prompt_group": "g", "rollout_index": 0}


@contextmanager
def served(port: int, *argv: str) -> Iterator[str]:
    """``grove serve ARGV`` (which must make it listen on ``port``); its base URL once
    ``/health`` answers, stopped afterwards."""
    server = subprocess.Popen(
        [GROVE, "serve", *argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    base_url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                httpx.get(f"{base_url}/health", timeout=2)
                break
            except httpx.TransportError:
                assert server.poll() is None, server.stdout.read() if server.stdout else ""
                time.sleep(0.2)
        yield base_url
    finally:
        server.terminate()
        server.wait(timeout=30)


def opened_defaults(base_url: str) -> tuple[str, bool]:
    """The selection policy and forest mode an attempt that gives neither gets."""
    opened = httpx.post(f"{base_url}/v1/attempts", json=ATTEMPT, timeout=10).json()
    return opened["selection_policy"], opened["forest_mode"]


def write_config(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def test_grove_serve_reads_its_keys_from_the_configuration_file(tmp_path: Path):
    port = free_port()
    config = write_config(
        tmp_path / "run.yaml",
        {
            "engine": {"port": port},
            "token_capture": {"selection_policy": "all_captured", "forest_training": True},
        },
    )
    with served(port, str(config), "--workdir", str(tmp_path / "work")) as base_url:
        assert opened_defaults(base_url) == ("all_captured", True)


def test_the_config_option_reads_the_same_file_as_the_argument(tmp_path: Path):
    port = free_port()
    config = write_config(tmp_path / "run.yaml", {"engine": {"port": port}})
    with served(port, "--config", str(config), "--workdir", str(tmp_path / "w")) as base_url:
        assert httpx.get(f"{base_url}/health", timeout=5).status_code == 200


def test_a_flag_overrides_only_the_key_it_names(tmp_path: Path):
    in_file, on_line = free_port(), free_port()
    config = write_config(
        tmp_path / "run.yaml",
        {
            "engine": {"port": in_file},
            "token_capture": {"selection_policy": "all_captured", "forest_training": True},
        },
    )
    argv = (str(config), "--port", str(on_line), "--workdir", str(tmp_path / "work"))
    with served(on_line, *argv, "--no-forest-training", "--selection-policy", "returned_history"):
        overridden = opened_defaults(f"http://127.0.0.1:{on_line}")
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{in_file}/health", timeout=2)
    assert overridden == ("returned_history", False)


def test_without_a_configuration_attempts_get_the_schemas_defaults_as_grove_train(
    tmp_path: Path,
):
    # grove train hands its gateway the same schema: forest mode off, returned_history
    defaults = gateway_options(load_config(None))
    port = free_port()
    with served(port, "--port", str(port), "--workdir", str(tmp_path / "work")) as base_url:
        served_defaults = opened_defaults(base_url)
    assert served_defaults == (defaults["selection_policy"], defaults["forest_mode"])
    assert served_defaults == ("returned_history", False)


def test_an_override_is_checked_as_its_key_is(tmp_path: Path):
    served_ = subprocess.run(
        [GROVE, "serve", "--settle-timeout", "-1", "--workdir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served_.returncode == 1
    assert served_.stderr.startswith(
        "error: Invalid Grove configuration (defaults with the command line's overrides):"
    )
    assert "token_capture.pending_call_timeout_s" in served_.stderr
    assert not (tmp_path / "ledger.db").exists()


def test_two_different_configurations_are_a_usage_error(tmp_path: Path):
    first = write_config(tmp_path / "a.yaml", {})
    second = write_config(tmp_path / "b.yaml", {})
    served_ = subprocess.run(
        [GROVE, "serve", str(first), "--config", str(second), "--workdir", str(tmp_path / "w")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert served_.returncode == 2
    assert "two configurations" in served_.stderr


def test_serve_help_names_the_key_each_flag_overrides():
    shown = subprocess.run(
        [GROVE, "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "250"},
    ).stdout
    flat = " ".join(re.sub(r"[│╭╮╰╯─]", " ", shown).split())  # the help box, unwrapped
    for flag, key in SERVE_OVERRIDES.items():
        row = flat.split(f" {flag} ", 1)
        assert len(row) == 2, f"{flag} is not in grove serve --help"
        assert f"Overrides {key}." in row[1].split(" --", 1)[0], (flag, key)
