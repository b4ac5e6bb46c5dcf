"""Fixtures of the reliability suites: an in-process capture service on a real ledger and blob
store (``capture``), and the figures file every suite reports into (``figures``: a scratch file
unless the run asks for ``tests/reliability/figures.json``).

The crash and concurrency suites run the gateway and the training worker as real processes
(``processes.py``); the tamper and bad-input suites drive the same components in this process.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerBase

from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.lifecycle import CaptureService
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.storage import open_blob_store

from .figures import FiguresFile, figures_path

MODEL = "grove/embedded-tiny"


@cache
def tokenizer() -> PreTrainedTokenizerBase:
    """The embedded tokenizer, built once per process."""
    return build_tokenizer()


@cache
def engine() -> EmbeddedEngine:
    """The embedded engine, built once per process (its calls are serialized)."""
    return EmbeddedEngine.build(tokenizer(), seed=5)


def capture_service(database_url: str, blob_url: str) -> CaptureService:
    """A capture service over a migrated ledger at ``database_url`` and blobs at ``blob_url``."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    return CaptureService(
        AttemptLog(store),
        open_blob_store(blob_url),
        Renderer(tokenizer()),
        engine(),
        model_fingerprint=MODEL,
    )


@pytest.fixture
def capture(tmp_path: Path) -> Iterator[CaptureService]:
    """A capture service on SQLite and a local blob directory."""
    service = capture_service(f"sqlite:///{tmp_path / 'ledger.db'}", str(tmp_path / "blobs"))
    try:
        yield service
    finally:
        service.log.store.close()


@pytest.fixture(scope="session")
def figures(tmp_path_factory: pytest.TempPathFactory) -> FiguresFile:
    """The suites' figures file: ``tests/reliability/figures.json`` (shared by xdist workers) when
    the run asks for it with ``GROVE_RELIABILITY_FIGURES=1``, else a scratch file of this run."""
    return FiguresFile(figures_path(os.environ, tmp_path_factory.getbasetemp()))
