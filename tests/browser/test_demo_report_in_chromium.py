"""The page ``make demo`` writes (``grove report latest --html``) in a real browser: headless
Chromium loads the report of a short demo run, runs its script without a console message, keeps
the reward chart with a point per step, and paints the reward in its colour.

Without Chromium the test is skipped with that reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.browser.chromium import (
    PNG_SIGNATURE,
    console_messages,
    pixel_colors,
    run_chromium,
    screenshot,
)
from tests.browser.test_report_in_chromium import REWARD
from tests.integration.tools.test_report import ReportDom
from tests.unit.jobs.warm_cache import seed_workdir

GROVE = str(Path(sys.executable).parent / "grove")
STEPS = 2

pytestmark = pytest.mark.slow


def grove(*args: str) -> str:
    """Run the ``grove`` command line; it must exit 0. Returns its standard output."""
    result = subprocess.run(
        [GROVE, *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": "0"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report of a short demo run, written as ``make demo`` writes it."""
    workdir = tmp_path_factory.mktemp("demo-report")
    seed_workdir(workdir, tmp_path_factory.getbasetemp())  # the demo's warm start, fitted once
    grove("demo", "--json", "--steps", str(STEPS), "--workdir", str(workdir))
    html = workdir / "demo-report.html"
    grove("report", "latest", "--html", str(html), "--workdir", str(workdir))
    return html


def test_chromium_keeps_the_demo_reward_chart_with_a_point_per_step(
    chromium: str, page: Path, tmp_path: Path
):
    result = run_chromium(
        chromium, tmp_path / "profile", "--enable-logging=stderr", "--dump-dom", page.as_uri()
    )

    dom = ReportDom(result.stdout.decode("utf-8"))
    reward = next(c for c in dom.charts if "reward/mean" in c.series)
    assert [step for step, _ in reward.points["reward/mean"]] == list(range(1, STEPS + 1))
    assert dom.body.get("data-charts") == str(len(dom.charts))  # the script ran to its end
    assert console_messages(result) == []
    assert dom.fetches == []


def test_chromium_paints_the_demo_reward_in_its_colour(chromium: str, page: Path, tmp_path: Path):
    shot = screenshot(chromium, page, tmp_path, "demo-report.png")

    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    # two points of radius 3 and the line between them, beyond a legend swatch's 100 pixels
    assert pixel_colors(shot)[REWARD] > 120
