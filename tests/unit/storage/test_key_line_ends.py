"""Blob keys end where their text ends: a trailing newline (which a ``$`` anchor lets through)
or any other line break is outside the alphabet, in a segment, a whole key, a prefix or a name;
so are digests and bucket names."""

from __future__ import annotations

from pathlib import Path

import pytest

from grove.storage import BlobRef, InvalidKeyError, open_blob_store, staging_key, validate_key
from grove.storage.errors import InvalidBlobRefError, InvalidBlobUrlError
from grove.storage.keys import SEGMENT_PATTERN, validate_prefix, validate_segment

LINE_ENDS = ["\n", "\r\n", "\r"]


@pytest.mark.parametrize("end", LINE_ENDS)
def test_a_segment_with_a_line_end_is_refused(end: str):
    with pytest.raises(InvalidKeyError, match="a segment is 1-200 of"):
        validate_segment(f"k{end}")


@pytest.mark.parametrize(
    "key", ["staging/evil\n/c", "staging/a/c\n", "staging\n/a/c", "published/p/n\n"]
)
def test_a_key_with_a_newline_in_any_segment_is_refused(key: str):
    with pytest.raises(InvalidKeyError, match=r"segment '.*\\n'"):
        validate_key(key)


def test_a_prefix_with_a_newline_is_refused():
    with pytest.raises(InvalidKeyError):
        validate_prefix("staging/evil\n/")


def test_a_capture_key_or_call_id_with_a_newline_builds_no_staging_key():
    with pytest.raises(InvalidKeyError, match="capture key"):
        staging_key("k\n", "c1")
    with pytest.raises(InvalidKeyError, match="call id"):
        staging_key("k", "c1\n")


def test_the_public_segment_pattern_refuses_a_newline_even_with_match():
    # re.match with "^...$" accepted "k\n"; the pattern is anchored with \A...\Z instead
    assert SEGMENT_PATTERN.match("k\n") is None
    assert SEGMENT_PATTERN.match("k") is not None


def test_putting_a_newline_key_writes_no_directory(tmp_path: Path):
    store = open_blob_store(str(tmp_path / "blobs"))
    with pytest.raises(InvalidKeyError):
        store.put("staging/evil\n/c", b"x")
    written = list((tmp_path / "blobs").rglob("*")) if (tmp_path / "blobs").exists() else []
    assert [path for path in written if "\n" in path.name] == []
    assert store.list_keys() == []


def test_a_digest_with_a_trailing_newline_is_no_blob_ref():
    with pytest.raises(InvalidBlobRefError, match="64 lowercase hex"):
        BlobRef("staging/k/c1", "0" * 64 + "\n", 1)


def test_a_bucket_name_with_a_trailing_newline_is_refused():
    with pytest.raises(InvalidBlobUrlError, match="not a valid S3 bucket name"):
        open_blob_store("s3://bucket\n/prefix")
