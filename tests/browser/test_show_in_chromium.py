"""``grove show --html`` in a real browser: headless Chromium loads the page of a demo attempt,
takes a screenshot, and its DOM holds the capture graph's nodes and the reconstructed rows.

Chromium is Debian's ``chromium`` (``tests/browser/ensure_chromium.sh`` installs it). Without it
the test is skipped with that reason, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.browser.chromium import PNG_SIGNATURE, run_chromium, screenshot
from tests.integration.tools.ledgers import DemoLedger, demo_ledger, written_page
from tests.integration.tools.page_dom import PageDom

pytestmark = pytest.mark.xdist_group("grove-demo-ledger")


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoLedger:
    """The demo ledger the tools tests use (built once per process)."""
    return demo_ledger(tmp_path_factory.getbasetemp() / "grove-demo")


@pytest.fixture(scope="module")
def page(demo: DemoLedger, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return written_page(demo, tmp_path_factory.mktemp("browser") / "attempt.html")


def test_chromium_renders_the_graph_nodes_and_rows_into_the_dom(
    chromium: str, demo: DemoLedger, page: Path, tmp_path: Path
):
    result = run_chromium(chromium, tmp_path / "profile", "--dump-dom", page.as_uri())
    dom = PageDom(result.stdout.decode("utf-8"))
    state = demo.state(demo.showcase_key)
    assert list(dom.nodes) == list(state.calls)
    assert [r.call_ids for r in dom.rows] == [list(p) for p in state.finalized.paths]
    for row in dom.rows:
        assert len(row.tokens) == state.calls[row.call_ids[-1]].committed.cum_len
        assert {kind for kind, _ in row.tokens} >= {"ctx", "loss"}
    assert dom.fetches == []


def test_chromium_screenshots_the_page(chromium: str, page: Path, tmp_path: Path):
    shot = screenshot(chromium, page, tmp_path, "attempt.png")
    data = shot.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk
    assert (width, height) == (1400, 1000)
    assert len(data) > 20_000  # a blank page compresses to a few kilobytes
