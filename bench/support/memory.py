"""A process's resident memory as Linux counts it: now, at its peak, and a reset of the peak.

``reset_peak`` writes ``5`` to ``/proc/self/clear_refs``, which sets the peak (``VmHWM``) back to
the present resident size (``VmRSS``), so the peak that follows is that of what runs after it.
Resident memory follows the live tensors only when freed memory goes back to the kernel:
``FREED_TO_KERNEL`` is the environment under which glibc serves every allocation of 64 KiB or
more with its own ``mmap`` and unmaps it on ``free`` (a fixed ``M_MMAP_THRESHOLD``, which also
turns off glibc's raising of the threshold after a free). Start a measured process with it.
"""

from __future__ import annotations

import ctypes
import gc
import re
from pathlib import Path

__all__ = ["FREED_TO_KERNEL", "peak_resident_bytes", "reset_peak", "resident_bytes"]

FREED_TO_KERNEL = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}


def _status_kib(field: str) -> int:
    text = Path("/proc/self/status").read_text()
    found = re.search(rf"^{field}:\s+(\d+) kB$", text, re.MULTILINE)
    if found is None:
        raise RuntimeError(f"/proc/self/status has no {field} line")
    return int(found.group(1))


def resident_bytes() -> int:
    """This process's resident memory now (``VmRSS``)."""
    return _status_kib("VmRSS") * 1024


def peak_resident_bytes() -> int:
    """This process's peak resident memory since it started or since ``reset_peak`` (``VmHWM``)."""
    return _status_kib("VmHWM") * 1024


def reset_peak() -> None:
    """Collect garbage, hand free heap memory back to the kernel, and set the peak to now."""
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")
