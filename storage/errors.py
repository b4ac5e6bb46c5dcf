"""The storage package's errors, one tree; backend errors are translated in ``faults.py`` only.

::

    StorageError
    ├── InvalidKeyError               a key outside the documented key alphabet (docs/storage.md)
    ├── InvalidBlobUrlError           a blob URL or store option that cannot be used
    ├── InvalidBlobRefError           a blob reference whose digest or size is malformed
    ├── InvalidDeltaError             a call delta that breaks the codec's rules; nothing written
    ├── BlobConflictError             write-once: different bytes are already stored under the key
    ├── PendingBlobError              cleanup asked to delete the blob of a pending call
    ├── UnusableBlobError             a recorded blob that cannot be trained on (masks its rollout)
    │   ├── MissingBlobError          no blob under the key
    │   ├── BlobIntegrityError        stored size or sha256 differs from the recorded ones
    │   └── BlobFormatError           verified bytes that are not a Grove call-delta blob
    └── StorageUnavailableError       the backend failed (after its retries): network, 5xx, access

Every message states the rule, then the identifiers and got-versus-expected values, which are also
kept as attributes.
"""

from __future__ import annotations

from grove_errors import GroveError

__all__ = [
    "BlobConflictError",
    "BlobFormatError",
    "BlobIntegrityError",
    "InvalidBlobRefError",
    "InvalidBlobUrlError",
    "InvalidDeltaError",
    "InvalidKeyError",
    "MissingBlobError",
    "PendingBlobError",
    "StorageError",
    "StorageUnavailableError",
    "UnusableBlobError",
]


class StorageError(GroveError):
    """Root of every error the storage package raises; a branch of Grove's one tree
    (``GroveError``)."""


class InvalidKeyError(StorageError, ValueError):
    """A blob key (or key segment) outside the documented key alphabet."""

    def __init__(self, key: object, rule: str) -> None:
        self.key = key
        self.rule = rule
        super().__init__(f"Invalid blob key {key!r}: {rule}")


class InvalidBlobUrlError(StorageError, ValueError):
    """A blob URL or store option that ``open_blob_store`` cannot use."""

    def __init__(self, url: str, rule: str) -> None:
        self.url = url
        self.rule = rule
        super().__init__(f"Invalid blob store URL {url!r}: {rule}")


class InvalidBlobRefError(StorageError, ValueError):
    """A blob reference (key, sha256, size) whose digest or size is malformed."""

    def __init__(self, key: object, rule: str, got: object) -> None:
        self.key = key
        self.rule = rule
        self.got = got
        super().__init__(f"Invalid blob reference for key {key!r}: {rule}; got {got!r}")


class InvalidDeltaError(StorageError, ValueError):
    """A call delta (or token sequence) that breaks the codec's rules; nothing was written."""

    def __init__(self, field: str, rule: str, got: object) -> None:
        self.field = field
        self.rule = rule
        self.got = got
        super().__init__(f"Invalid {field}: {rule}; got {got}")


class BlobConflictError(StorageError):
    """Write-once: the key already holds different bytes; the stored blob was left unchanged."""

    def __init__(
        self, key: str, stored_sha256: str, stored_size: int, new_sha256: str, new_size: int
    ) -> None:
        self.key = key
        self.stored_sha256 = stored_sha256
        self.stored_size = stored_size
        self.new_sha256 = new_sha256
        self.new_size = new_size
        super().__init__(
            f"Blob keys are write-once: {key!r} already holds different bytes "
            f"(stored sha256 {stored_sha256}, {stored_size} bytes; "
            f"new sha256 {new_sha256}, {new_size} bytes); a retry must put identical bytes"
        )


class PendingBlobError(StorageError):
    """Cleanup was asked to delete keys of pending calls; only partition teardown removes them."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys
        super().__init__(
            f"Keys of pending calls are never removed by cleanup, only by staging-partition "
            f"teardown; refused to delete {len(keys)} pending key(s): {', '.join(keys)}; "
            f"nothing was deleted"
        )


class UnusableBlobError(StorageError):
    """A recorded blob that cannot be used: its call's rollout is masked, never trained."""

    def __init__(self, message: str, key: str, capture_key: str | None) -> None:
        self.key = key
        self.capture_key = capture_key
        super().__init__(message)


class MissingBlobError(UnusableBlobError):
    """No blob is stored under a key that the ledger recorded."""

    def __init__(self, key: str, capture_key: str | None, store_url: str) -> None:
        self.store_url = store_url
        super().__init__(
            f"Missing blob: no blob under key {key!r} (capture key {capture_key!r}) "
            f"in store {store_url!r}; a committed call's blob must exist until cleanup",
            key,
            capture_key,
        )


class BlobIntegrityError(UnusableBlobError):
    """The stored bytes differ in size or sha256 from the recorded ones (corrupt or truncated)."""

    def __init__(
        self,
        key: str,
        capture_key: str | None,
        *,
        expected_size: int,
        got_size: int,
        expected_sha256: str,
        got_sha256: str,
    ) -> None:
        self.expected_size = expected_size
        self.got_size = got_size
        self.expected_sha256 = expected_sha256
        self.got_sha256 = got_sha256
        what = "size" if got_size != expected_size else "sha256"
        super().__init__(
            f"Blob integrity check failed: the stored {what} of key {key!r} "
            f"(capture key {capture_key!r}) differs from the recorded one "
            f"(got {got_size} bytes, sha256 {got_sha256}; "
            f"expected {expected_size} bytes, sha256 {expected_sha256})",
            key,
            capture_key,
        )


class BlobFormatError(UnusableBlobError):
    """Bytes that passed the digest check but are not a valid Grove call-delta blob."""

    def __init__(self, key: str | None, capture_key: str | None, rule: str) -> None:
        self.rule = rule
        super().__init__(
            f"Not a Grove call-delta blob: key {key!r} (capture key {capture_key!r}): {rule}",
            key or "",
            capture_key,
        )


class StorageUnavailableError(StorageError):
    """The backend failed after its retries (network, timeouts, 5xx, access denied)."""

    def __init__(self, operation: str, key: str | None, store_url: str, detail: str) -> None:
        self.operation = operation
        self.key = key
        self.store_url = store_url
        self.detail = detail
        super().__init__(
            f"Blob store {store_url!r} failed to {operation} key {key!r} after retries: {detail}; "
            f"check that the store is reachable and the credentials allow it"
        )
