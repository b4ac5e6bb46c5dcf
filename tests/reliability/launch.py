"""Entry of the processes the crash and concurrency suites start and kill: the gateway (the
``grove serve`` command, through ``grove.cli.main``) and the training worker (``worker.py``),
with the crash point of ``GROVE_CRASH_AT`` armed first (``crashpoints.py``).

``run`` is the target of a process forked from the suites' fork server (``processes.py``), which
has grove, torch and transformers imported already; ``python -m tests.reliability.launch
serve|train ARGS`` runs the same in a fresh interpreter.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence

import torch

from . import crashpoints, worker

__all__ = ["PRELOAD", "run"]

PRELOAD = [
    "__main__",
    "grove.cli",
    "grove.services.serve",
    "grove.train.training_run",
    "tests.reliability.launch",
]
"""Modules the fork server imports once, so that a forked gateway or worker starts at once
(``__main__`` too: multiprocessing's default, else every child imports it again)."""


def run(argv: Sequence[str], env: Mapping[str, str], log_path: str | None = None) -> None:
    """Run ``serve ARGS`` (the gateway) or ``train ARGS`` (the worker) in this process, with
    ``env`` added to the environment and stdout and stderr appended to ``log_path``."""
    os.environ.update(env)
    if log_path is not None:
        descriptor = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
        os.close(descriptor)
    torch.set_num_threads(1)
    crashpoints.install(os.environ.get(crashpoints.CRASH_AT_ENV))
    command, *args = argv
    if command == "serve":
        from grove.cli import main

        sys.argv = ["grove", "serve", *args]
        main()
    elif command == "train":
        worker.main(args)
    else:
        raise SystemExit(f"unknown command {command!r}: use serve or train")


if __name__ == "__main__":
    run(sys.argv[1:], {})
