"""Starting, waiting for and killing the gateway and worker processes of the crash and
concurrency suites.

A process is either forked from a fork server that imported grove, torch and transformers once
(``multiprocessing``'s ``forkserver``, preloading ``launch.PRELOAD``): it runs ``launch.run`` and
is ready in well under a second, which is what lets 50 crash trials fit in CI; or a fresh
interpreter running the ``grove`` executable itself (``exec_grove_serve``), as an operator
starts it. Either way it is a real process: SIGKILL ends it without running any of its code,
and ``wait`` reports -9.
"""

from __future__ import annotations

import contextlib
import itertools
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.context import ForkServerContext
from pathlib import Path

import httpx

from grove.workspace import Workspace
from tests.fixtures.s3 import S3Server

from . import launch
from .crashpoints import CRASH_AT_ENV, CRASH_LOG_ENV

__all__ = ["Child", "Launcher", "fork_server", "free_port", "s3_environment"]

QUIET_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
_context: ForkServerContext | None = None


def fork_server() -> ForkServerContext:
    """The suites' fork server (started on first use), with ``launch.PRELOAD`` imported."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(launch.PRELOAD)
    return _context


def s3_environment(server: S3Server) -> dict[str, str]:
    """The standard ``AWS_*`` variables that point a process at ``server`` and its keys."""
    return {
        "AWS_ENDPOINT_URL_S3": server.endpoint_url,
        "AWS_ACCESS_KEY_ID": server.access_key_id,
        "AWS_SECRET_ACCESS_KEY": server.secret_access_key,
        "AWS_DEFAULT_REGION": server.region,
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Child:
    """A started process: its name, pid, log file, and (for a gateway) its base URL."""

    name: str
    handle: multiprocessing.process.BaseProcess | subprocess.Popen
    log: Path
    base_url: str | None = None

    @property
    def pid(self) -> int:
        """The process id."""
        assert self.handle.pid is not None
        return self.handle.pid

    def exit_code(self) -> int | None:
        """The exit status (negative: the signal that ended it), or None while it runs."""
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.poll()
        return self.handle.exitcode

    def wait(self, timeout_s: float = 120.0) -> int:
        """Wait for the process to end; its exit status (-9 when SIGKILL ended it)."""
        if isinstance(self.handle, subprocess.Popen):
            return self.handle.wait(timeout_s)
        self.handle.join(timeout_s)
        code = self.handle.exitcode
        if code is None:
            raise TimeoutError(f"{self.name} (pid {self.pid}) still runs after {timeout_s} s")
        return code

    def sigkill(self) -> None:
        """Send SIGKILL, without waiting: safe from another thread (only one thread may wait for
        a forked process; two reading its exit status at once make one of them see 255)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def kill(self) -> None:
        """SIGKILL the process (no-op when it already ended) and reap it."""
        if self.exit_code() is None:
            self.sigkill()
        self.wait()

    def stop(self) -> int:
        """SIGTERM the process (a graceful shutdown) and wait for it."""
        if self.exit_code() is None:
            os.kill(self.pid, signal.SIGTERM)
        return self.wait()

    def log_tail(self, chars: int = 3000) -> str:
        """The end of the process's log, for failure messages."""
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@dataclass
class Launcher:
    """Starts gateways and workers over one workspace, with logs and the crash log in
    ``directory``, and extra environment ``env`` (e.g. the S3 endpoint)."""

    directory: Path
    env: Mapping[str, str] = field(default_factory=dict)
    _numbers: itertools.count = field(default_factory=itertools.count)

    @property
    def crash_log(self) -> Path:
        """Where armed processes write what was in flight when they killed themselves."""
        return self.directory / "crashes.jsonl"

    def _environment(self, crash: str | None) -> dict[str, str]:
        return {
            **QUIET_ENV,
            **self.env,
            CRASH_AT_ENV: crash or "",
            CRASH_LOG_ENV: str(self.crash_log),
        }

    def _fork(self, name: str, argv: list[str], crash: str | None) -> Child:
        log = self.directory / f"{next(self._numbers):03d}-{name}.log"
        process = fork_server().Process(
            target=launch.run, args=(argv, self._environment(crash), str(log)), name=name
        )
        process.start()
        return Child(name, process, log)

    def gateway(
        self, workspace: Workspace, *, crash: str | None = None, options: Sequence[str] = ()
    ) -> Child:
        """``grove serve`` on a free port with ``options`` (e.g. ``--auth-token``), forked, with
        ``crash`` armed; returns once it answers."""
        port = free_port()
        argv = ["serve", "--port", str(port), *_workspace_args(workspace), *options]
        child = self._fork("gateway", argv, crash)
        return _ready(child, f"http://127.0.0.1:{port}")

    def exec_grove_serve(self, workspace: Workspace) -> Child:
        """The ``grove serve`` executable in a fresh interpreter; returns once it answers."""
        port = free_port()
        grove = str(Path(sys.executable).parent / "grove")
        log = self.directory / f"{next(self._numbers):03d}-grove-serve.log"
        with log.open("w") as output:
            process = subprocess.Popen(
                [grove, "serve", "--port", str(port), *_workspace_args(workspace)],
                stdout=output,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self._environment(None)},
            )
        return _ready(Child("grove-serve", process, log), f"http://127.0.0.1:{port}")

    def worker(self, workspace: Workspace, checkpoints: Path, *, crash: str | None = None) -> Child:
        """The training worker over ``workspace`` with ``checkpoints``, forked, ``crash`` armed."""
        argv = [
            "train",
            "--database-url",
            workspace.database_url,
            "--blob-url",
            workspace.blob_url,
            "--checkpoints",
            str(checkpoints),
        ]
        return self._fork("worker", argv, crash)


def _workspace_args(workspace: Workspace) -> list[str]:
    return [
        "--workdir",
        str(workspace.workdir),
        "--database-url",
        workspace.database_url,
        "--blob-url",
        workspace.blob_url,
    ]


def _ready(child: Child, base_url: str, timeout_s: float = 120.0) -> Child:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/health", timeout=5).status_code == 200:
                child.base_url = base_url
                return child
        except httpx.TransportError:
            pass
        if child.exit_code() is not None or time.monotonic() > deadline:
            child.kill()
            raise RuntimeError(f"{child.name} did not start:\n{child.log_tail()}")
        time.sleep(0.05)
