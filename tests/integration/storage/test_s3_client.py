"""S3 puts and whole-object reads through botocore's synchronous client, against moto over real
HTTP: what is sent, what a refused put raises, and one client per store shared by every thread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from grove.storage import StorageUnavailableError, open_blob_store, staging_key
from grove.storage.s3 import S3Backend
from tests.fixtures.s3 import FaultProxy, S3Server

pytestmark = pytest.mark.s3

KEY = staging_key("cap-1", "call-1")


def _store(server: S3Server, url: str | None = None, **options: Any):
    return open_blob_store(
        url or server.fresh_url(),
        **{
            "endpoint_url": server.endpoint_url,
            "access_key_id": server.access_key_id,
            "secret_access_key": server.secret_access_key,
            "region": server.region,
            **options,
        },
    )


def _sent_headers(store) -> list[dict[str, Any]]:
    """Every PutObject request's headers from now on, as the client sends them."""
    sent: list[dict[str, Any]] = []

    def record(request: Any, **_: Any) -> None:
        sent.append(dict(request.headers))

    store.fs.client.meta.events.register("before-send.s3.PutObject", record)
    return sent


def test_put_sends_if_none_match_and_no_expect_continue(s3_server):
    store = _store(s3_server)
    sent = _sent_headers(store)
    store.put(KEY, b"payload")
    assert [(h.get("If-None-Match"), h.get("Expect")) for h in sent] == [(b"*", None)]


def test_create_of_an_existing_key_raises_file_exists_and_keeps_the_first_bytes(s3_server):
    store = _store(s3_server)
    store.put(KEY, b"first")
    with pytest.raises(FileExistsError, match=r"staging/cap-1/call-1 exists \(412"):
        S3Backend(store.fs).create(store.path(KEY), b"second")
    assert store.fs.cat_file(store.path(KEY)) == b"first"


def test_put_into_a_missing_bucket_raises_unavailable_naming_key_and_store(s3_server):
    store = _store(s3_server, "s3://no-such-bucket/prefix", max_attempts=1)
    with pytest.raises(
        StorageUnavailableError,
        match=r"'s3://no-such-bucket/prefix' failed to put key 'staging/cap-1/call-1'"
        r".*NoSuchBucket",
    ):
        store.put(KEY, b"payload")


def test_threads_putting_at_once_share_one_client_and_store_every_blob(s3_server):
    store = _store(s3_server)
    start = threading.Barrier(8)

    def put(index: int) -> Any:
        start.wait()
        store.put(staging_key("cap-1", f"call-{index}"), b"blob %d" % index)
        return store.fs.client

    with ThreadPoolExecutor(8) as pool:
        clients = list(pool.map(put, range(8)))
    assert len({id(client) for client in clients}) == 1
    assert store.list_keys("staging/cap-1/") == sorted(
        staging_key("cap-1", f"call-{index}") for index in range(8)
    )


def test_put_to_an_unreachable_endpoint_raises_unavailable_naming_the_connection_error(s3_server):
    store = _store(s3_server, endpoint_url="http://127.0.0.1:9", max_attempts=1)
    with pytest.raises(
        StorageUnavailableError,
        match=r"failed to put key 'staging/cap-1/call-1'.*EndpointConnectionError",
    ):
        store.put(KEY, b"payload")


def test_get_reads_the_blob_in_one_get_request(s3_server, s3_fault_proxy: FaultProxy):
    store = _store(s3_server, endpoint_url=s3_fault_proxy.url)
    ref = store.put(KEY, b"payload")
    before = len(s3_fault_proxy.requests)
    assert store.get(ref) == b"payload"
    assert [(method, status) for method, _, status in s3_fault_proxy.requests[before:]] == [
        ("GET", 200)
    ]


def test_ranged_reads_of_the_filesystem_still_return_the_range(s3_server):
    store = _store(s3_server)
    store.put(KEY, b"0123456789")
    assert store.fs.cat_file(store.path(KEY), start=2, end=5) == b"234"
