"""Tensor blobs in object storage: keys, codec, digests, the write-once store, cleanup.

Typical use (capture path, then training path)::

    store = open_blob_store(".grove/blobs")            # or "s3://bucket/prefix"
    ref = store.put_delta(staging_key(capture_key, call_id), delta)   # before call.committed
    delta = store.get_delta(BlobRef(key, sha256, size))              # verified on every read

``docs/storage.md`` documents the key alphabet, the codec layout, the digest domains, write-once
semantics and the cleanup rules. This package imports nothing from the rest of Grove.
"""

from grove.storage.cleanup import (
    collect_orphans,
    delete_blobs,
    find_orphans,
    orphan_keys,
    teardown_partition,
)
from grove.storage.codec import (
    CallDelta,
    MediaDescriptor,
    MediaTensor,
    decode_delta,
    describe_media,
    encode_delta,
)
from grove.storage.digests import (
    blob_sha256,
    chain_digest,
    chain_digests,
    media_digest,
    row_chain_digests,
    token_digest,
)
from grove.storage.errors import (
    BlobConflictError,
    BlobFormatError,
    BlobIntegrityError,
    InvalidBlobRefError,
    InvalidBlobUrlError,
    InvalidDeltaError,
    InvalidKeyError,
    MissingBlobError,
    PendingBlobError,
    StorageError,
    StorageUnavailableError,
    UnusableBlobError,
)
from grove.storage.keys import (
    capture_key_of,
    published_key,
    published_prefix,
    staging_key,
    staging_prefix,
    validate_key,
)
from grove.storage.s3 import S3Options
from grove.storage.store import BlobRef, BlobStore
from grove.storage.urls import open_blob_store

__all__ = [
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
