"""S3 under faults, over real HTTP: 500 answers and lost acknowledgements through a proxy to moto.

botocore's standard retry mode retries 500s with jittered exponential backoff (at most 1 s, then
2 s, ... between attempts), so these tests keep the number of injected faults small.
"""

from __future__ import annotations

import pytest

from grove.storage import (
    BlobRef,
    CallDelta,
    MissingBlobError,
    StorageUnavailableError,
    open_blob_store,
    staging_key,
)
from tests.fixtures.s3 import FaultProxy, S3Server

pytestmark = pytest.mark.s3

KEY = staging_key("cap-1", "call-1")


def _store_behind(proxy: FaultProxy, server: S3Server, **options: object):
    return open_blob_store(
        server.fresh_url(),
        endpoint_url=proxy.url,
        access_key_id=server.access_key_id,
        secret_access_key=server.secret_access_key,
        region=server.region,
        **options,
    )


def _delta() -> CallDelta:
    return CallDelta.from_lists([1, 2, 3], [4, 5], [-0.25, -0.5])


def test_put_retries_500_answers_then_succeeds(s3_fault_proxy, s3_server):
    store = _store_behind(s3_fault_proxy, s3_server, max_attempts=4)
    s3_fault_proxy.fail_next(2)
    ref = store.put_delta(KEY, _delta())
    assert s3_fault_proxy.statuses() == [500, 500, 200]
    assert store.get_delta(ref) == _delta()


def test_get_retries_500_answers_then_returns_verified_bytes(s3_fault_proxy, s3_server):
    store = _store_behind(s3_fault_proxy, s3_server, max_attempts=4)
    ref = store.put(KEY, b"payload")
    s3_fault_proxy.fail_next(2)
    assert store.get(ref) == b"payload"
    assert s3_fault_proxy.statuses().count(500) == 2


def test_put_raises_unavailable_when_500s_outlast_the_attempts(s3_fault_proxy, s3_server):
    store = _store_behind(s3_fault_proxy, s3_server, max_attempts=2)
    s3_fault_proxy.fail_next(2)
    with pytest.raises(StorageUnavailableError, match=r"failed to put key 'staging/cap-1/call-1'"):
        store.put(KEY, b"payload")
    assert s3_fault_proxy.statuses() == [500, 500]
    assert not store.exists(KEY)


def test_put_whose_acknowledgement_timed_out_succeeds_on_retry_as_identical_bytes(
    s3_fault_proxy, s3_server
):
    # The first PUT reaches moto and is stored; its answer is held back past the read timeout, so
    # botocore retries; the retry meets If-None-Match (412), and the store finds its own bytes.
    store = _store_behind(s3_fault_proxy, s3_server, max_attempts=3, read_timeout=0.5)
    s3_fault_proxy.stall_next(1, seconds=1.5)
    ref = store.put(KEY, b"payload")
    assert sorted(s3_fault_proxy.statuses()[:2]) == [200, 412]
    assert store.get(ref) == b"payload"


def test_unreachable_endpoint_raises_unavailable_naming_store_and_key(s3_server):
    store = open_blob_store(
        s3_server.fresh_url(),
        endpoint_url="http://127.0.0.1:9",
        access_key_id="testing",
        secret_access_key="testing",
        max_attempts=1,
        connect_timeout=0.5,
    )
    with pytest.raises(
        StorageUnavailableError, match=r"s3://grove-test/t-.*key 'staging/cap-1/call-1'"
    ):
        store.get(BlobRef(KEY, "0" * 64, 1))


def test_missing_bucket_get_raises_missing_blob(s3_server, monkeypatch):
    store = open_blob_store(
        "s3://no-such-bucket/prefix",
        endpoint_url=s3_server.endpoint_url,
        access_key_id="testing",
        secret_access_key="testing",
    )
    with pytest.raises(MissingBlobError, match=r"capture key 'cap-1'"):
        store.get(BlobRef(KEY, "0" * 64, 1))
