"""Benches on several ``torchrun`` ranks (gloo, CPU): start a worker module on every rank and
collect the JSON object each rank writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch.distributed as dist

from bench.support.memory import FREED_TO_KERNEL

__all__ = ["rank_results", "write_rank_result"]

ROOT = Path(__file__).resolve().parents[2]


def rank_results(module: str, *args: str, ranks: int = 2) -> list[dict[str, Any]]:
    """Run ``python -m module OUT *args`` on ``ranks`` standalone torchrun ranks from the
    repository root, one intra-op thread each, freed memory going back to the kernel
    (``bench.support.memory.FREED_TO_KERNEL``); return every rank's ``write_rank_result``
    object, in rank order. Raises ``RuntimeError`` with the output's tail when a rank fails."""
    with tempfile.TemporaryDirectory() as out:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(ranks),
            "-m",
            module,
            out,
            *args,
        ]
        run = subprocess.run(
            command,
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, **FREED_TO_KERNEL, "OMP_NUM_THREADS": "1"},
        )
        if run.returncode != 0:
            raise RuntimeError(f"{module} on {ranks} ranks failed: {run.stderr[-3000:]}")
        return [json.loads((Path(out) / f"rank{r}.json").read_text()) for r in range(ranks)]


def write_rank_result(out: str, result: dict[str, Any]) -> None:
    """Write this rank's ``result`` where ``rank_results`` reads it."""
    (Path(out) / f"rank{dist.get_rank()}.json").write_text(json.dumps(result))
