"""The S3 backend: write-once puts and whole-object reads through botocore's synchronous client;
listings, deletes and ranged reads through s3fs. Both are configured for S3-compatible servers.

Configuration (``S3Options``, resolved once when the store opens, into the filesystem; the
synchronous client takes the filesystem's endpoint, region, credentials and botocore config):

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

Write-once puts are one ``PutObject`` with ``If-None-Match: *`` on the calling thread; the server
answers 412 when the key exists, raised as ``FileExistsError``. A put that was retried after the
server had already stored it meets its own bytes, which the store accepts as an idempotent retry.
Every other error is botocore's own (``ClientError``, ``BotoCoreError``), which ``faults.py``
translates. A whole-object read (``S3FileSystem.cat_file``, which the store's ``get`` calls) is one
``GetObject``; its ``ClientError`` becomes s3fs's ``OSError`` (a missing key or bucket:
``FileNotFoundError``), as s3fs's own read raised.

Why not s3fs for these: its calls run on its event-loop thread (aiobotocore) while the caller
waits, and its ``cat_file`` sends a HEAD before the GET. The synchronous client spares the
hand-off, costing a fifth to a third less CPU per put and less than half the CPU and wall time per
read (``bench/s3_put.py``). Each store makes its client on first use (about 10 ms once botocore's
models are loaded) and shares it between threads; no ``Expect: 100-continue`` is sent, which would
cost a round trip per put.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import botocore.session
import s3fs
from botocore.client import BaseClient
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.handlers import add_expect_header
from botocore.loaders import Loader
from fsspec.asyn import sync
from s3fs.errors import translate_boto_error

from grove.storage.errors import InvalidBlobUrlError

__all__ = [
    "S3Backend",
    "S3FileSystem",
    "S3Options",
    "botocore_config",
    "s3_client",
    "s3_filesystem",
]

CLIENT_CONNECTIONS = 64
"""Kept-alive connections of a store's synchronous client: more threads than this at once open
connections that are closed after their request (urllib3 warns of each)."""


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


def s3_filesystem(options: S3Options, env: Mapping[str, str] | None = None) -> S3FileSystem:
    """A fresh (uncached) filesystem for ``options``, the environment filling the gaps."""
    env = os.environ if env is None else env
    endpoint = options.endpoint_url or _first(env, ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"))
    region = options.region or _first(env, ("AWS_REGION", "AWS_DEFAULT_REGION")) or "us-east-1"
    fs = S3FileSystem(
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


@functools.cache
def _loader() -> Loader:
    """botocore's service-model loader, shared: a client then costs ~10 ms, not ~100 ms."""
    return botocore.session.Session().get_component("data_loader")


def s3_client(fs: s3fs.S3FileSystem) -> BaseClient:
    """A synchronous botocore S3 client with ``fs``'s endpoint, region, credentials and config.

    Its own session (credentials are resolved per store, as s3fs does), sharing one loader. Puts
    send no ``Expect: 100-continue``: waiting for the server's go-ahead before the body costs a
    round trip per put, to spare only the body of a put refused anyway (a 412 after a retry).
    """
    session = botocore.session.Session()
    session.register_component("data_loader", _loader())
    client = session.create_client(
        "s3",
        endpoint_url=fs.endpoint_url,
        region_name=fs.client_kwargs["region_name"],
        aws_access_key_id=fs.key,
        aws_secret_access_key=fs.secret,
        aws_session_token=fs.token,
        config=Config(**fs.config_kwargs, max_pool_connections=CLIENT_CONNECTIONS),
    )
    client.meta.events.unregister("before-call.s3", add_expect_header)
    return client


class S3FileSystem(s3fs.S3FileSystem):
    """s3fs's filesystem whose whole-object reads (``cat_file``) go through ``client``, a
    synchronous botocore client of the same settings: one GET on the calling thread, where s3fs
    sends a HEAD (to size the object, for ranged reads of a large one) and a GET, both on its
    event-loop thread. Ranged reads, listings and deletes stay s3fs's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._client: BaseClient | None = None
        self._client_lock = threading.Lock()

    @property
    def client(self) -> BaseClient:
        """The synchronous client, made on first use and shared by every thread."""
        client = self._client
        if client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = s3_client(self)
                client = self._client
        return client

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        """The bytes of the object at ``path``, in one GET; s3fs's errors (a missing key or
        bucket is ``FileNotFoundError``). A byte range or other options go to s3fs."""
        bucket, key, version = self.split_path(path)
        if start is not None or end is not None or kwargs or version:
            return sync(self.loop, self._cat_file, path, start=start, end=end, **kwargs)
        try:
            # botocore makes the S3 operations at run time; its stubs' BaseClient lacks them
            response = self.client.get_object(Bucket=bucket, Key=key)  # type: ignore[attr-defined]
        except ClientError as error:
            raise translate_boto_error(error) from error
        with contextlib.closing(response["Body"]) as body:
            return body.read()


def _precondition_failed(error: ClientError) -> bool:
    return (
        error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412
        or error.response.get("Error", {}).get("Code") == "PreconditionFailed"
    )


class S3Backend:
    """Write-once puts through ``fs.client`` (botocore's synchronous client); deletes through
    s3fs. The store reads and lists through ``fs``. Safe to share between threads."""

    name = "s3"

    def __init__(self, fs: S3FileSystem) -> None:
        self.fs = fs

    def create(self, path: str, data: bytes) -> None:
        """Store ``data`` at ``path`` unless it exists (``If-None-Match: *``): FileExistsError."""
        bucket, _, key = path.partition("/")
        try:
            # botocore makes the S3 operations at run time; its stubs' BaseClient lacks them
            self.fs.client.put_object(  # type: ignore[attr-defined]
                Bucket=bucket, Key=key, Body=data, IfNoneMatch="*"
            )
        except ClientError as error:
            if _precondition_failed(error):
                raise FileExistsError(f"s3://{path} exists (412 Precondition Failed)") from error
            raise

    def delete(self, paths: list[str]) -> None:
        """Delete ``paths`` in bulk; absent paths are fine."""
        if paths:
            self.fs.rm(paths)

    def remove_tree(self, path: str) -> None:
        """Delete every object left under ``path/`` (objects outside the key alphabet)."""
        leftovers = self.fs.find(path)
        if leftovers:
            self.fs.rm(leftovers)
