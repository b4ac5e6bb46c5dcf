"""Digests: the plain blob digest and the domain-separated token, chain and media digests."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch

from grove.storage import (
    InvalidDeltaError,
    blob_sha256,
    chain_digest,
    chain_digests,
    media_digest,
    row_chain_digests,
    token_digest,
)


def _sha(*parts: bytes) -> str:
    return hashlib.sha256(b"".join(parts)).hexdigest()


def test_blob_sha256_is_the_plain_sha256_of_the_bytes():
    assert blob_sha256(b"abc") == hashlib.sha256(b"abc").hexdigest()


def test_token_digest_hashes_domain_count_and_int32_little_endian_ids():
    # By hand: tag, NUL, u64le count 3, then 1, 2, 300 as int32le.
    expected = _sha(b"grove.tokens.v1\x00", struct.pack("<Q", 3), struct.pack("<3i", 1, 2, 300))
    assert token_digest([1, 2, 300]) == expected


def test_token_digest_of_no_tokens_is_defined():
    assert token_digest([]) == _sha(b"grove.tokens.v1\x00", struct.pack("<Q", 0))


def test_token_digest_does_not_depend_on_the_container():
    expected = token_digest([5, 6, 7])
    assert {
        token_digest(torch.tensor([5, 6, 7], dtype=torch.int32)),
        token_digest(torch.tensor([5, 6, 7], dtype=torch.int64)),
        token_digest(np.array([5, 6, 7], dtype=np.uint16)),
        token_digest((5, 6, 7)),
    } == {expected}


def test_token_digest_depends_on_order():
    assert token_digest([1, 2]) != token_digest([2, 1])


def test_token_digest_differs_from_the_plain_digest_of_the_same_bytes():
    raw = struct.pack("<Q", 2) + struct.pack("<2i", 1, 2)
    assert token_digest([1, 2]) not in (blob_sha256(raw), blob_sha256(raw[8:]))


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        ([1.0, 2.0], r"token ids: must hold integer token ids"),
        (torch.tensor([1.0]), r"token ids: must hold integer token ids; got torch.float32"),
        ([-1], r"must hold token ids in \[0, 2147483647\]; got min -1"),
        ([2**31], r"must hold token ids in \[0, 2147483647\]"),
        ([[1, 2]], r"token ids: must be one-dimensional; got shape \(1, 2\)"),
        ("12", r"token ids: must be a sequence of integer token ids"),
    ],
    ids=["floats", "float-tensor", "negative", "too-large", "two-dim", "string"],
)
def test_token_digest_rejects_what_is_not_token_ids(tokens, message):
    with pytest.raises(InvalidDeltaError, match=message):
        token_digest(tokens)


def test_root_chain_digest_hashes_root_marker_and_both_token_digests():
    expected = _sha(
        b"grove.chain.v1\x00\x00",
        bytes.fromhex(token_digest([1, 2])),
        bytes.fromhex(token_digest([3])),
    )
    assert chain_digest(None, [1, 2], [3]) == expected


def test_continuation_chain_digest_hashes_the_parent_digest():
    parent = chain_digest(None, [1, 2], [3])
    expected = _sha(
        b"grove.chain.v1\x00\x01",
        bytes.fromhex(parent),
        bytes.fromhex(token_digest([4])),
        bytes.fromhex(token_digest([5, 6])),
    )
    assert chain_digest(parent, [4], [5, 6]) == expected


def test_chain_digest_binds_which_tokens_were_generated():
    assert chain_digest(None, [1, 2], [3]) != chain_digest(None, [1], [2, 3])


def test_chain_digest_of_the_same_call_differs_under_different_parents():
    parent_a, parent_b = chain_digest(None, [1], [2]), chain_digest(None, [1], [9])
    assert chain_digest(parent_a, [3], [4]) != chain_digest(parent_b, [3], [4])


def test_chain_digests_fold_each_call_onto_the_previous():
    first = chain_digest(None, [1, 2], [3])
    second = chain_digest(first, [4], [5, 6])
    assert chain_digests([([1, 2], [3]), ([4], [5, 6])]) == [first, second]


def test_chain_digests_continue_from_a_given_parent():
    first = chain_digest(None, [1, 2], [3])
    assert chain_digests([([4], [5, 6])], parent=first) == [chain_digest(first, [4], [5, 6])]


def test_row_chain_digests_recompute_the_calls_chain_from_row_tokens():
    row = torch.tensor([1, 2, 3, 4, 5, 6])
    assert row_chain_digests(row, [(2, 1), (1, 2)]) == chain_digests([([1, 2], [3]), ([4], [5, 6])])


def test_row_chain_digests_of_a_row_with_a_changed_token_differ_from_the_recorded_ones():
    recorded = chain_digests([([1, 2], [3]), ([4], [5, 6])])
    assert row_chain_digests([1, 2, 3, 4, 5, 7], [(2, 1), (1, 2)])[1] != recorded[1]


def test_row_chain_digests_reject_lengths_that_do_not_cover_the_row():
    with pytest.raises(InvalidDeltaError, match=r"cover the row's 6 tokens exactly; got 5 tokens"):
        row_chain_digests([1, 2, 3, 4, 5, 6], [(2, 1), (1, 1)])


def test_chain_digest_rejects_a_malformed_parent():
    with pytest.raises(InvalidDeltaError, match=r"parent chain digest: must be 64 lowercase hex"):
        chain_digest("ABC", [1], [2])


def test_media_digest_hashes_dtype_shape_and_bytes():
    pixels = torch.tensor([[1, 2]], dtype=torch.uint8)
    expected = _sha(
        b"grove.media.v1\x00",
        struct.pack("<I", 5) + b"uint8",
        struct.pack("<I", 2),
        struct.pack("<QQ", 1, 2),
        b"\x01\x02",
    )
    assert media_digest(pixels) == expected


def test_media_digest_depends_on_shape():
    pixels = torch.arange(6, dtype=torch.float32)
    assert media_digest(pixels.reshape(2, 3)) != media_digest(pixels.reshape(3, 2))


def test_media_digest_depends_on_dtype_for_the_same_bytes():
    raw = torch.arange(4, dtype=torch.int16)
    assert media_digest(raw) != media_digest(raw.view(torch.float16))


def test_media_digest_of_a_non_contiguous_tensor_equals_its_contiguous_copy():
    pixels = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    assert media_digest(pixels) == media_digest(pixels.contiguous())
