"""The tiny run most configuration tests compare against (``tests/unit/config/runs.py``)."""

from __future__ import annotations

import pytest

from tests.unit.config.runs import Run, train


@pytest.fixture(scope="session")
def base_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``grove train`` on the tiny configuration, unchanged: two steps, tasks ``red`` then
    ``gold`` (the order ``data.shuffle_seed`` 0 draws), two rollouts each, one 4-token call."""
    return train(tmp_path_factory.mktemp("base"))
