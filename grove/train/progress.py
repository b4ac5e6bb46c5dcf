"""What a training run shows in the terminal: a live progress bar of the rollouts, one line per
optimizer step with its figures, and a table of the steps at the end. Quiet without a console
(``--json``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from grove.train.training_run import StepSummary

__all__ = ["StepProgress", "step_line", "step_table"]


def step_line(s: StepSummary) -> str:
    """One step's figures on one line."""
    return (
        f"step {s.step:>3}  reward {s.reward:.3f}  rollouts {s.logical_rollouts}  rows {s.rows}  "
        f"masked {s.masked}  dropped {s.dropped_groups}  loss {s.loss:+.2e}  "
        f"max TMPE {s.max_tmpe:.6f}  gen KL {s.gen_kl_error:.2e}"
        + ("  (rebuilt)" if s.rebuilt else "")
    )


def step_table(rows: Sequence[StepSummary]) -> Table:
    """Every step of the run as a table."""
    table = Table(title="GRPO steps")
    for column in ("step", "reward", "rollouts", "rows", "masked", "loss", "max TMPE", "gen KL"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r.step),
            f"{r.reward:.3f}",
            str(r.logical_rollouts),
            str(r.rows),
            str(r.masked),
            f"{r.loss:+.2e}",
            f"{r.max_tmpe:.6f}",
            f"{r.gen_kl_error:.2e}",
        )
    return table


class StepProgress:
    """The live display of one run; every method is a no-op without a console."""

    def __init__(self, console: Console | None, *, total_rollouts: int) -> None:
        self.console = console
        self.started = time.monotonic()
        self.history: list[StepSummary] = []
        self._waiting_since: float | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if console is not None:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
            )
            self._task = self._progress.add_task("rollouts", total=total_rollouts)

    def __enter__(self) -> StepProgress:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._progress is not None:
            self._progress.stop()
        if self.console is not None and self.history:
            self.console.print(step_table(self.history))
            self.console.print(
                f"{len(self.history)} steps in {time.monotonic() - self.started:.0f} s"
            )

    def extend(self, rollouts: int) -> None:
        """``rollouts`` more rollouts will be played (replacement groups)."""
        if self._progress is not None and self._task is not None:
            total = self._progress.tasks[self._task].total or 0
            self._progress.update(self._task, total=total + rollouts)

    def advance(self) -> None:
        """One rollout was played (or found complete)."""
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)

    def waiting(self, step: int) -> None:
        """An external run is waiting for agents to complete the prompt groups of ``step``."""
        if self._waiting_since is None:
            self._waiting_since = time.monotonic()
            self.note(f"step {step}: waiting for agents to complete prompt groups")

    def step_done(self, summary: StepSummary) -> None:
        """An optimizer step was taken."""
        self._waiting_since = None
        self.history.append(summary)
        self.note(step_line(summary))

    def note(self, text: str) -> None:
        """Print one line above the progress bar."""
        if self._progress is not None:
            self._progress.console.print(text, highlight=False)
