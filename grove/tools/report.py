"""``grove report RUN --html FILE``: a training run's curves as one self-contained page.

The page reads the run's ``metrics.jsonl`` (``grove.train.run_log.read_metrics``: the last record
of each step) and draws, first, four headline charts — the reward (``reward/mean``, with a
``±reward/std`` band when the run logs it), the largest token multiplicative probability error
(``train/max_token_mult_prob_error``), rows per logical rollout (``forest/rows_per_rollout``) and
what the step dropped (``dropped_prompt_groups``, ``finalize/masked_rollouts``) — then one small
chart for every other series, by name. Every chart shares the run's step axis and has its title,
ticks with values on both axes, a point per finite value (hover one for its step and value; a
run of more than ``MAX_MARKERS`` steps marks every k-th) and the series' last value.
``docs/metrics.md`` says what each name means.

A value logged as ``null`` (not a finite number) is a gap: the line breaks there and a short mark
under the axis shows the step. A step where a series was not logged at all is skipped without a
break. Everything is drawn here as inline SVG, with inline CSS and a few lines of JavaScript for the
hover read-out, like ``grove show`` (``grove.tools.show``): nothing is fetched.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from string import Template
from typing import Final

from grove.train.run_log import METRICS_FILE, RunLogError, StepRecord, read_metrics
from grove.train.runs import RUNS_DIR, run_path

__all__ = [
    "HEADLINE_METRICS",
    "MAX_MARKERS",
    "RUNS_DIR",
    "NoMetricsYet",
    "ReportPage",
    "render_report",
    "resolve_run_dir",
    "write_report",
]


Point = tuple[int, float | None]  # (step, value); None: logged, but not a finite number
Scale = Callable[[float], float]  # a step or a value to an SVG coordinate


class NoMetricsYet(RunLogError):
    """The run directory holds no complete metrics record (``path`` is its ``metrics.jsonl``)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.path = run_dir / METRICS_FILE
        state = "holds no complete record" if self.path.exists() else "does not exist"
        super().__init__(
            "run_has_no_metrics",
            f"run {run_dir.name} has no metrics yet: {self.path} {state}. The trainer appends "
            "one line per optimizer step; wait for the first step to finish, or check that "
            "this is the run's directory",
        )


@dataclass(frozen=True)
class ReportPage:
    """What ``write_report`` wrote: the file, how many steps and how many metric series."""

    path: Path
    steps: int
    series: int


def resolve_run_dir(workdir: Path, run: str) -> Path:
    """The directory of ``run``: the path of a run directory, else ``workdir/runs/RUN`` for a run
    id (``latest``: the newest run); ``RunNotFound`` lists the runs there are."""
    path = Path(run).expanduser()
    if run and path.is_dir() and (path / METRICS_FILE).exists():
        return path
    return run_path(workdir, run)


# --- what is drawn -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    name: str
    color: str
    points: list[Point]


@dataclass(frozen=True)
class _Chart:
    title: str
    lines: list[_Line]
    headline: bool = False
    band: list[list[tuple[int, float, float]]] = field(default_factory=list)  # (step, lo, hi)
    band_name: str | None = None


_BLUE, _RED, _TEAL, _ORANGE, _PURPLE = "#4c78a8", "#e45756", "#59a89c", "#f58518", "#b279a2"
# the small charts' colours, by prefix: none of them is a headline colour
_PREFIX_COLORS = {"train": "#9d755d", "forest": "#72b7b2", "roots": "#d67195"}
_OTHER_COLOR = "#54a24b"

#: The headline charts, in order: title and the series each draws (``reward/std`` is a band).
HEADLINE_METRICS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("Reward (mean ± std)", ("reward/mean", "reward/std")),
    ("Max token multiplicative probability error", ("train/max_token_mult_prob_error",)),
    ("Rows per logical rollout", ("forest/rows_per_rollout",)),
    (
        "Drops: prompt groups and masked rollouts",
        ("dropped_prompt_groups", "finalize/masked_rollouts"),
    ),
)
_HEADLINE_COLORS = {
    "reward/mean": _BLUE,
    "train/max_token_mult_prob_error": _RED,
    "forest/rows_per_rollout": _TEAL,
    "dropped_prompt_groups": _ORANGE,
    "finalize/masked_rollouts": _PURPLE,
}


def _series(records: Sequence[StepRecord]) -> dict[str, list[Point]]:
    """Each metric name (in order of first appearance) and its points, in step order."""
    series: dict[str, list[Point]] = {}
    for record in records:
        for name, value in record.metrics.items():
            series.setdefault(name, []).append((record.step, value))
    return series


def _segments(points: Sequence[Point]) -> list[list[tuple[int, float]]]:
    """The stretches of a line between its null values."""
    segments: list[list[tuple[int, float]]] = [[]]
    for step, value in points:
        if value is None:
            segments.append([])
        else:
            segments[-1].append((step, value))
    return [segment for segment in segments if segment]


def _band(
    means: Sequence[Point], stds: dict[int, float | None]
) -> list[list[tuple[int, float, float]]]:
    """``mean ± std`` in stretches: broken wherever the mean is null or the std is missing."""
    band: list[list[tuple[int, float, float]]] = [[]]
    for step, mean in means:
        std = stds.get(step)
        if mean is None or std is None:
            band.append([])
        else:
            band[-1].append((step, mean - std, mean + std))
    return [stretch for stretch in band if stretch]


def _charts(series: dict[str, list[Point]]) -> list[_Chart]:
    charts = []
    for title, names in HEADLINE_METRICS:
        if names[0] == "reward/mean":
            mean = _Line("reward/mean", _BLUE, series.get("reward/mean", []))
            band = _band(mean.points, dict(series.get("reward/std", [])))
            band_name = "reward/std" if "reward/std" in series else None
            charts.append(_Chart(title, [mean], True, band, band_name))
            continue
        lines = [_Line(name, _HEADLINE_COLORS[name], series.get(name, [])) for name in names]
        charts.append(_Chart(title, lines, True))
    drawn = {name for _, names in HEADLINE_METRICS for name in names}
    for name in sorted(set(series) - drawn):
        color = _PREFIX_COLORS.get(name.split("/")[0], _OTHER_COLOR)
        charts.append(_Chart(name, [_Line(name, color, series[name])]))
    return charts


# --- axes --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Axis:
    low: float
    high: float
    ticks: list[float]
    labels: list[str]


def _nice_step(raw: float, integer: bool) -> float:
    magnitude = 10 ** math.floor(math.log10(raw))
    multiples = (1, 2, 5, 10) if integer else (1, 2, 2.5, 5, 10)
    step = next(m * magnitude for m in multiples if m * magnitude >= raw * (1 - 1e-9))
    return max(step, 1.0) if integer else step


def _labels(ticks: list[float], step: float, integer: bool) -> list[str]:
    if integer:
        return [str(round(t)) for t in ticks]
    largest = max(abs(t) for t in ticks)
    if largest >= 1e6 or largest < 1e-3:
        return ["0" if abs(t) < step * 1e-6 else f"{t:.3g}" for t in ticks]
    mantissa = step / 10 ** math.floor(math.log10(step))
    decimals = max(0, -math.floor(math.log10(step)) + (1 if round(mantissa, 6) == 2.5 else 0))
    return [f"{0.0 if abs(t) < step * 1e-6 else t:.{decimals}f}" for t in ticks]


def _axis(values: Sequence[float], *, integer: bool = False, intervals: int = 4) -> _Axis:
    """A domain that starts and ends on a tick, about ``intervals`` ticks apart, with labels
    precise enough to tell neighbouring ticks apart (``1.000002`` next to ``1.000004``)."""
    low, high = min(values), max(values)
    if integer and low == high:
        return _Axis(low - 0.5, high + 0.5, [low], [str(round(low))])
    if high - low <= 1e-12 * max(abs(low), abs(high)):
        pad = abs(low) * 0.1 or 1.0
        low, high = low - pad, high + pad
    step = _nice_step((high - low) / intervals, integer)
    first, last = math.floor(low / step + 1e-9), math.ceil(high / step - 1e-9)
    ticks = [i * step for i in range(first, last + 1)]
    return _Axis(ticks[0], ticks[-1], ticks, _labels(ticks, step, integer))


def _value(value: float) -> str:
    """A value as printed beside a chart: integers whole, the rest to 8 significant digits."""
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.8g}"


# --- SVG -----------------------------------------------------------------------------------------

_LEFT, _RIGHT, _TOP, _BOTTOM, _INSET = 70, 14, 10, 30, 6
#: Points drawn per series at most (a long run's line keeps every value; its markers thin out,
#: so that a page of thousands of steps stays a few megabytes).
MAX_MARKERS: Final = 300


def _svg(chart: _Chart, x_axis: _Axis, width: int, height: int) -> str:
    finite = [v for line in chart.lines for _, v in line.points if v is not None]
    finite += [bound for stretch in chart.band for _, low, high in stretch for bound in (low, high)]
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{html.escape(chart.title)}">',
        f'<rect class="frame" x="{_LEFT}" y="{_TOP}" width="{plot_w}" height="{plot_h}"/>',
    ]

    def x(step: float) -> float:  # points stay _INSET clear of the frame, as in y below
        span = x_axis.high - x_axis.low
        return round(_LEFT + _INSET + (step - x_axis.low) / span * (plot_w - 2 * _INSET), 2)

    bottom = _TOP + plot_h
    for tick, label in zip(x_axis.ticks, x_axis.labels, strict=True):
        parts.append(
            f'<line class="tick" x1="{x(tick)}" y1="{bottom}" x2="{x(tick)}" y2="{bottom + 4}"/>'
            f'<text class="xlabel" x="{x(tick)}" y="{bottom + 16}">{label}</text>'
        )
    parts.append(f'<text class="axisname" x="{_LEFT + plot_w}" y="{height - 2}">step</text>')
    if not finite:
        nulls = sum(v is None for line in chart.lines for _, v in line.points)
        note = f"all {nulls} values null (not finite)" if nulls else "not logged in this run"
        parts.append(
            f'<text class="empty" x="{_LEFT + plot_w / 2}" y="{_TOP + plot_h / 2}">{note}</text>'
        )
    else:
        y_axis = _axis(finite)

        def y(value: float) -> float:
            span = y_axis.high - y_axis.low
            return round(_TOP + _INSET + (y_axis.high - value) / span * (plot_h - 2 * _INSET), 2)

        for tick, label in zip(y_axis.ticks, y_axis.labels, strict=True):
            parts.append(
                f'<line class="grid" x1="{_LEFT}" y1="{y(tick)}" x2="{_LEFT + plot_w}" '
                f'y2="{y(tick)}"/><text class="ylabel" x="{_LEFT - 6}" y="{y(tick) + 4}">'
                f"{label}</text>"
            )
        for stretch in chart.band:
            upper = " L".join(f"{x(s)},{y(high)}" for s, _, high in stretch)
            lower = " L".join(f"{x(s)},{y(low)}" for s, low, _ in reversed(stretch))
            parts.append(
                f'<path class="band" data-series="{html.escape(chart.band_name or "")}" '
                f'fill="{chart.lines[0].color}" d="M{upper} L{lower} Z"/>'
            )
        for index, line in enumerate(chart.lines):  # later lines dashed: equal values overlap
            parts.append(_line_svg(line, x, y, bottom, dashed=index > 0))
    parts.append("</svg>")
    return "".join(parts)


def _line_svg(line: _Line, x: Scale, y: Scale, bottom: float, *, dashed: bool = False) -> str:
    """A series: its line (broken at nulls), a point per finite value (every k-th, and the last,
    beyond ``MAX_MARKERS``), a mark per null."""
    finite = [(step, v) for step, v in line.points if v is not None]
    every = math.ceil(len(finite) / MAX_MARKERS) if finite else 1
    markers = [p for i, p in enumerate(finite) if i % every == 0 or i == len(finite) - 1]
    name = html.escape(line.name)
    parts = [
        f'<g class="series" data-series="{name}" data-points="{len(finite)}" '
        f'data-markers="{len(markers)}">'
    ]
    for segment in _segments(line.points):
        if len(segment) > 1:
            d = " L".join(f"{x(step)},{y(v)}" for step, v in segment)
            dash = ' stroke-dasharray="6 4"' if dashed else ""
            parts.append(f'<path class="line" stroke="{line.color}"{dash} d="M{d}"/>')
    for step, value in markers:
        parts.append(
            f'<circle class="pt" cx="{x(step)}" cy="{y(value)}" r="3" fill="{line.color}" '
            f'data-step="{step}" data-value="{_value(value)}"><title>{name} · step {step}: '
            f"{_value(value)}</title></circle>"
        )
    for step, point in line.points:
        if point is None:
            parts.append(
                f'<path class="null" stroke="{line.color}" d="M{x(step)},{bottom - 7} '
                f'L{x(step)},{bottom - 1}"><title>{name} · step {step}: null (not a finite '
                "number)</title></path>"
            )
    parts.append("</g>")
    return "".join(parts)


def _legend(chart: _Chart) -> str:
    if len(chart.lines) == 1 and chart.band_name is None:
        return ""
    items = [
        f'<span class="key"><span class="swatch" style="background:{line.color}"></span>'
        f"{html.escape(line.name)}</span>"
        for line in chart.lines
    ]
    if chart.band_name is not None:
        items.append(
            f'<span class="key"><span class="swatch band" '
            f'style="background:{chart.lines[0].color}"></span>± '
            f"{html.escape(chart.band_name)}</span>"
        )
    return f'<div class="legend">{"".join(items)}</div>'


def _last(chart: _Chart) -> str:
    parts = []
    for line in chart.lines:
        finite = [(step, v) for step, v in line.points if v is not None]
        if finite:
            step, value = finite[-1]
            label = f"{html.escape(line.name)} " if len(chart.lines) > 1 else ""
            parts.append(f"{label}<b>{_value(value)}</b> at step {step}")
    return "last: " + "; ".join(parts) if parts else "no value yet"


def _figure(chart: _Chart, x_axis: _Axis) -> str:
    width, height = (560, 250) if chart.headline else (400, 180)
    names = " ".join(line.name for line in chart.lines)
    return (
        f'<figure class="card{" headline" if chart.headline else ""}" style="width:{width}px" '
        f'data-chart="{html.escape(chart.title)}" data-series="{html.escape(names)}">'
        f'<figcaption><span class="title">{html.escape(chart.title)}</span>'
        f'<span class="last">{_last(chart)}</span></figcaption>{_legend(chart)}'
        f"{_svg(chart, x_axis, width, height)}"
        '<div class="readout">&#8203;</div></figure>'
    )


_PAGE = Template("""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>Grove · run $run</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 22px 0 6px; }
.meta { color: #555; margin: 0; }
.charts { display: flex; flex-wrap: wrap; align-items: flex-start; gap: 14px; }
.card { margin: 0; padding: 8px 10px 4px; border: 1px solid #ddd; border-radius: 6px; }
figcaption { display: flex; flex-wrap: wrap; justify-content: space-between; column-gap: 12px;
  font-size: 13px; }
figcaption .title { font-weight: 600; } figcaption .last { color: #555; }
.headline figcaption { font-size: 14px; }
.legend { font-size: 12px; color: #444; } .key { margin-right: 12px; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 4px; }
.swatch.band { opacity: 0.25; }
.readout { font: 12px monospace; color: #333; min-height: 16px; }
svg.chart { display: block; }
svg.chart .frame { fill: none; stroke: #bbb; }
svg.chart .grid { stroke: #eee; }
svg.chart .tick { stroke: #888; }
svg.chart text { font: 11px system-ui, sans-serif; fill: #555; }
svg.chart .xlabel { text-anchor: middle; } svg.chart .ylabel { text-anchor: end; }
svg.chart .axisname { text-anchor: end; fill: #888; }
svg.chart .empty { text-anchor: middle; fill: #999; font-style: italic; }
svg.chart .band { opacity: 0.18; stroke: none; }
svg.chart .line { fill: none; stroke-width: 1.75; }
svg.chart .null { stroke-width: 2; }
svg.chart .pt { stroke: #fff; stroke-width: 1; }
svg.chart .pt.hl { r: 5; stroke: #222; }
</style></head>
<body>
<h1>Run $run</h1>
<p class="meta">$meta</p>
<p class="meta">$source</p>
<h2>Headline</h2>
<div class="charts">$headline</div>
<h2>Every other series</h2>
<div class="charts">$others</div>
<script>
for (const pt of document.querySelectorAll("svg.chart .pt")) {
  const readout = pt.closest("figure").querySelector(".readout");
  const series = pt.closest(".series").getAttribute("data-series");
  pt.addEventListener("mouseenter", () => {
    pt.classList.add("hl");
    readout.textContent = series + " · step " + pt.dataset.step + ": " + pt.dataset.value;
  });
  pt.addEventListener("mouseleave", () => pt.classList.remove("hl"));
}
document.body.dataset.charts = String(document.querySelectorAll("figure.card").length);
</script>
</body></html>
""")


def _meta(records: Sequence[StepRecord], series: int) -> str:
    first, last = records[0], records[-1]
    start, end = (
        datetime.fromtimestamp(r.wall_time, UTC).strftime("%Y-%m-%d %H:%M:%S")
        for r in (first, last)
    )
    minutes = (last.wall_time - first.wall_time) / 60
    steps = f"step {first.step}" if len(records) == 1 else f"steps {first.step}–{last.step}"
    return html.escape(
        f"{len(records)} logged steps ({steps}) · {series} series · "
        f"logged {start} to {end} UTC ({minutes:.1f} min)"
    )


def render_report(run: str, records: Sequence[StepRecord], source: str = "") -> str:
    """The page of run ``run`` from its ``records`` (one per step, in step order, at least
    one); ``source`` says where they were read."""
    series = _series(records)
    charts = _charts(series)
    x_axis = _axis([float(r.step) for r in records], integer=True, intervals=6)
    return _PAGE.substitute(
        run=html.escape(run),
        meta=_meta(records, len(series)),
        source=html.escape(source),
        headline="".join(_figure(c, x_axis) for c in charts if c.headline),
        others="".join(_figure(c, x_axis) for c in charts if not c.headline)
        or '<p class="meta">none</p>',
    )


def write_report(run_dir: Path, html: Path) -> ReportPage:
    """Write the report page of the run in ``run_dir`` to ``html`` (written whole, then moved
    into place, so a page open in a browser is never half written)."""
    run_dir = Path(run_dir)
    records = read_metrics(run_dir)
    if not records:
        raise NoMetricsYet(run_dir)
    page = render_report(
        run_dir.name, records, f"from {run_dir / METRICS_FILE} (the last record of each step)"
    )
    partial = html.with_name(f".{html.name}.partial")
    partial.write_text(page, encoding="utf-8")
    os.replace(partial, html)
    return ReportPage(path=html, steps=len(records), series=len(_series(records)))
