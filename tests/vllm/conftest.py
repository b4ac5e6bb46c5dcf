"""Fixtures of the vLLM suite (``make test-vllm``): the vLLM python, the tiny model, one server.

A module marked ``pytestmark = pytest.mark.vllm`` needs the vLLM server from ``.venv-vllm``;
``make test-vllm`` builds it and sets ``GROVE_VLLM=1``. Without ``GROVE_VLLM=1`` (``make test``)
those tests are skipped: they are not part of ``make test``. With it, a ``.venv-vllm`` whose
python is missing or has no vllm package skips them with that reason, except under ``CI=true``,
where the run fails (as without PostgreSQL or Chromium).

The session's server (``dev_server``) serves an untied copy of the tiny model
(``grove.engines.policy.write_serving_directory``: same weights, so the same logits) with
``--logprobs-mode processed_logprobs`` and vLLM's development endpoints, so one start serves
both the engine tests and the weight-reload tests; the latter put the original weights back.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

import pytest

from grove.engines.models import load_model
from grove.engines.policy import write_serving_directory
from tests.vllm.build_model import save_tiny_model
from tests.vllm.server import VENV, VllmServer, vllm_server

CONTEXT: Final = 256
_FIND_VLLM: Final = "import importlib.util, sys; sys.exit(importlib.util.find_spec('vllm') is None)"


def _vllm_missing() -> str | None:
    """Why the vLLM python cannot serve, or None when it can."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return f"{python} is missing: run `make test-vllm`, which builds .venv-vllm"
    # find_spec, not import: importing vllm takes seconds; a broken install fails the start.
    probe = subprocess.run(
        [str(python), "-c", _FIND_VLLM], capture_output=True, text=True, timeout=60
    )
    if probe.returncode != 0:
        return f"{python} has no vllm package: rebuild .venv-vllm with `make test-vllm`"
    return None


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``vllm`` marker."""
    config.addinivalue_line("markers", "vllm: needs the vLLM server of .venv-vllm (make test-vllm)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip ``vllm`` tests outside ``make test-vllm``; a missing vLLM fails them under CI=true."""
    ours = [item for item in items if item.get_closest_marker("vllm") is not None]
    if not ours:
        return
    if os.environ.get("GROVE_VLLM") != "1":
        reason = "needs the vLLM server from .venv-vllm: run `make test-vllm` (sets GROVE_VLLM=1)"
        for item in ours:
            item.add_marker(pytest.mark.skip(reason=reason))
        return
    missing = _vllm_missing()
    if missing is None:
        return
    if os.environ.get("CI") == "true":
        raise pytest.UsageError(f"CI=true needs the vLLM tests: {missing}")
    for item in ours:
        item.add_marker(pytest.mark.skip(reason=missing))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model as saved by ``tests/vllm/build_model.py`` (tied, as the trainer has it)."""
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def dev_server(
    tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path
) -> Iterator[VllmServer]:
    """One vLLM server for the session on the untied tiny model, with development endpoints."""
    root = tmp_path_factory.mktemp("vllm")
    served = write_serving_directory(load_model(str(tiny_model_dir)), root / "served")
    with vllm_server(
        served,
        root / "server.log",
        max_model_len=CONTEXT,
        logprobs_mode="processed_logprobs",
        dev_mode=True,
    ) as running:
        yield running
