"""The metrics log of one training run: one JSON line per step, and TensorBoard event files.

A run directory (``WORKDIR/runs/RUN``) holds ``metrics.jsonl``, one record per logged step::

    {"step": 3, "wall_time": 1767225600.25, "metrics": {"reward/mean": 0.41, "train/gn": null}}

``wall_time`` is Unix seconds; a value that is not a finite number (NaN, ±inf) is written as
``null``, so every line is strict JSON. Each line is written whole, flushed and fsynced before
``log`` returns, so a crash loses at most the line being written. The same scalars go to
TensorBoard event files under ``tensorboard/`` (``tensorboard --logdir WORKDIR/runs``).

Resume appends: a run resumed from an earlier checkpoint re-trains, and so re-logs, the steps
after that checkpoint. The file keeps every record; readers (``read_metrics``) keep the last record
of each step. TensorBoard is told the same: the first step a resumed writer logs is its purge step,
which hides the earlier session's events from that step on. A torn final line left by a crash is
dropped when the log is opened again, before anything is appended after it.

Reading is strict everywhere but at the end: a final line without its newline that does not parse
is a torn write and is skipped; any other line that does not parse as a record is an error naming
the file and the line. The metric names the trainer logs, and what they mean, are in
``docs/metrics.md``.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final

from grove.errors import JobError

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

__all__ = [
    "METRICS_FILE",
    "TENSORBOARD_DIR",
    "MalformedMetricsLine",
    "RunLog",
    "RunLogError",
    "StepRecord",
    "read_metrics",
]

METRICS_FILE: Final = "metrics.jsonl"
TENSORBOARD_DIR: Final = "tensorboard"


class RunLogError(JobError, ValueError):
    """A run's metrics log that cannot be written or read as asked; ``rule`` names the rule
    that was broken (``metric_not_numeric``, ``metrics_line_malformed``, …)."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(message)


class MalformedMetricsLine(RunLogError):
    """Line ``line`` (1-based) of ``path`` is not a metrics record; ``detail`` says why."""

    def __init__(self, path: Path, line: int, detail: str) -> None:
        self.path = path
        self.line = line
        self.detail = detail
        super().__init__(
            "metrics_line_malformed",
            f"Metrics log {path}, line {line}, is not a metrics record: {detail}. Each line must "
            'be {"step": INT, "wall_time": SECONDS, "metrics": {NAME: NUMBER | null}}; '
            "remove or repair that line",
        )


@dataclass(frozen=True)
class StepRecord:
    """One logged step (producer: ``RunLog.log``; consumer: ``read_metrics``, ``grove report``).

    ``step`` is the optimizer step count after the step; ``wall_time`` Unix seconds when it was
    logged; ``metrics`` maps each metric name to its value, ``None`` where the value was not a
    finite number (a metric missing from ``metrics`` was not logged at that step).
    """

    step: int
    wall_time: float
    metrics: dict[str, float | None]


def _finite_or_none(name: str, value: object) -> float | None:
    """``value`` as a float, ``None`` when it is NaN or infinite."""
    if isinstance(value, bool | str | bytes) or value is None:
        raise RunLogError(
            "metric_not_numeric",
            f"Metric {name!r} must be a number; got {type(value).__name__} {value!r}. "
            "Log a float (NaN for no value)",
        )
    try:
        number = float(value)  # type: ignore[arg-type]  # ints, numpy and 0-d torch scalars
    except (TypeError, ValueError):
        raise RunLogError(
            "metric_not_numeric",
            f"Metric {name!r} must be a number; got {type(value).__name__} {value!r}. "
            "Log a float (NaN for no value)",
        ) from None
    return number if math.isfinite(number) else None


def _check_step(step: object) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise RunLogError(
            "step_not_count",
            f"A logged step must be a non-negative int (the optimizer step count); got {step!r}",
        )
    return step


def _mend_torn_tail(path: Path) -> None:
    """Make ``path`` end with a newline before appending: a torn last line (a crash mid-write)
    is cut off; a complete record that lost only its newline gets it back."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with path.open("rb+") as file:
        data = file.read()
        if data.endswith(b"\n"):
            return
        start = data.rfind(b"\n") + 1
        try:
            _decode_line(data[start:])
        except (ValueError, TypeError):  # torn: the reader skips it, so nothing is lost
            file.truncate(start)
        else:
            file.write(b"\n")
        file.flush()
        os.fsync(file.fileno())


class RunLog:
    """The metrics sinks of one run: ``metrics.jsonl`` and, with ``tensorboard``, event files.

    Appends to an existing log (a resumed run); use as a context manager or call ``close``.
    """

    def __init__(self, run_dir: Path, *, tensorboard: bool = True) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / METRICS_FILE
        self.tensorboard_dir = self.run_dir / TENSORBOARD_DIR if tensorboard else None
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _mend_torn_tail(self.path)
        self._file = self.path.open("a", encoding="utf-8")
        self._writer: SummaryWriter | None = None

    def log(
        self, step: int, metrics: Mapping[str, float], *, wall_time: float | None = None
    ) -> None:
        """Append the record of ``step`` (``wall_time`` defaults to now), durable on return."""
        if self._file.closed:
            raise RunLogError("log_closed", f"The run log {self.path} is closed; open a new one")
        step = _check_step(step)
        values: dict[str, float | None] = {}
        for name, value in metrics.items():
            if not isinstance(name, str) or not name:
                raise RunLogError(
                    "metric_name", f"Metric names must be non-empty strings; got {name!r}"
                )
            values[name] = _finite_or_none(name, value)
        when = time.time() if wall_time is None else float(wall_time)
        record = {"step": step, "wall_time": when, "metrics": values}
        self._file.write(json.dumps(record, allow_nan=False) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.tensorboard_dir is not None:
            writer = self._tensorboard(self.tensorboard_dir, step)
            for name, value in metrics.items():
                writer.add_scalar(name, float(value), global_step=step, walltime=when)
            writer.flush()

    def _tensorboard(self, directory: Path, first_step: int) -> SummaryWriter:
        """The event writer, opened at the first ``log``; a directory that already holds events
        (a resumed run) is purged from ``first_step`` on, as the JSONL reader keeps the last."""
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter

            resumed = directory.is_dir() and any(directory.iterdir())
            self._writer = SummaryWriter(
                log_dir=str(directory), purge_step=first_step if resumed else None
            )
        return self._writer

    def close(self) -> None:
        """Close the JSONL file and the TensorBoard writer (idempotent)."""
        self._file.close()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> RunLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _parse_record(raw: Any) -> StepRecord:
    """A decoded JSON line as a record; ``ValueError`` says what is wrong with it."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected a JSON object, got {type(raw).__name__}")
    missing = [key for key in ("step", "wall_time", "metrics") if key not in raw]
    if missing:
        raise ValueError(f"missing {', '.join(missing)}")
    step, wall_time, metrics = raw["step"], raw["wall_time"], raw["metrics"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be a non-negative integer, got {step!r}")
    if isinstance(wall_time, bool) or not isinstance(wall_time, int | float):
        raise ValueError(f"wall_time must be a number, got {wall_time!r}")
    if not isinstance(metrics, dict):
        raise ValueError(f"metrics must be an object, got {type(metrics).__name__}")
    values: dict[str, float | None] = {}
    for name, value in metrics.items():
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise ValueError(f"metric {name!r} must be a number or null, got {value!r}")
        values[name] = None if value is None else float(value)
    return StepRecord(step=step, wall_time=float(wall_time), metrics=values)


def _reject_constant(token: str) -> float:
    raise ValueError(f"{token} is not JSON (a non-finite value is written as null)")


def _decode_line(line: bytes) -> StepRecord:
    """One line of ``metrics.jsonl`` as a record; ``ValueError`` says what is wrong with it."""
    return _parse_record(json.loads(line, parse_constant=_reject_constant))


def read_metrics(run_dir: Path) -> list[StepRecord]:
    """The run's records, the last one logged for each step, ordered by step.

    A run that has logged nothing yet (no ``metrics.jsonl``) has no records. A torn final line
    is skipped; any other line that is not a record raises ``MalformedMetricsLine``.
    """
    path = Path(run_dir) / METRICS_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = data.split(b"\n")  # the last element follows the final newline: empty, or torn
    last: dict[int, StepRecord] = {}
    for number, line in enumerate(lines, start=1):
        final = number == len(lines)
        if final and not line:
            break
        try:
            record = _decode_line(line)
        except (ValueError, TypeError) as error:  # JSONDecodeError and UnicodeDecodeError too
            if final:
                break  # no newline after it: the write was cut short by a crash
            raise MalformedMetricsLine(path, number, str(error)) from None
        last[record.step] = record
    return [last[step] for step in sorted(last)]
