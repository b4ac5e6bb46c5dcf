"""The demo ledger for the debugging tools: built once per process, copied per database.

Every module here (and tests/browser) is marked ``xdist_group("grove-demo-ledger")`` so that
``make test`` (``--dist loadgroup``) runs them on one worker, which builds the ledger once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .ledgers import DemoLedger, copy_ledger, demo_ledger


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> DemoLedger:
    """The ledger and blobs of ``grove demo --steps 1``, shared read-only by every test."""
    return demo_ledger(tmp_path_factory.getbasetemp() / "grove-demo")


@pytest.fixture
def ledger_url(demo: DemoLedger, database_url: str) -> Iterator[str]:
    """A fresh database (SQLite or PostgreSQL) holding a copy of the demo ledger."""
    copy_ledger(demo, database_url)
    yield database_url
