"""The demo's closing lines: the reward of every step as a sparkline, and where its report is.

``make demo`` runs ``grove demo``, then ``grove report latest --html FILE``, then
``python -m grove.demo.curve FILE``, which reads the run's ``metrics.jsonl`` (the newest run of
the workdir, ``.grove`` unless ``--workdir`` names another) and prints, last of all, one bar per
step of ``reward/mean``, scaled from 0 to 1 as the demo's reward is, the means of the first and
the last three steps, and the report's path.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from grove.train.run_log import read_metrics
from grove.train.runs import run_path
from grove.workspace import DEFAULT_WORKDIR

__all__ = ["BARS", "EDGE_STEPS", "edge_means", "main", "rewards", "sparkline"]

BARS: Final = "▁▂▃▄▅▆▇█"
"""The sparkline's bars, lowest first: a reward of 0 is the first, a reward of 1 the last."""

EDGE_STEPS: Final = 3
"""How many steps the first and the last means each cover."""


def sparkline(values: Sequence[float | None]) -> str:
    """One bar per value in [0, 1] (clamped); a value that is None or not finite is a space."""
    bars = []
    for value in values:
        if value is None or not math.isfinite(value):
            bars.append(" ")
            continue
        level = round(min(max(value, 0.0), 1.0) * (len(BARS) - 1))
        bars.append(BARS[level])
    return "".join(bars)


def rewards(run_dir: Path) -> list[float | None]:
    """``reward/mean`` of each logged step of the run in ``run_dir``, in step order."""
    return [record.metrics.get("reward/mean") for record in read_metrics(run_dir)]


def edge_means(values: Sequence[float | None]) -> tuple[float, float]:
    """The mean reward of the first ``EDGE_STEPS`` finite values and of the last ones."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        raise ValueError("the run logged no finite reward/mean yet")
    first, last = finite[:EDGE_STEPS], finite[-EDGE_STEPS:]
    return sum(first) / len(first), sum(last) / len(last)


def main(argv: Sequence[str] | None = None) -> None:
    """Print the newest run's reward sparkline, its first and last means, and the report path."""
    parser = argparse.ArgumentParser(prog="python -m grove.demo.curve", description=__doc__)
    parser.add_argument("report", type=Path, help="the page `grove report` wrote")
    parser.add_argument("--workdir", type=Path, default=DEFAULT_WORKDIR)
    args = parser.parse_args(argv)
    run_dir = run_path(args.workdir, None)
    values = rewards(run_dir)
    first, last = edge_means(values)
    print(f"reward per step ({len(values)} steps, run {run_dir.name}, 0 to 1):")
    print(f"  {sparkline(values)}")
    print(
        f"  first {EDGE_STEPS} steps {first:.3f}  ->  last {EDGE_STEPS} steps {last:.3f}"
        f"  ({last - first:+.3f})"
    )
    print(f"report: {args.report.resolve()}")


if __name__ == "__main__":
    main()
