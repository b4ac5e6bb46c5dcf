"""The one place where backend errors (OS, fsspec, s3fs, botocore, aiohttp) become ``StorageError``.

The store wraps every backend call in ``backend_errors``; ``translate`` decides the mapping:

- ``StorageError``: passed through unchanged;
- ``FileNotFoundError`` while reading a blob: ``MissingBlobError`` (key and capture key);
- every other ``OSError`` (s3fs turns S3 error codes into ``OSError`` subclasses, including 5xx
  answers that outlived botocore's retries, ``PermissionError`` for 403, and timeouts, which are
  ``OSError`` too), every ``botocore`` error and every ``aiohttp`` client error:
  ``StorageUnavailableError`` naming the operation, key and store.

Anything else is a programming error and propagates untranslated.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from storage.errors import MissingBlobError, StorageError, StorageUnavailableError
from storage.keys import capture_key_of

__all__ = ["BACKEND_ERRORS", "READ", "backend_errors", "translate"]

BACKEND_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    BotoCoreError,
    ClientError,
    aiohttp.ClientError,
)
"""Every error a backend call may raise that is not a bug (``ClientError`` is not an OSError)."""

READ = "read"


def translate(
    exc: BaseException, *, operation: str, key: str | None, store_url: str
) -> StorageError:
    """The ``StorageError`` that stands for backend error ``exc`` raised during ``operation``."""
    if isinstance(exc, StorageError):
        return exc
    if isinstance(exc, FileNotFoundError) and operation == READ and key is not None:
        return MissingBlobError(key, capture_key_of(key), store_url)
    return StorageUnavailableError(operation, key, store_url, _describe(exc))


def _describe(exc: BaseException) -> str:
    """``Type: message``; a message that cannot be rendered must not hide the error itself."""
    try:
        message = str(exc)
    except Exception:  # a library's __str__ on a half-built exception
        message = "(no message)"
    return f"{type(exc).__name__}: {message}"


@contextmanager
def backend_errors(operation: str, key: str | None, store_url: str) -> Iterator[None]:
    """Run a backend call, raising the translated ``StorageError`` for any backend error."""
    try:
        yield
    except BACKEND_ERRORS as exc:
        raise translate(exc, operation=operation, key=key, store_url=store_url) from exc
