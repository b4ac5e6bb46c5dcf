"""Cleanup of staging blobs: exact deletes, orphan collection, and staging-partition teardown.

Rules (``docs/storage.md``, "Cleanup rules"):

- A blob is written before its ``call.committed`` event, so a blob that no event names is an
  **orphan** — unless its call is **pending** (intended, neither committed nor failed-and-settled):
  its writer may still be writing, so its key looks orphaned but is not.
- Keys of pending calls are never removed by cleanup (``delete_blobs``, ``collect_orphans``);
  only **teardown** of the attempt's whole staging partition removes them, after the attempt's
  wait for pending calls is over. Late writes after teardown are orphans for the next collection.
- Every function returns the exact keys it removed, for the ledger's ``attempt.cleaned`` event.

``orphan_keys`` is the pure rule; the other functions apply it to a ``BlobStore``. Which keys of
an attempt may go, and when, depends on its selection and publication: ``grove.training.cleanup``
decides that and calls these (``docs/storage.md``, "Cleanup").
"""

from __future__ import annotations

from collections.abc import Iterable

from grove.storage.errors import PendingBlobError
from grove.storage.faults import backend_errors
from grove.storage.keys import STAGING, staging_prefix, validate_key, validate_prefix
from grove.storage.store import BlobStore

__all__ = [
    "blob_sizes",
    "collect_orphans",
    "delete_blobs",
    "find_orphans",
    "orphan_keys",
    "teardown_partition",
]


def orphan_keys(stored: Iterable[str], known: Iterable[str], pending: Iterable[str]) -> list[str]:
    """The stored keys that no event names and no pending call may still write, sorted."""
    return sorted(set(stored) - set(known) - set(pending))


def find_orphans(
    store: BlobStore,
    *,
    known_keys: Iterable[str],
    pending_keys: Iterable[str] = (),
    prefix: str = f"{STAGING}/",
) -> list[str]:
    """The orphans stored under ``prefix`` (default: all staging partitions), given the keys the
    ledger's events name (``known_keys``) and the keys of pending calls (``pending_keys``)."""
    validate_prefix(prefix)
    return orphan_keys(store.list_keys(prefix), known_keys, pending_keys)


def delete_blobs(
    store: BlobStore, keys: Iterable[str], *, pending_keys: Iterable[str] = ()
) -> list[str]:
    """Delete exactly ``keys`` (absent ones are fine) and return them; ``PendingBlobError``, with
    nothing deleted, if any of them is the key of a pending call."""
    keys = [validate_key(key) for key in keys]
    refused = sorted(set(keys) & set(pending_keys))
    if refused:
        raise PendingBlobError(refused)
    return store.delete(keys)


def collect_orphans(
    store: BlobStore,
    *,
    known_keys: Iterable[str],
    pending_keys: Iterable[str] = (),
    prefix: str = f"{STAGING}/",
) -> list[str]:
    """Delete the orphans ``find_orphans`` reports and return their keys."""
    pending = list(pending_keys)
    orphans = find_orphans(store, known_keys=known_keys, pending_keys=pending, prefix=prefix)
    return delete_blobs(store, orphans, pending_keys=pending)


def teardown_partition(store: BlobStore, capture_key: str) -> list[str]:
    """Delete an attempt's whole staging partition, pending calls' blobs and temporary files
    included, and return the keys deleted. Call it only once the attempt is settled."""
    return store.delete_prefix(staging_prefix(capture_key))


def blob_sizes(store: BlobStore, keys: Iterable[str]) -> dict[str, int]:
    """The stored size in bytes of each of ``keys`` that holds a blob (absent keys left out),
    for cleanup reports of blobs no event records the size of."""
    sizes = {}
    for key in keys:
        with backend_errors("size", key, store.url):
            try:
                sizes[key] = int(store.fs.size(store.path(key)))
            except FileNotFoundError:
                continue
    return sizes
