"""Headless Chromium for the page tests: run it on a page, read back its screenshot.

Chromium is Debian's ``chromium`` (``tests/browser/ensure_chromium.sh`` installs it); the
``chromium`` fixture in ``conftest.py`` finds it. Screenshots are read with Pillow, which Grove
has through ``tensorboard``.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

from PIL import Image

__all__ = ["FLAGS", "PNG_SIGNATURE", "console_messages", "pixel_colors", "run_chromium"]

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
)
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    """Run ``binary`` headless with a fresh ``profile`` and ``args``; it must exit 0."""
    result = subprocess.run(
        [binary, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    return result


def screenshot(binary: str, page: Path, directory: Path, name: str) -> Path:
    """A 1400 x 1000 screenshot of ``page`` by ``binary``, written as ``directory/name``."""
    shot = directory / name
    run_chromium(
        binary,
        directory / "profile",
        "--hide-scrollbars",
        "--window-size=1400,1000",
        f"--screenshot={shot}",
        page.as_uri(),
    )
    return shot


def console_messages(result: subprocess.CompletedProcess[bytes]) -> list[str]:
    """What the page wrote to its console (script errors included), from a run with
    ``--enable-logging=stderr``."""
    lines = result.stderr.decode(errors="replace").splitlines()
    return [line for line in lines if ":CONSOLE" in line]


def pixel_colors(png: Path) -> Counter[tuple[int, int, int]]:
    """How many pixels of the screenshot ``png`` have each RGB colour."""
    with Image.open(png) as image:
        data = image.convert("RGB").tobytes()
    return Counter(zip(data[0::3], data[1::3], data[2::3], strict=True))
