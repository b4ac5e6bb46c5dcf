"""The Chromium binary for the page tests: skipped without one, a failure under ``CI=true``."""

from __future__ import annotations

import os
import shutil

import pytest


@pytest.fixture(scope="module")
def chromium() -> str:
    """The Chromium binary; skipped without one, a failure under CI=true."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        reason = "chromium is not installed: run tests/browser/ensure_chromium.sh"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true needs the browser tests: {reason}")
        pytest.skip(reason)
    return binary
