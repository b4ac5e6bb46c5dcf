"""The storage package's public surface is curated, and it imports nothing above it."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import grove.storage as storage

PACKAGE = Path(storage.__file__).parent
MODULES = sorted(path.stem for path in PACKAGE.glob("*.py") if path.stem != "__init__")


def test_public_names_are_pinned():
    assert storage.__all__ == [
        "BlobConflictError",
        "BlobFormatError",
        "BlobIntegrityError",
        "BlobRef",
        "BlobStore",
        "CallDelta",
        "InvalidBlobRefError",
        "InvalidBlobUrlError",
        "InvalidDeltaError",
        "InvalidKeyError",
        "MediaDescriptor",
        "MediaTensor",
        "MissingBlobError",
        "PendingBlobError",
        "S3Options",
        "StorageError",
        "StorageUnavailableError",
        "UnusableBlobError",
        "blob_sha256",
        "capture_key_of",
        "chain_digest",
        "chain_digests",
        "collect_orphans",
        "decode_delta",
        "delete_blobs",
        "describe_media",
        "encode_delta",
        "find_orphans",
        "media_digest",
        "open_blob_store",
        "orphan_keys",
        "published_key",
        "published_prefix",
        "row_chain_digests",
        "staging_key",
        "staging_prefix",
        "teardown_partition",
        "token_digest",
        "validate_key",
    ]


@pytest.mark.parametrize("module", MODULES)
def test_every_module_declares_all_and_defines_each_name(module):
    loaded = importlib.import_module(f"grove.storage.{module}")
    assert all(hasattr(loaded, name) for name in loaded.__all__)


@pytest.mark.parametrize("module", MODULES)
def test_storage_imports_nothing_from_the_rest_of_grove(module):
    tree = ast.parse((PACKAGE / f"{module}.py").read_text())
    imported = {
        alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    grove_names = {name for name in imported if name == "grove" or name.startswith("grove.")}
    assert {name for name in grove_names if not name.startswith("grove.storage")} == set()
