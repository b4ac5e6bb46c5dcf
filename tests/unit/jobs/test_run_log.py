"""A run's metrics log: JSONL records (the last per step wins), crash tolerance, TensorBoard."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from grove.errors import GROVE_ERRORS, JobError
from grove.train import run_log
from grove.train.run_log import (
    METRICS_FILE,
    TENSORBOARD_DIR,
    MalformedMetricsLine,
    RunLog,
    RunLogError,
    StepRecord,
    read_metrics,
)


def _scalars(run_dir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event TensorBoard shows for ``tag``."""
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return [(event.step, event.value) for event in events.Scalars(tag)]


def test_logged_records_read_back_in_step_order(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.25, "forest/rows": 8}, wall_time=100.5)
        log.log(2, {"reward/mean": 0.5}, wall_time=101.0)
    assert read_metrics(tmp_path) == [
        StepRecord(step=1, wall_time=100.5, metrics={"reward/mean": 0.25, "forest/rows": 8.0}),
        StepRecord(step=2, wall_time=101.0, metrics={"reward/mean": 0.5}),
    ]


def test_each_record_is_one_json_line(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(3, {"train/loss": -0.125}, wall_time=7.0)
    assert (tmp_path / METRICS_FILE).read_text(encoding="utf-8") == (
        '{"step": 3, "wall_time": 7.0, "metrics": {"train/loss": -0.125}}\n'
    )


def test_wall_time_defaults_to_now(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("grove.train.run_log.time.time", lambda: 1234.5)
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 1.0})
    assert read_metrics(tmp_path)[0].wall_time == 1234.5


def test_relogged_step_keeps_the_last_record(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        for step in (1, 2, 3):
            log.log(step, {"reward/mean": float(step)}, wall_time=float(step))
    # resumed from the checkpoint of step 1: steps 2 and 3 are trained (and logged) again
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(2, {"reward/mean": 20.0}, wall_time=12.0)
        log.log(3, {"reward/mean": 30.0}, wall_time=13.0)
    assert len((tmp_path / METRICS_FILE).read_text().splitlines()) == 5
    assert [(r.step, r.metrics["reward/mean"]) for r in read_metrics(tmp_path)] == [
        (1, 1.0),
        (2, 20.0),
        (3, 30.0),
    ]


def test_non_finite_values_are_written_as_null(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"train/grad_norm": math.nan, "a": math.inf, "b": -math.inf}, wall_time=1.0)
    line = json.loads((tmp_path / METRICS_FILE).read_text())
    assert line["metrics"] == {"train/grad_norm": None, "a": None, "b": None}
    assert read_metrics(tmp_path)[0].metrics == {"train/grad_norm": None, "a": None, "b": None}


def test_truncated_last_line_is_skipped(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.5}, wall_time=1.0)
    with (tmp_path / METRICS_FILE).open("a") as file:
        file.write('{"step": 2, "wall_time": 2.0, "metr')  # the crash came mid-write
    assert [r.step for r in read_metrics(tmp_path)] == [1]


def test_reopened_log_cuts_the_torn_line_before_appending(tmp_path: Path):
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.5}, wall_time=1.0)
    with (tmp_path / METRICS_FILE).open("a") as file:
        file.write('{"step": 2, "wall_ti')
    with RunLog(tmp_path, tensorboard=False) as log:
        log.log(2, {"reward/mean": 0.75}, wall_time=2.0)
    assert [(r.step, r.metrics["reward/mean"]) for r in read_metrics(tmp_path)] == [
        (1, 0.5),
        (2, 0.75),
    ]


def test_malformed_middle_line_raises_naming_file_and_line(tmp_path: Path):
    path = tmp_path / METRICS_FILE
    path.write_text(
        '{"step": 1, "wall_time": 1.0, "metrics": {}}\n'
        '{"step": 2, "wall_time": 2.0, "metrics": {"reward/mean": "high"}}\n'
        '{"step": 3, "wall_time": 3.0, "metrics": {}}\n'
    )
    with pytest.raises(MalformedMetricsLine, match=rf"{path}, line 2, .*'reward/mean'") as info:
        read_metrics(tmp_path)
    assert (info.value.path, info.value.line) == (path, 2)


def test_unparseable_middle_line_raises(tmp_path: Path):
    path = tmp_path / METRICS_FILE
    path.write_text('{"step": 1, "wall_t\n{"step": 2, "wall_time": 2.0, "metrics": {}}\n')
    with pytest.raises(MalformedMetricsLine, match=r"line 1, is not a metrics record"):
        read_metrics(tmp_path)


def test_run_without_a_log_has_no_records(tmp_path: Path):
    assert read_metrics(tmp_path) == []


def test_non_numeric_metric_is_refused_and_nothing_is_written(tmp_path: Path):
    with (
        RunLog(tmp_path, tensorboard=False) as log,
        pytest.raises(RunLogError, match=r"Metric 'reward/mean' must be a number; got str"),
    ):
        log.log(1, {"forest/rows": 2.0, "reward/mean": "0.5"})  # type: ignore[dict-item]
    assert (tmp_path / METRICS_FILE).read_text() == ""


def test_tensorboard_event_file_holds_the_scalars(tmp_path: Path):
    with RunLog(tmp_path) as log:
        log.log(1, {"reward/mean": 0.25, "train/max_token_mult_prob_error": 1.5}, wall_time=10.0)
        log.log(2, {"reward/mean": 0.75, "train/max_token_mult_prob_error": 1.25}, wall_time=11.0)
    assert _scalars(tmp_path, "reward/mean") == [(1, 0.25), (2, 0.75)]
    assert _scalars(tmp_path, "train/max_token_mult_prob_error") == [(1, 1.5), (2, 1.25)]


def test_tensorboard_after_resume_shows_the_relogged_values(tmp_path: Path):
    with RunLog(tmp_path) as log:
        for step in (1, 2, 3):
            log.log(step, {"reward/mean": float(step)}, wall_time=float(step))
    with RunLog(tmp_path) as log:
        log.log(2, {"reward/mean": 20.0}, wall_time=12.0)
    assert _scalars(tmp_path, "reward/mean") == [(1, 1.0), (2, 20.0)]


def test_run_log_public_surface_and_errors_are_pinned():
    assert set(run_log.__all__) == {
        "METRICS_FILE",
        "TENSORBOARD_DIR",
        "MalformedMetricsLine",
        "RunLog",
        "RunLogError",
        "StepRecord",
        "read_metrics",
    }
    assert issubclass(RunLogError, JobError) and issubclass(RunLogError, ValueError)
    assert JobError in GROVE_ERRORS  # the command line reports it in one line
    assert issubclass(MalformedMetricsLine, RunLogError)
