"""Everything ``grove train`` checks before it starts anything: the model directory, the harness
and the task file, refused together in one bulleted ``ConfigurationError`` naming each key (and
the line of a malformed task), so a bad run fails in a second instead of after a model load."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grove.config import EMBEDDED, EXTERNAL, ConfigurationError, GroveConfig
from grove.jobs.harness import Harness, HarnessError, resolve_harness
from grove.jobs.models import check_model_directory
from grove.jobs.tasks import TaskFileError, load_tasks

__all__ = ["Preflight", "preflight"]


@dataclass(frozen=True)
class Preflight:
    """What the checks loaded: the harness function (None: external) and the tasks."""

    harness: Harness | None
    tasks: list[dict[str, Any]]


def preflight(config: GroveConfig, source: str) -> Preflight:
    """Check ``config`` (read from ``source``) against the world; raises ``ConfigurationError``
    with every problem."""
    problems: list[str] = []
    if config.model.path != EMBEDDED:
        problems.extend(f"model.path: {p}" for p in check_model_directory(config.model.path))
    harness = None
    if config.harness.target != EXTERNAL:
        try:
            harness = resolve_harness(config.harness.target)
        except HarnessError as error:
            problems.append(str(error))
    tasks: list[dict[str, Any]] = []
    if config.data.path is not None:
        try:
            tasks = load_tasks(config.data.path)
        except TaskFileError as error:
            problems.append(f"data.path: {error}")
    if problems:
        raise ConfigurationError(source, problems)
    return Preflight(harness=harness, tasks=tasks)
