"""``grove report --html`` in a real browser: headless Chromium loads the page of the sample run
(``tests/integration/tools/test_report.py``), runs its script without a console message, keeps
every chart and point in its DOM, and paints each headline series in its colour.

Without Chromium the test is skipped with that reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.tools.report import write_report
from tests.browser.chromium import (
    PNG_SIGNATURE,
    console_messages,
    pixel_colors,
    run_chromium,
    screenshot,
)
from tests.integration.tools.test_report import SAMPLE_SERIES, ReportDom, write_sample_run

# the headline series' colours (grove/tools/report.py), which no other chart uses, as RGB
REWARD, TMPE, ROWS, DROPPED, MASKED = (
    (0x4C, 0x78, 0xA8),
    (0xE4, 0x57, 0x56),
    (0x59, 0xA8, 0x9C),
    (0xF5, 0x85, 0x18),
    (0xB2, 0x79, 0xA2),
)


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("report-browser")
    return write_report(write_sample_run(root / "runs" / "sample"), root / "report.html").path


def test_chromium_keeps_every_chart_and_point_in_the_dom(chromium: str, page: Path, tmp_path: Path):
    result = run_chromium(
        chromium, tmp_path / "profile", "--enable-logging=stderr", "--dump-dom", page.as_uri()
    )
    dom = ReportDom(result.stdout.decode("utf-8"))
    written = ReportDom(page.read_text(encoding="utf-8"))
    assert len(dom.charts) == len(SAMPLE_SERIES) - 2  # reward/std is a band; drops share one
    assert [(c.title, c.points, c.lines, c.bands) for c in dom.charts] == [
        (c.title, c.points, c.lines, c.bands) for c in written.charts
    ]
    assert dom.body.get("data-charts") == str(len(dom.charts))  # the script ran to its end
    assert console_messages(result) == []
    assert dom.fetches == []


def test_chromium_paints_each_headline_series_in_its_colour(
    chromium: str, page: Path, tmp_path: Path
):
    shot = screenshot(chromium, page, tmp_path, "report.png")
    assert shot.read_bytes()[:8] == PNG_SIGNATURE
    colors = pixel_colors(shot)
    headline = {"reward": REWARD, "tmpe": TMPE, "rows": ROWS, "dropped": DROPPED, "masked": MASKED}
    painted = {name: colors[rgb] for name, rgb in headline.items()}
    # five points of radius 3 and the line between them, beyond a legend swatch's 100 pixels
    assert all(count > 200 for count in painted.values()), painted
