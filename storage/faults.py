"""The one place where backend errors (OS, fsspec, s3fs, botocore, aiohttp) become ``StorageError``.

The store wraps every backend call in ``backend_errors``; ``translate`` decides the mapping:

- ``StorageError``: passed through unchanged;
- ``FileNotFoundError`` while reading a blob: ``MissingBlobError`` (key and capture key);
- every other ``OSError`` (s3fs turns S3 error codes into ``OSError`` subclasses, including 5xx
  answers that outlived botocore's retries, ``PermissionError`` for 403, and timeouts, which are
  ``OSError`` too), every ``botocore`` error (the S3 put client's 403 and 5xx answers are
  ``ClientError``, its timeouts and refused connections ``BotoCoreError``) and every ``aiohttp``
  client error: ``StorageUnavailableError`` naming the operation, key and store.

Anything else is a programming error and propagates untranslated.
"""

from __future__ import annotations

from types import TracebackType
from typing import Literal

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError

from grove.storage.errors import MissingBlobError, StorageError, StorageUnavailableError
from grove.storage.keys import capture_key_of

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


class backend_errors:  # lower case: it reads as a function, ``with backend_errors(...):``
    """Context for a backend call: any backend error leaves it as its ``StorageError``.

    A class rather than ``@contextmanager``: it wraps every read and write, and is cheaper so.
    """

    __slots__ = ("key", "operation", "store_url")

    def __init__(self, operation: str, key: str | None, store_url: str) -> None:
        self.operation = operation
        self.key = key
        self.store_url = store_url

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> Literal[False]:
        if exc is not None and isinstance(exc, BACKEND_ERRORS):
            raise translate(
                exc, operation=self.operation, key=self.key, store_url=self.store_url
            ) from exc
        return False
