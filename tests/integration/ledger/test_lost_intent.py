"""A ledger that loses events under a running writer (a database restored from a backup) is read
again from its start: a call whose intent was lost cannot be committed, and nothing is written
(``ledger/attempt.py``, ``AttemptLog``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from grove.ledger import migrate
from grove.ledger.attempt import AttemptError, AttemptLog
from grove.ledger.store import EventStore

from .scenario import committed, intended, opened


def test_a_commit_whose_intent_the_ledger_lost_fails_and_writes_nothing(tmp_path: Path):
    # The database file is put back as it was before the intent, under the running writer.
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    migrate.upgrade(url)
    store = EventStore.open(url)
    try:
        log = AttemptLog(store)
        log.open(opened("att-1"))
        store.close()
        shutil.copy(path, tmp_path / "before.db")
        log.intend("att-1", intended("c1"))
        store.close()
        shutil.copy(tmp_path / "before.db", path)
        for suffix in ("-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        with pytest.raises(AttemptError, match="commit of a call that was never intended"):
            log.commit("att-1", committed("att-1", "c1"))
        assert [e.event_type for e in store.read_stream("att-1")] == ["attempt.opened"]
    finally:
        store.close()
