"""A migrated ledger on each database."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from grove.ledger import migrate
from grove.ledger.store import EventStore


@pytest.fixture
def ledger_url(database_url: str) -> str:
    """The test database, upgraded to the head revision."""
    migrate.upgrade(database_url)
    return database_url


@pytest.fixture
def store(ledger_url: str) -> Iterator[EventStore]:
    """An event store on the migrated test database."""
    opened = EventStore.open(ledger_url)
    try:
        yield opened
    finally:
        opened.close()
