"""Blob store URLs: which backend and root a URL names, and ``open_blob_store``.

- a plain path (``.grove/blobs``, ``/data/blobs``) or ``file:///abs/dir``: a local directory,
  created if absent; relative paths are resolved against the working directory;
- ``s3://bucket`` or ``s3://bucket/prefix``: an S3 bucket (which must exist) and a key prefix
  of key segments; endpoint and credentials come from ``S3Options`` keywords or the environment.

Any other scheme is refused with the list of supported ones.
"""

from __future__ import annotations

import os
import re
from dataclasses import fields
from typing import Any
from urllib.parse import urlparse

from grove.storage.errors import InvalidBlobUrlError, InvalidKeyError
from grove.storage.keys import validate_segment
from grove.storage.local import LocalBackend
from grove.storage.s3 import S3Backend, S3Options, s3_filesystem
from grove.storage.store import BlobStore

__all__ = ["open_blob_store"]

_BUCKET = re.compile(r"\A[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]\Z")  # \Z: "$" passes a newline
_S3_OPTIONS = frozenset(field.name for field in fields(S3Options))
_SUPPORTED = "a local path, file:///abs/dir or s3://bucket/prefix"


def open_blob_store(url: str, **options: Any) -> BlobStore:
    """The ``BlobStore`` at ``url``; ``options`` are ``S3Options`` fields for ``s3://`` URLs.

    Raises ``InvalidBlobUrlError`` for an unsupported scheme, a malformed bucket or prefix, or an
    option the backend does not take.
    """
    if not isinstance(url, str) or not url.strip():
        raise InvalidBlobUrlError(str(url), f"a blob store URL is {_SUPPORTED}")
    if url.startswith("s3://"):
        return _open_s3(url, options)
    if "://" in url and not url.startswith("file://"):
        raise InvalidBlobUrlError(url, f"unsupported scheme; a blob store URL is {_SUPPORTED}")
    if options:
        raise InvalidBlobUrlError(url, f"a local store takes no options, got {sorted(options)}")
    return _open_local(url)


def _open_local(url: str) -> BlobStore:
    if url.startswith("file://"):
        parsed = urlparse(url)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidBlobUrlError(url, "a file URL names an absolute path: file:///abs/dir")
        path = parsed.path
    else:
        path = os.path.expanduser(url)
    root = os.path.abspath(path)
    if os.path.exists(root) and not os.path.isdir(root):
        raise InvalidBlobUrlError(url, f"{root} exists and is not a directory")
    os.makedirs(root, exist_ok=True)
    return BlobStore(LocalBackend(), root, f"file://{root}")


def _open_s3(url: str, options: dict[str, Any]) -> BlobStore:
    unknown = sorted(set(options) - _S3_OPTIONS)
    if unknown:
        raise InvalidBlobUrlError(
            url, f"unknown S3 options {unknown}; known: {sorted(_S3_OPTIONS)}"
        )
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise InvalidBlobUrlError(url, f"bucket {bucket!r} is not a valid S3 bucket name")
    prefix = prefix.rstrip("/")
    try:
        for segment in prefix.split("/") if prefix else []:
            validate_segment(segment, what="prefix segment")
    except InvalidKeyError as exc:
        raise InvalidBlobUrlError(url, exc.rule) from None
    root = f"{bucket}/{prefix}" if prefix else bucket
    try:
        s3_options = S3Options(**options)
    except InvalidBlobUrlError as exc:
        raise InvalidBlobUrlError(url, exc.rule) from None
    backend = S3Backend(s3_filesystem(s3_options))
    return BlobStore(backend, root, f"s3://{root}")
