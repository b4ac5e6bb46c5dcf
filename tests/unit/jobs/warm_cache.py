"""The default warm start, fitted once per test process and copied into the workdirs that need it.

The default fit takes tens of seconds on a CPU; tests that need the warm-started model, rather
than the fit itself (``tests/unit/jobs/test_warm_start.py``), share one cache entry: the first
caller fits it under the process's pytest base directory, later callers load it, and
:func:`seed_workdir` copies it into a run's workdir, where ``grove train`` finds it by its key.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from grove.demo.warm_start import CACHE_DIRECTORY
from grove.engines.models import EMBEDDED, LoadedModel, load_model

__all__ = ["seed_workdir", "warm_model"]


def _root(base: Path) -> Path:
    return base / "shared-warm-start"


def warm_model(base: Path, *, dtype: str = "float32") -> LoadedModel:
    """The embedded model (seed 0) with the default warm start, cached under ``base``."""
    return load_model(EMBEDDED, dtype=dtype, warm_start_dir=_root(base))


def seed_workdir(workdir: Path, base: Path) -> Path:
    """Copy the default warm start's cache (fitted under ``base`` if need be) into ``workdir``;
    returns the copied entry's directory."""
    warm_model(base)
    source = _root(base) / CACHE_DIRECTORY
    shutil.copytree(source, workdir / CACHE_DIRECTORY, dirs_exist_ok=True)
    (entry,) = (p for p in (workdir / CACHE_DIRECTORY).iterdir() if not p.name.startswith("."))
    return entry
