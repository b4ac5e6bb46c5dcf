"""The GPU suite (``make test-gpu``): every test here needs CUDA, and is skipped without it, so
``make test`` collects and skips them on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch

SKIP_REASON = "needs CUDA: run make test-gpu on a machine with a GPU"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip every test under ``tests/gpu`` when torch sees no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=SKIP_REASON)
    for item in items:
        if "tests/gpu/" in str(item.path).replace("\\", "/"):
            item.add_marker(skip)
