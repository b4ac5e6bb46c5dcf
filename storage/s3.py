"""The S3 backend: an s3fs filesystem configured for S3-compatible servers, and its write-once put.

Configuration (``S3Options``, resolved once when the store opens):

- **Endpoint and credentials**: explicit options first, then the standard variables
  (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``; ``AWS_REGION``, ``AWS_DEFAULT_REGION``), then
  botocore's own credential chain (``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` /
  ``AWS_SESSION_TOKEN``, profiles, instance roles).
- **Checksums**: botocore >= 1.36 computes and demands CRC checksums on every request by default,
  which many S3-compatible servers reject or do not send; both settings are ``when_required``.
  Grove does not rely on server checksums: it verifies the sha256 of every blob it reads.
- **Retries**: botocore's ``standard`` mode, ``max_attempts`` attempts in all, with jittered
  exponential backoff, on connection errors, timeouts and 500/502/503/504 answers. s3fs's own
  retry loop is cut to one attempt so that the two layers do not multiply.
- **Timeouts**: ``connect_timeout`` and ``read_timeout`` per attempt.

Write-once puts send ``If-None-Match: *``; the server answers 412 when the key exists, which s3fs
raises as ``FileExistsError``. A put that was retried after the server had already stored it meets
its own bytes, which the store accepts as an idempotent retry.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import s3fs

from storage.errors import InvalidBlobUrlError

__all__ = ["S3Backend", "S3Options", "botocore_config", "s3_filesystem"]


@dataclass(frozen=True)
class S3Options:
    """How to reach an S3-compatible server; ``None`` means: from the environment.

    Consumed by ``open_blob_store`` for ``s3://`` URLs (as keyword options of the same names).
    """

    endpoint_url: str | None = None
    """Server URL; else ``AWS_ENDPOINT_URL_S3``, then ``AWS_ENDPOINT_URL``, then AWS itself."""
    access_key_id: str | None = None
    """Access key; with ``secret_access_key``. Else botocore's credential chain."""
    secret_access_key: str | None = None
    """Secret key matching ``access_key_id``."""
    session_token: str | None = None
    """Session token for temporary credentials."""
    region: str | None = None
    """Region; else ``AWS_REGION``, ``AWS_DEFAULT_REGION``, else ``us-east-1``."""
    max_attempts: int = 5
    """Attempts per request, the first included (1-20)."""
    connect_timeout: float = 5.0
    """Seconds to establish a connection, per attempt (0 < t <= 300)."""
    read_timeout: float = 30.0
    """Seconds to wait for response data, per attempt (0 < t <= 3600)."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_attempts <= 20:
            raise InvalidBlobUrlError("s3://", f"max_attempts is 1-20, got {self.max_attempts}")
        if not 0 < self.connect_timeout <= 300:
            raise InvalidBlobUrlError(
                "s3://", f"connect_timeout is in (0, 300] seconds, got {self.connect_timeout}"
            )
        if not 0 < self.read_timeout <= 3600:
            raise InvalidBlobUrlError(
                "s3://", f"read_timeout is in (0, 3600] seconds, got {self.read_timeout}"
            )
        if (self.access_key_id is None) != (self.secret_access_key is None):
            raise InvalidBlobUrlError(
                "s3://", "access_key_id and secret_access_key are given together or not at all"
            )


def botocore_config(options: S3Options) -> dict[str, Any]:
    """The botocore ``Config`` arguments: checksums when required, standard retries, timeouts."""
    return {
        "request_checksum_calculation": "when_required",
        "response_checksum_validation": "when_required",
        "retries": {"mode": "standard", "total_max_attempts": options.max_attempts},
        "connect_timeout": options.connect_timeout,
        "read_timeout": options.read_timeout,
    }


def _first(env: Mapping[str, str], names: Iterable[str]) -> str | None:
    return next((env[name] for name in names if env.get(name)), None)


def s3_filesystem(options: S3Options, env: Mapping[str, str] | None = None) -> s3fs.S3FileSystem:
    """A fresh (uncached) s3fs filesystem for ``options``, the environment filling the gaps."""
    env = os.environ if env is None else env
    endpoint = options.endpoint_url or _first(env, ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    region = options.region or _first(env, ("AWS_REGION", "AWS_DEFAULT_REGION")) or "us-east-1"
    fs = s3fs.S3FileSystem(
        endpoint_url=endpoint,
        key=options.access_key_id,
        secret=options.secret_access_key,
        token=options.session_token,
        client_kwargs={"region_name": region},
        config_kwargs=botocore_config(options),
        skip_instance_cache=True,
        use_listings_cache=False,
    )
    fs.retries = 1  # botocore retries; s3fs's loop would multiply the attempts
    return fs


class S3Backend:
    """Write-once puts and deletes on S3; reads and listings go through ``fs`` directly."""

    name = "s3"

    def __init__(self, fs: s3fs.S3FileSystem) -> None:
        self.fs = fs

    def create(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` unless it exists (``If-None-Match: *``): FileExistsError."""
        self.fs.pipe_file(path, data, mode="create")

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths`` in bulk; absent paths are fine."""
        if paths:
            self.fs.rm(paths)

    def remove_tree(self, path: str) -> None:
        """Delete every object left under ``path/`` (objects outside the key alphabet)."""
        leftovers = self.fs.find(path)
        if leftovers:
            self.fs.rm(leftovers)
