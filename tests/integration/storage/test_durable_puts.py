"""A call is acknowledged only once what names it is durable: a local put fsyncs the blob's bytes,
then the name in its directory (and every directory it created, in its parent), before it
returns, and the capture service appends ``call.committed`` only after that; SQLite commits with
``synchronous=FULL`` (docs/reliability.md, "Durability").

The fsyncs are observed on a real file system through a wrapper around ``os.fsync`` that records
which file or directory each call synced: the OS call is the behaviour under test.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import Renderer, RenderOptions
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.database import SQLITE_SYNCHRONOUS
from grove.ledger.store import EventStore
from grove.storage import BlobStore, open_blob_store, staging_key

TEMPORARY_SUFFIX = re.compile(r"\.[0-9a-f]{16}\.tmp$")
FULL = 2  # PRAGMA synchronous reads back as a number: 0 OFF, 1 NORMAL, 2 FULL, 3 EXTRA


class Timeline(list[str]):
    """What happened, in order: ``fsync PATH`` (relative to the test directory; a temporary file
    as ``.NAME.tmp``) and ``append EVENT_TYPE``."""


@pytest.fixture
def timeline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Timeline:
    """Every ``os.fsync`` of this process from now on, as ``fsync PATH``."""
    happened = Timeline()
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        relative = TEMPORARY_SUFFIX.sub(".tmp", os.path.relpath(path, tmp_path))
        happened.append(f"fsync {relative}")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    return happened


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return open_blob_store(str(tmp_path / "blobs"))


def test_a_first_put_syncs_each_new_directory_then_the_bytes_then_the_name(
    store: BlobStore, timeline: Timeline
):
    store.put(staging_key("cap-1", "c1"), b"delta")
    assert timeline == [
        "fsync blobs",  # staging/ is now a name in blobs/
        "fsync blobs/staging",  # cap-1/ is now a name in staging/
        "fsync blobs/staging/cap-1/.c1.tmp",  # the bytes, before the link
        "fsync blobs/staging/cap-1",  # the name c1 (and the temporary name's removal)
    ]


def test_a_put_into_an_existing_directory_syncs_the_bytes_then_the_name(
    store: BlobStore, timeline: Timeline
):
    store.put(staging_key("cap-1", "c1"), b"delta")
    timeline.clear()
    store.put(staging_key("cap-1", "c2"), b"delta two")
    assert timeline == ["fsync blobs/staging/cap-1/.c2.tmp", "fsync blobs/staging/cap-1"]


def test_a_call_is_committed_only_after_its_blob_is_durable(
    tmp_path: Path, timeline: Timeline, monkeypatch: pytest.MonkeyPatch
):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    ledger = EventStore.open(url)
    real_append = EventStore.append

    def recording_append(self: EventStore, stream_id: str, events, *args, **kwargs):
        result = real_append(self, stream_id, events, *args, **kwargs)
        timeline.extend(f"append {getattr(e, 'event', e).type}" for e in events)
        return result

    monkeypatch.setattr(EventStore, "append", recording_append)
    tokenizer = build_tokenizer()
    capture = CaptureService(
        AttemptLog(ledger),
        open_blob_store(str(tmp_path / "blobs")),
        Renderer(tokenizer),
        EmbeddedEngine.build(tokenizer, seed=0),
        model_fingerprint="grove-tiny",
    )
    try:
        capture.open_attempt("att-1", rollout_id="r0", prompt_group="g0", rollout_index=0)
        timeline.clear()
        message = {"role": "user", "content": "hi"}
        options = RenderOptions(model="grove-tiny")
        capture.generate("att-1", ModelCall([message], options, SamplingParams(max_tokens=2), "c0"))
    finally:
        ledger.close()
    assert timeline == [
        "append call.intended",
        "fsync blobs",
        "fsync blobs/staging",
        "fsync blobs/staging/att-1/.c0.tmp",
        "fsync blobs/staging/att-1",
        "append call.committed",
    ]


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[EventStore]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    migrate.upgrade(url)
    opened = EventStore.open(url)
    try:
        yield opened
    finally:
        opened.close()


def test_sqlite_commits_are_synced_in_wal_mode(sqlite_store: EventStore):
    assert SQLITE_SYNCHRONOUS == "FULL"
    with sqlite_store.engine.connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
        assert conn.execute(text("PRAGMA synchronous")).scalar_one() == FULL
