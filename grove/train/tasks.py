"""The task file of a training run and the order its tasks are played in.

A task file is JSONL: one JSON object per line (blank lines are skipped), handed to the harness
as the task record; every task becomes one prompt group. The order is a seeded permutation per
epoch (``data.shuffle``, ``data.shuffle_seed``), the epochs concatenated (``data.epochs``);
step ``s`` plays the next ``grpo.num_prompts_per_step`` tasks of that order, so a step's tasks
depend only on the configuration and the step number (a resumed run plays the same tasks).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grove.errors import JobError

__all__ = ["TaskFileError", "load_tasks", "step_tasks", "task_order"]


class TaskFileError(JobError, ValueError):
    """The task file cannot be used: ``path``, the 1-based ``line`` (None: the whole file) and
    what is wrong."""

    def __init__(self, path: Path, line: int | None, problem: str) -> None:
        self.path = path
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"task file {where}: {problem}")


def load_tasks(path: str | Path) -> list[dict[str, Any]]:
    """Every task of the JSONL file at ``path``, in file order."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise TaskFileError(path, None, f"cannot read it ({error})") from error
    tasks: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as error:
            raise TaskFileError(path, number, f"not valid JSON ({error.msg})") from error
        if not isinstance(task, dict):
            raise TaskFileError(
                path, number, f"each line must be a JSON object, got {type(task).__name__}"
            )
        tasks.append(task)
    if not tasks:
        raise TaskFileError(path, None, "it holds no task (one JSON object per line)")
    return tasks


def task_order(count: int, *, shuffle: bool, seed: int, epochs: int) -> list[int]:
    """Task indices in play order: each epoch a permutation (seeded by ``seed`` and the epoch)
    or the file order, the epochs one after another."""
    order: list[int] = []
    for epoch in range(epochs):
        indices = list(range(count))
        if shuffle:
            random.Random(f"{seed}/{epoch}").shuffle(indices)
        order.extend(indices)
    return order


def step_tasks(order: Sequence[int], step: int, groups: int) -> list[int] | None:
    """The task indices of step ``step`` (``groups`` of them), or None once the order is used
    up (a partial last step is not played: a step always has all its groups)."""
    start = step * groups
    if start + groups > len(order):
        return None
    return list(order[start : start + groups])
