"""What only the local backend has: temporary files next to keys, and directories to remove."""

from __future__ import annotations

import pytest

from grove.storage import BlobStore, open_blob_store, staging_key, teardown_partition


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return open_blob_store(str(tmp_path / "blobs"))


def test_put_leaves_only_the_key_file_behind(store, tmp_path):
    store.put(staging_key("cap-1", "c1"), b"x")
    assert sorted(p.name for p in (tmp_path / "blobs" / "staging" / "cap-1").iterdir()) == ["c1"]


def test_temporary_files_of_interrupted_puts_are_not_keys(store, tmp_path):
    store.put(staging_key("cap-1", "c1"), b"x")
    (tmp_path / "blobs" / "staging" / "cap-1" / ".c2.0123.tmp").write_bytes(b"half")
    assert store.list_keys() == ["staging/cap-1/c1"]


def test_teardown_removes_the_partition_directory_with_temporary_files(store, tmp_path):
    store.put(staging_key("cap-1", "c1"), b"x")
    (tmp_path / "blobs" / "staging" / "cap-1" / ".c2.0123.tmp").write_bytes(b"half")
    assert teardown_partition(store, "cap-1") == ["staging/cap-1/c1"]
    assert not (tmp_path / "blobs" / "staging" / "cap-1").exists()
