"""The blob store contract, run on every backend: a local directory and a real moto S3 server."""

from __future__ import annotations

import hashlib
import threading

import pytest
import torch

from grove.storage import (
    BlobConflictError,
    BlobFormatError,
    BlobIntegrityError,
    BlobRef,
    BlobStore,
    CallDelta,
    InvalidDeltaError,
    InvalidKeyError,
    MissingBlobError,
    PendingBlobError,
    collect_orphans,
    delete_blobs,
    describe_media,
    find_orphans,
    open_blob_store,
    staging_key,
    teardown_partition,
)

KEY = staging_key("cap-1", "call-1")


@pytest.fixture
def store(blob_url: str) -> BlobStore:
    return open_blob_store(blob_url)


def _delta(seed: int = 0) -> CallDelta:
    generator = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 50_000, (12,), dtype=torch.int32, generator=generator)
    generated = torch.randint(0, 50_000, (5,), dtype=torch.int32, generator=generator)
    logprobs = -torch.rand(5, generator=generator)
    routes = torch.randint(0, 64, (17, 4), dtype=torch.int16, generator=generator)
    pixels = torch.rand(3, 4, 4, generator=generator).to(torch.bfloat16)
    image = describe_media(
        media_id="img-a", kind="image", pixels=pixels, height=4, width=4, token_span=(2, 6)
    )
    return CallDelta(prompt, generated, logprobs, routes=routes, media=(image,))


def _raw_bytes(store: BlobStore, key: str) -> bytes:
    return store.fs.cat_file(store.path(key))


def _overwrite_raw(store: BlobStore, key: str, data: bytes) -> None:
    """Replace a stored blob behind the store's back (bypassing write-once), as corruption would."""
    store.fs.pipe_file(store.path(key), data)


# put and get


def test_put_delta_then_get_delta_round_trips_exactly(store):
    ref = store.put_delta(KEY, _delta())
    assert store.get_delta(ref) == _delta()


def test_put_returns_sha256_and_size_of_the_stored_bytes(store):
    ref = store.put(KEY, b"twelve bytes")
    stored = _raw_bytes(store, KEY)
    assert ref == BlobRef(KEY, hashlib.sha256(b"twelve bytes").hexdigest(), 12)
    assert stored == b"twelve bytes"


def test_get_returns_the_bytes_put(store):
    ref = store.put(KEY, b"\x00\x01payload")
    assert store.get(ref) == b"\x00\x01payload"


def test_put_of_empty_bytes_round_trips(store):
    ref = store.put(KEY, b"")
    assert (ref.size, store.get(ref)) == (0, b"")


# write-once


def test_put_of_identical_bytes_again_returns_the_same_ref(store):
    first = store.put_delta(KEY, _delta())
    assert store.put_delta(KEY, _delta()) == first


def test_put_of_different_bytes_under_the_same_key_raises_conflict(store):
    store.put(KEY, b"first")
    with pytest.raises(BlobConflictError, match=r"write-once: 'staging/cap-1/call-1'.*5 bytes"):
        store.put(KEY, b"second!")


def test_conflicting_put_leaves_the_stored_blob_unchanged(store):
    ref = store.put(KEY, b"first")
    with pytest.raises(BlobConflictError):
        store.put(KEY, b"second")
    assert store.get(ref) == b"first"


def test_concurrent_puts_of_different_bytes_store_exactly_one(store):
    outcomes: dict[int, object] = {}

    def put(index: int) -> None:
        try:
            outcomes[index] = store.put(KEY, f"writer {index}".encode())
        except BlobConflictError as exc:
            outcomes[index] = exc

    threads = [threading.Thread(target=put, args=(index,)) for index in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [ref for ref in outcomes.values() if isinstance(ref, BlobRef)]
    assert len(winners) == 1
    assert store.get(winners[0]) == _raw_bytes(store, KEY)


# integrity faults


def test_get_of_a_blob_with_one_corrupted_byte_raises_integrity_error(store):
    ref = store.put_delta(KEY, _delta())
    corrupted = bytearray(_raw_bytes(store, KEY))
    corrupted[len(corrupted) // 2] ^= 0x01
    _overwrite_raw(store, KEY, bytes(corrupted))
    with pytest.raises(BlobIntegrityError, match=r"sha256 of key 'staging/cap-1/call-1'") as info:
        store.get_delta(ref)
    assert (info.value.key, info.value.capture_key) == (KEY, "cap-1")
    assert info.value.got_sha256 == hashlib.sha256(bytes(corrupted)).hexdigest()


def test_get_of_a_truncated_blob_raises_integrity_error_with_both_sizes(store):
    ref = store.put_delta(KEY, _delta())
    _overwrite_raw(store, KEY, _raw_bytes(store, KEY)[:-7])
    with pytest.raises(BlobIntegrityError, match=rf"size of key .*got {ref.size - 7} bytes"):
        store.get(ref)


def test_get_of_a_deleted_blob_raises_missing_blob_naming_key_and_capture_key(store):
    ref = store.put_delta(KEY, _delta())
    store.fs.rm(store.path(KEY))
    with pytest.raises(
        MissingBlobError, match=r"key 'staging/cap-1/call-1' \(capture key 'cap-1'\)"
    ) as info:
        store.get_delta(ref)
    assert (info.value.key, info.value.capture_key) == (KEY, "cap-1")


def test_get_delta_of_verified_bytes_that_are_not_a_delta_raises_format_error(store):
    ref = store.put(KEY, b"not safetensors at all")
    with pytest.raises(
        BlobFormatError, match=r"key 'staging/cap-1/call-1' \(capture key 'cap-1'\)"
    ):
        store.get_delta(ref)


# bad input writes nothing


def test_put_delta_of_a_delta_mutated_to_nan_raises_and_writes_nothing(store):
    delta = _delta()
    delta.logprobs[0] = float("nan")  # mutated after validation; encode validates again
    with pytest.raises(InvalidDeltaError, match=r"logprobs: must not be NaN"):
        store.put_delta(KEY, delta)
    assert store.list_keys() == []


def test_put_delta_of_a_non_delta_raises_and_writes_nothing(store):
    with pytest.raises(InvalidDeltaError, match=r"delta: must be a CallDelta; got dict"):
        store.put_delta(KEY, {"generated": [1, 2]})  # type: ignore[arg-type]
    assert store.list_keys() == []


def test_put_of_non_bytes_raises_and_writes_nothing(store):
    with pytest.raises(InvalidDeltaError, match=r"blob data: must be bytes; got str"):
        store.put(KEY, "text")  # type: ignore[arg-type]
    assert store.list_keys() == []


def test_put_under_a_traversal_key_raises_and_writes_nothing(store):
    with pytest.raises(InvalidKeyError, match=r"'staging/\.\./escape'"):
        store.put("staging/../escape", b"x")
    assert store.list_keys() == []


# listing and existence


def test_list_keys_returns_the_keys_under_a_prefix_sorted(store):
    for key in (staging_key("b", "2"), staging_key("a", "1"), staging_key("b", "1")):
        store.put(key, b"x")
    assert store.list_keys("staging/b/") == ["staging/b/1", "staging/b/2"]
    assert store.list_keys() == ["staging/a/1", "staging/b/1", "staging/b/2"]


def test_list_keys_of_an_empty_prefix_is_empty(store):
    assert store.list_keys("staging/nothing-here/") == []


def test_exists_reports_whether_a_key_holds_a_blob(store):
    store.put(KEY, b"x")
    assert (store.exists(KEY), store.exists(staging_key("cap-1", "other"))) == (True, False)


# cleanup


def _fill(store: BlobStore) -> None:
    for capture_key in ("cap-1", "cap-2"):
        for call_id in ("c1", "c2", "c3"):
            store.put(staging_key(capture_key, call_id), f"{capture_key}/{call_id}".encode())


def test_delete_blobs_removes_exactly_the_given_keys(store):
    _fill(store)
    deleted = delete_blobs(store, ["staging/cap-1/c1", "staging/cap-2/c3"])
    assert deleted == ["staging/cap-1/c1", "staging/cap-2/c3"]
    assert store.list_keys() == [
        "staging/cap-1/c2",
        "staging/cap-1/c3",
        "staging/cap-2/c1",
        "staging/cap-2/c2",
    ]


def test_delete_blobs_of_absent_keys_succeeds(store):
    assert delete_blobs(store, [KEY]) == [KEY]


def test_delete_blobs_refuses_pending_keys_and_deletes_nothing(store):
    _fill(store)
    with pytest.raises(
        PendingBlobError, match=r"refused to delete 1 pending key\(s\): staging/cap-1/c2"
    ):
        delete_blobs(
            store, ["staging/cap-1/c1", "staging/cap-1/c2"], pending_keys=["staging/cap-1/c2"]
        )
    assert len(store.list_keys()) == 6


def test_find_orphans_reports_blobs_no_event_names_except_pending_ones(store):
    _fill(store)
    known = ["staging/cap-1/c1", "staging/cap-2/c1", "staging/cap-2/c2"]
    orphans = find_orphans(store, known_keys=known, pending_keys=["staging/cap-1/c2"])
    assert orphans == ["staging/cap-1/c3", "staging/cap-2/c3"]


def test_collect_orphans_deletes_the_orphans_and_keeps_pending_and_known_blobs(store):
    _fill(store)
    known = ["staging/cap-1/c1", "staging/cap-2/c1", "staging/cap-2/c2"]
    removed = collect_orphans(store, known_keys=known, pending_keys=["staging/cap-1/c2"])
    assert removed == ["staging/cap-1/c3", "staging/cap-2/c3"]
    assert store.list_keys() == [
        "staging/cap-1/c1",
        "staging/cap-1/c2",
        "staging/cap-2/c1",
        "staging/cap-2/c2",
    ]


def test_find_orphans_ignores_published_blobs_by_default(store):
    store.put("published/step-1/row-0", b"row")
    assert find_orphans(store, known_keys=[]) == []


def test_teardown_partition_removes_every_blob_of_the_attempt_pending_ones_included(store):
    _fill(store)
    assert teardown_partition(store, "cap-1") == [
        "staging/cap-1/c1",
        "staging/cap-1/c2",
        "staging/cap-1/c3",
    ]
    assert store.list_keys() == ["staging/cap-2/c1", "staging/cap-2/c2", "staging/cap-2/c3"]


def test_teardown_of_an_absent_partition_removes_nothing(store):
    assert teardown_partition(store, "never-written") == []
