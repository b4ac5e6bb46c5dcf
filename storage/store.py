"""The blob store: write-once, digest-verified blobs under validated keys, over one backend.

``put`` validates the key (and, for ``put_delta``, encodes and validates the delta) before any
I/O, computes the sha256 and size of the bytes, and creates the key in create mode. If the key
exists, the stored bytes are read back: identical bytes make the put an idempotent success (the
retry of a put whose acknowledgement was lost), different bytes raise ``BlobConflictError`` and
leave the stored blob unchanged. The returned ``BlobRef`` goes into the ledger's
``call.committed`` event — the blob is written first, the event is the commit marker.

``get`` takes that ``BlobRef`` back and checks the stored size, then the sha256, before returning
anything: S3 servers do not all verify checksums, so Grove does. A missing blob raises
``MissingBlobError``, a mismatch ``BlobIntegrityError``; both name the key and the capture key.

Backends (``LocalBackend``, ``S3Backend``) supply only write-once creation and deletion; reads and
listings use their fsspec filesystem. Backend errors are translated in ``faults.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from fsspec import AbstractFileSystem

from grove.storage.codec import CallDelta, decode_delta, encode_delta
from grove.storage.digests import blob_sha256
from grove.storage.errors import (
    BlobConflictError,
    BlobIntegrityError,
    InvalidBlobRefError,
    InvalidDeltaError,
    InvalidKeyError,
)
from grove.storage.faults import READ, backend_errors
from grove.storage.keys import capture_key_of, validate_key, validate_prefix

__all__ = ["Backend", "BlobRef", "BlobStore"]

_SHA256_HEX = re.compile(r"\A[0-9a-f]{64}\Z")  # \Z, not $: "$" passes a trailing newline


@dataclass(frozen=True)
class BlobRef:
    """Where a blob is and what it must hash to: its key, sha256 (64 lowercase hex) and size.

    Produced by ``BlobStore.put``/``put_delta``; recorded by the capture path in the ledger's
    ``call.committed`` event (blob key, digest, bytes); passed back to ``get``/``get_delta`` by the
    training projector, which rebuilds it from that event.
    """

    key: str
    sha256: str
    size: int

    def __post_init__(self) -> None:
        validate_key(self.key)
        if not isinstance(self.sha256, str) or not _SHA256_HEX.match(self.sha256):
            raise InvalidBlobRefError(
                self.key, "sha256 is 64 lowercase hex characters", self.sha256
            )
        if type(self.size) is not int or self.size < 0:
            raise InvalidBlobRefError(self.key, "size is an int >= 0", self.size)


class Backend(Protocol):
    """What a backend adds to its fsspec filesystem: atomic create-once, delete, tree removal."""

    name: str
    fs: AbstractFileSystem

    def create(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path``; ``FileExistsError`` if ``path`` exists (nothing changed)."""
        ...

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths``; absent paths are fine."""
        ...

    def remove_tree(self, path: str) -> None:
        """Delete whatever is left under ``path`` (after its keys were deleted)."""
        ...


class BlobStore:
    """Write-once, digest-verified blobs under keys relative to ``root`` in one backend.

    Open one with ``open_blob_store(url)``. Safe to share between threads.
    """

    def __init__(self, backend: Backend, root: str, url: str) -> None:
        self._backend = backend
        self._root = root.rstrip("/")
        self._url = url

    @property
    def url(self) -> str:
        """The store's URL: ``file:///abs/dir`` or ``s3://bucket/prefix``."""
        return self._url

    @property
    def backend(self) -> str:
        """The backend's name: ``"local"`` or ``"s3"``."""
        return self._backend.name

    @property
    def fs(self) -> AbstractFileSystem:
        """The underlying fsspec filesystem (for tools and tests; bypasses every check)."""
        return self._backend.fs

    def path(self, key: str) -> str:
        """The backend path of ``key`` (validated)."""
        return f"{self._root}/{validate_key(key)}"

    def __repr__(self) -> str:
        return f"BlobStore({self._url!r})"

    def put(self, key: str, data: bytes) -> BlobRef:
        """Store ``data`` under ``key`` once; identical bytes again succeed, different bytes raise
        ``BlobConflictError``. Returns the ``BlobRef`` to record in ``call.committed``."""
        path = self.path(key)
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise InvalidDeltaError("blob data", "must be bytes", type(data).__name__)
        data = bytes(data)
        ref = BlobRef(key=key, sha256=blob_sha256(data), size=len(data))
        with backend_errors("put", key, self._url):
            try:
                self._backend.create(path, data)
                return ref
            except FileExistsError:
                stored = self._backend.fs.cat_file(path)
        stored_sha256 = blob_sha256(stored)
        if stored_sha256 != ref.sha256 or len(stored) != ref.size:
            raise BlobConflictError(key, stored_sha256, len(stored), ref.sha256, ref.size)
        return ref

    def get(self, ref: BlobRef) -> bytes:
        """The bytes stored under ``ref.key``, after checking their size and sha256 against ``ref``.

        ``MissingBlobError`` if there is no blob, ``BlobIntegrityError`` if it differs.
        """
        path = f"{self._root}/{ref.key}"  # a BlobRef's key is validated when it is built
        with backend_errors(READ, ref.key, self._url):
            data = self._backend.fs.cat_file(path)
        got_sha256 = blob_sha256(data)
        if len(data) != ref.size or got_sha256 != ref.sha256:
            raise BlobIntegrityError(
                ref.key,
                capture_key_of(ref.key),
                expected_size=ref.size,
                got_size=len(data),
                expected_sha256=ref.sha256,
                got_sha256=got_sha256,
            )
        return data

    def put_delta(self, key: str, delta: CallDelta) -> BlobRef:
        """Encode ``delta`` (validating it) and ``put`` it; bad input raises before any write."""
        validate_key(key)
        return self.put(key, encode_delta(delta))

    def get_delta(self, ref: BlobRef) -> CallDelta:
        """The ``CallDelta`` stored under ``ref``, verified (``get``) and decoded."""
        return decode_delta(self.get(ref), key=ref.key)

    def exists(self, key: str) -> bool:
        """Whether a blob is stored under ``key``."""
        path = self.path(key)
        with backend_errors("check", key, self._url):
            return bool(self._backend.fs.isfile(path))

    def list_keys(self, prefix: str = "") -> list[str]:
        """The sorted keys stored under ``prefix`` (``""`` or segments ending in ``/``).

        Names outside the key alphabet (temporary files) are not keys and are left out.
        """
        validate_prefix(prefix)
        base = f"{self._root}/{prefix}".rstrip("/")
        with backend_errors("list", prefix or None, self._url):
            try:
                paths = self._backend.fs.find(base)
            except FileNotFoundError:
                paths = []
        keys = []
        for path in paths:
            key = path[len(self._root) + 1 :] if path.startswith(self._root + "/") else None
            if key is not None and key.startswith(prefix) and _is_key(key):
                keys.append(key)
        return sorted(keys)

    def delete(self, keys: Iterable[str]) -> list[str]:
        """Delete exactly ``keys`` (all validated first; absent keys are fine); returns them.

        The raw primitive: ``grove.storage.cleanup`` applies the lifecycle rules (pending calls).
        """
        keys = list(keys)
        paths = [self.path(key) for key in keys]
        with backend_errors("delete", keys[0] if len(keys) == 1 else None, self._url):
            self._backend.delete(paths)
        return keys

    def delete_prefix(self, prefix: str) -> list[str]:
        """Delete every blob under ``prefix`` (segments ending in ``/``) and any leftover
        temporary files; returns the keys deleted."""
        if validate_prefix(prefix) == "":
            raise InvalidKeyError(prefix, "a prefix delete names at least one segment")
        keys = self.delete(self.list_keys(prefix))
        with backend_errors("delete", prefix, self._url):
            self._backend.remove_tree(f"{self._root}/{prefix}".rstrip("/"))
        return keys


def _is_key(name: str) -> bool:
    try:
        validate_key(name)
    except InvalidKeyError:
        return False
    return True
