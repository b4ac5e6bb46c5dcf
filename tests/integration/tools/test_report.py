"""``grove report RUN --html FILE``: a run's curves as one self-contained page.

The page is checked here as written, on a run logged through ``RunLog`` (five steps, a null value,
a series that starts late, two steps re-logged after a resume) and on the run ``grove demo``
leaves; ``tests/browser`` loads it in headless Chromium.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

import pytest

from grove.errors import JobError
from grove.tools import report
from grove.tools.report import HEADLINE_METRICS, MAX_MARKERS, NoMetricsYet, write_report
from grove.train.run_log import METRICS_FILE, RunLog, read_metrics
from grove.train.runs import RunNotFound

from .grove_cli import run_grove
from .ledgers import DemoLedger

HEADLINE_TITLES = [title for title, _ in HEADLINE_METRICS]


def sample_metrics(step: int) -> dict[str, float]:
    """Step ``step``'s metrics of the sample run: every name the trainer logs."""
    metrics = {
        "reward/mean": step / 10,
        "reward/std": 0.05,
        "train/loss": -0.01 * step,
        "train/grad_norm": math.nan if step == 3 else 1 + step / 10,
        "train/learning_rate": 1e-5,
        "train/token_mult_prob_error": 1 + 1e-6 * step,
        "train/max_token_mult_prob_error": 1 + 2e-6 * step,
        "train/gen_kl_error": 1e-9 * step,
        "throughput/tokens_per_s": 1000.0 * step,
        "forest/rows": 16.0,
        "forest/padding_rows": 0.0,
        "forest/masked_rows": float(step % 2),
        "forest/rows_per_rollout": 2.0,
        "dropped_prompt_groups": float(step == 2),
        "num_mask_sample_filtered": 0.0,
        "finalize/masked_rollouts": float(step == 4),
        "gen_tokens_per_sample": 30.0 + step,
        "max_gen_tokens_per_turn": 12.0,
        "total_tokens_per_sample": 150.0,
        "roots/first_call": 8.0,
        "logical_rollouts": 8.0,
    }
    if step >= 2:  # first logged at step 2: no point, and no break, at step 1
        metrics["roots/history_rewritten"] = 8.0
    return metrics


SAMPLE_SERIES = sorted([*sample_metrics(2)])
RESUMED_REWARDS = {4: 0.45, 5: 0.55}


def _mark_run(run_dir: Path) -> Path:
    """Make ``run_dir`` a run directory, as ``grove train`` does (its ``run.json``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps({"run_id": run_dir.name}))
    return run_dir


def write_sample_run(run_dir: Path) -> Path:
    """Log the sample run: steps 1-5, then a resume from step 3's checkpoint re-logs 4 and 5."""
    _mark_run(run_dir)
    with RunLog(run_dir) as log:
        for step in range(1, 6):
            log.log(step, sample_metrics(step), wall_time=1000.0 + 10 * step)
    with RunLog(run_dir) as log:
        for step, reward in RESUMED_REWARDS.items():
            log.log(step, {**sample_metrics(step), "reward/mean": reward}, wall_time=2000.0 + step)
    return run_dir


@dataclass
class Chart:
    """One chart of the page: its title, class, series, tick labels, points and marks."""

    title: str
    headline: bool
    series: list[str]
    last: str = ""
    x_labels: list[str] = field(default_factory=list)
    y_labels: list[str] = field(default_factory=list)
    points: dict[str, list[tuple[int, str]]] = field(default_factory=dict)  # (step, value)
    declared: dict[str, int] = field(default_factory=dict)  # data-points of each series
    markers: dict[str, int] = field(default_factory=dict)  # data-markers of each series
    lines: dict[str, int] = field(default_factory=dict)  # line segments of each series
    vertices: dict[str, int] = field(default_factory=dict)  # of all its line segments
    nulls: dict[str, int] = field(default_factory=dict)
    bands: list[str] = field(default_factory=list)  # the path data of each band
    empty: str = ""


class ReportDom(HTMLParser):
    """The charts of a ``grove report`` page, in order, and every attribute that could fetch."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.charts: list[Chart] = []
        self.fetches: list[str] = []
        self.body: dict[str, str] = {}
        self._series: str | None = None
        self._text: list[str] | None = None
        self._text_kind = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        classes = set(a.get("class", "").split())
        for name in ("src", "href", "xlink:href"):
            if name in a:
                self.fetches.append(f"<{tag} {name}={a[name]}>")
        if tag == "link":
            self.fetches.append(f"<link {a}>")
        if tag == "body":
            self.body = a
        if tag == "figure" and "card" in classes:
            self.charts.append(
                Chart(a["data-chart"], "headline" in classes, a["data-series"].split())
            )
        chart = self.charts[-1] if self.charts else None
        if chart is None:
            return
        if tag == "g" and "series" in classes:
            self._series = a["data-series"]
            chart.declared[self._series] = int(a["data-points"])
            chart.markers[self._series] = int(a["data-markers"])
            chart.points[self._series] = []
        elif tag == "circle" and "pt" in classes and self._series is not None:
            chart.points[self._series].append((int(a["data-step"]), a["data-value"]))
        elif tag == "path" and "line" in classes and self._series is not None:
            chart.lines[self._series] = chart.lines.get(self._series, 0) + 1
            vertices = len(a["d"].split(" L"))
            chart.vertices[self._series] = chart.vertices.get(self._series, 0) + vertices
        elif tag == "path" and "null" in classes and self._series is not None:
            chart.nulls[self._series] = chart.nulls.get(self._series, 0) + 1
        elif tag == "path" and "band" in classes:
            chart.bands.append(a["d"])
        elif (tag == "span" and "last" in classes) or (
            tag == "text" and classes & {"xlabel", "ylabel", "empty"}
        ):
            self._text, self._text_kind = (
                [],
                (classes & {"last", "xlabel", "ylabel", "empty"}).pop(),
            )

    def handle_endtag(self, tag: str) -> None:
        if tag == "g":
            self._series = None
        if self._text is not None and tag in ("span", "text"):
            text, chart = "".join(self._text), self.charts[-1]
            if self._text_kind == "last":
                chart.last = text
            elif self._text_kind == "xlabel":
                chart.x_labels.append(text)
            elif self._text_kind == "ylabel":
                chart.y_labels.append(text)
            else:
                chart.empty = text
            self._text = None

    def handle_data(self, data: str) -> None:
        if self._text is not None:
            self._text.append(data)

    def chart(self, title: str) -> Chart:
        """The chart titled ``title``."""
        (chart,) = [c for c in self.charts if c.title == title]
        return chart


def test_report_public_surface_is_pinned():
    assert set(report.__all__) == {
        "HEADLINE_METRICS",
        "MAX_MARKERS",
        "RUNS_DIR",
        "NoMetricsYet",
        "ReportPage",
        "render_report",
        "resolve_run_dir",
        "write_report",
    }
    assert issubclass(NoMetricsYet, JobError) and issubclass(NoMetricsYet, ValueError)
    assert issubclass(RunNotFound, JobError)


@pytest.fixture(scope="module")
def sample_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_sample_run(tmp_path_factory.mktemp("workdir") / "runs" / "sample")


@pytest.fixture(scope="module")
def page(sample_run: Path) -> ReportDom:
    path = sample_run.parent.parent / "report.html"
    write_report(sample_run, path)
    return ReportDom(path.read_text(encoding="utf-8"))


def test_report_page_is_self_contained(sample_run: Path, page: ReportDom, tmp_path: Path):
    text = write_report(sample_run, tmp_path / "report.html").path.read_text(encoding="utf-8")
    assert page.fetches == []
    assert "url(" not in text and "@import" not in text


def test_report_counts_steps_and_series(sample_run: Path, tmp_path: Path):
    report = write_report(sample_run, tmp_path / "report.html")
    assert (report.path, report.steps, report.series) == (
        tmp_path / "report.html",
        5,
        len(SAMPLE_SERIES),
    )


def test_report_starts_with_the_four_headline_charts(page: ReportDom):
    assert [(c.title, c.headline) for c in page.charts[:4]] == [(t, True) for t in HEADLINE_TITLES]
    assert [c.series for c in page.charts[:4]] == [
        ["reward/mean"],
        ["train/max_token_mult_prob_error"],
        ["forest/rows_per_rollout"],
        ["dropped_prompt_groups", "finalize/masked_rollouts"],
    ]


def test_report_draws_one_small_chart_for_every_other_series(page: ReportDom):
    headline = {"reward/mean", "reward/std", "train/max_token_mult_prob_error"}
    headline |= {"forest/rows_per_rollout", "dropped_prompt_groups", "finalize/masked_rollouts"}
    others = page.charts[4:]
    assert [c.title for c in others] == sorted(set(SAMPLE_SERIES) - headline)
    assert all(not c.headline and c.series == [c.title] for c in others)


def test_report_draws_a_point_per_finite_value(page: ReportDom):
    for chart in page.charts:
        for name in chart.series:
            expected = 4 if name in ("train/grad_norm", "roots/history_rewritten") else 5
            assert len(chart.points[name]) == chart.declared[name] == expected, name
            assert chart.markers[name] == expected, name


def test_report_breaks_the_line_at_a_null_value(page: ReportDom):
    chart = page.chart("train/grad_norm")
    assert [step for step, _ in chart.points["train/grad_norm"]] == [1, 2, 4, 5]
    assert (chart.lines["train/grad_norm"], chart.nulls["train/grad_norm"]) == (2, 1)


def test_report_joins_a_series_over_steps_it_was_not_logged(page: ReportDom):
    chart = page.chart("roots/history_rewritten")
    assert [step for step, _ in chart.points["roots/history_rewritten"]] == [2, 3, 4, 5]
    assert (chart.lines["roots/history_rewritten"], chart.nulls) == (1, {})


def test_report_shows_the_last_record_of_a_relogged_step(page: ReportDom):
    rewards = page.chart(HEADLINE_TITLES[0]).points["reward/mean"]
    assert rewards == [(1, "0.1"), (2, "0.2"), (3, "0.3"), (4, "0.45"), (5, "0.55")]


def test_report_draws_the_reward_band_from_the_std(page: ReportDom):
    (band,) = page.chart(HEADLINE_TITLES[0]).bands
    assert band.startswith("M") and band.endswith(" Z")
    assert len(band.split(" L")) == 2 * 5  # mean + std at 5 steps, then mean - std back


def test_report_prints_each_series_last_value(page: ReportDom):
    assert page.chart(HEADLINE_TITLES[0]).last == "last: 0.55 at step 5"
    assert page.chart(HEADLINE_TITLES[1]).last == "last: 1.00001 at step 5"
    assert page.chart(HEADLINE_TITLES[3]).last == (
        "last: dropped_prompt_groups 0 at step 5; finalize/masked_rollouts 0 at step 5"
    )


def test_report_labels_the_step_axis_and_the_value_axis(page: ReportDom):
    chart = page.chart("throughput/tokens_per_s")
    assert chart.x_labels == ["1", "2", "3", "4", "5"]
    assert chart.y_labels == ["1000", "2000", "3000", "4000", "5000"]


def test_report_tick_labels_tell_tmpe_values_near_one_apart(page: ReportDom):
    # 1 + 2e-6 * step for steps 1-5: ticks 2e-6 apart need six decimals
    labels = page.chart(HEADLINE_TITLES[1]).y_labels
    assert labels == ["1.000002", "1.000004", "1.000006", "1.000008", "1.000010"]


def test_report_of_a_one_step_run_draws_one_point_per_series(tmp_path: Path):
    with RunLog(tmp_path / "run", tensorboard=False) as log:
        log.log(7, sample_metrics(7), wall_time=1.0)
    write_report(tmp_path / "run", tmp_path / "report.html")
    dom = ReportDom((tmp_path / "report.html").read_text(encoding="utf-8"))
    for chart in dom.charts:
        assert chart.x_labels == ["7"]
        for name in chart.series:
            assert len(chart.points[name]) == 1, name
            assert chart.lines.get(name, 0) == 0


def test_report_of_a_long_run_keeps_every_value_in_the_line_and_thins_the_points(tmp_path: Path):
    with RunLog(tmp_path / "run", tensorboard=False) as log:
        for step in range(1, 1001):
            log.log(step, {"reward/mean": step / 1000}, wall_time=float(step))
    write_report(tmp_path / "run", tmp_path / "report.html")
    chart = ReportDom((tmp_path / "report.html").read_text(encoding="utf-8")).charts[0]
    steps = [step for step, _ in chart.points["reward/mean"]]
    # 1000 points, at most MAX_MARKERS = 300 drawn: every 4th (ceil(1000 / 300)) and the last
    assert (chart.vertices["reward/mean"], chart.declared["reward/mean"]) == (1000, 1000)
    assert steps == [*range(1, 1001, 4), 1000]
    assert chart.markers["reward/mean"] == 251 <= MAX_MARKERS


def test_report_says_which_headline_series_the_run_did_not_log(tmp_path: Path):
    with RunLog(tmp_path / "run", tensorboard=False) as log:
        log.log(1, {"reward/mean": 0.5, "train/grad_norm": math.nan}, wall_time=1.0)
    write_report(tmp_path / "run", tmp_path / "report.html")
    dom = ReportDom((tmp_path / "report.html").read_text(encoding="utf-8"))
    assert dom.chart(HEADLINE_TITLES[2]).empty == "not logged in this run"
    assert dom.chart("train/grad_norm").empty == "all 1 values null (not finite)"


def test_report_of_an_empty_log_says_the_run_has_no_metrics_yet(tmp_path: Path):
    run_dir = tmp_path / "run1"
    run_dir.mkdir()
    (run_dir / METRICS_FILE).write_text('{"step": 1, "wall')  # only a torn line
    with pytest.raises(NoMetricsYet, match=r"^run run1 has no metrics yet: .* holds no complete"):
        write_report(run_dir, tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_cli_report_writes_the_page_and_prints_a_line(sample_run: Path, tmp_path: Path):
    target = tmp_path / "report.html"
    workdir = sample_run.parent.parent
    outcome = run_grove("report", "sample", "--html", str(target), "--workdir", str(workdir))
    assert outcome.code == 0, outcome.stderr
    assert outcome.stdout == f"wrote {target} (5 steps, {len(SAMPLE_SERIES)} series)\n"
    assert len(ReportDom(target.read_text(encoding="utf-8")).charts) == len(SAMPLE_SERIES) - 2


def test_cli_report_takes_the_path_of_a_run_directory(sample_run: Path, tmp_path: Path):
    target = tmp_path / "report.html"
    outcome = run_grove("report", str(sample_run), "--html", str(target))
    assert (outcome.code, outcome.stdout.startswith(f"wrote {target} (5 steps")) == (0, True)


def test_cli_report_of_an_unknown_run_lists_the_runs(tmp_path: Path):
    for run in ("run-b", "run-a"):
        _mark_run(tmp_path / "runs" / run)
    outcome = run_grove(
        "report", "run-c", "--html", str(tmp_path / "r.html"), "--workdir", str(tmp_path)
    )
    assert outcome.code == 1
    assert outcome.stderr == (
        f"error: no run 'run-c' in {tmp_path}/runs; runs there: run-a, run-b\n"
    )


def test_cli_report_of_a_run_without_metrics_fails_with_the_reason(tmp_path: Path):
    _mark_run(tmp_path / "runs" / "fresh")
    outcome = run_grove(
        "report", "fresh", "--html", str(tmp_path / "r.html"), "--workdir", str(tmp_path)
    )
    assert outcome.code == 1
    assert outcome.stderr.startswith(
        f"error: run fresh has no metrics yet: {tmp_path}/runs/fresh/{METRICS_FILE} does not exist"
    )
    assert not (tmp_path / "r.html").exists()


@pytest.mark.xdist_group("grove-demo-ledger")
def test_cli_report_draws_every_metric_the_demo_run_logged(demo: DemoLedger, tmp_path: Path):
    target = tmp_path / "report.html"
    outcome = run_grove(
        "report", "latest", "--html", str(target), "--workdir", str(demo.workspace.workdir)
    )
    assert outcome.code == 0, outcome.stderr
    (record,) = read_metrics(demo.workspace.workdir / "runs" / demo.run_id)
    dom = ReportDom(target.read_text(encoding="utf-8"))
    drawn = {name: len(points) for chart in dom.charts for name, points in chart.points.items()}
    logged = {name: int(value is not None) for name, value in record.metrics.items()}
    assert drawn == {name: n for name, n in logged.items() if name != "reward/std"}
    assert {"reward/mean", "train/max_token_mult_prob_error", "forest/rows_per_rollout"} <= {
        name for name, n in drawn.items() if n == 1
    }
