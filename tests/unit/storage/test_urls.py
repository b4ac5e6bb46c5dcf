"""Blob store URLs: a local directory (plain path or file://) or s3://bucket/prefix."""

from __future__ import annotations

import pytest

from grove.storage import InvalidBlobUrlError, open_blob_store


def test_plain_path_opens_a_local_store_and_creates_the_directory(tmp_path):
    store = open_blob_store(str(tmp_path / "a" / "blobs"))
    assert (store.backend, store.url) == ("local", f"file://{tmp_path}/a/blobs")
    assert (tmp_path / "a" / "blobs").is_dir()


def test_file_url_opens_the_same_local_directory(tmp_path):
    assert open_blob_store(f"file://{tmp_path}").url == f"file://{tmp_path}"


def test_relative_path_is_resolved_against_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert open_blob_store(".grove/blobs").url == f"file://{tmp_path}/.grove/blobs"


def test_s3_url_opens_an_s3_store_rooted_at_bucket_and_prefix():
    store = open_blob_store("s3://grove-blobs/runs/7/", endpoint_url="http://127.0.0.1:1")
    assert (store.backend, store.url, store.path("staging/a/b")) == (
        "s3",
        "s3://grove-blobs/runs/7",
        "grove-blobs/runs/7/staging/a/b",
    )


def test_s3_url_without_prefix_is_rooted_at_the_bucket():
    assert open_blob_store("s3://grove-blobs").path("staging/a/b") == "grove-blobs/staging/a/b"


@pytest.mark.parametrize(
    ("url", "options", "message"),
    [
        ("gs://bucket/prefix", {}, r"unsupported scheme; a blob store URL is a local path"),
        ("", {}, r"a blob store URL is a local path, file:///abs/dir or s3://bucket/prefix"),
        ("file://host/dir", {}, r"a file URL names an absolute path"),
        ("s3://Bad_Bucket/p", {}, r"bucket 'Bad_Bucket' is not a valid S3 bucket name"),
        ("s3:///prefix", {}, r"bucket '' is not a valid S3 bucket name"),
        ("s3://bucket/a/../b", {}, r"prefix segment is 1-200"),
        ("s3://bucket/p", {"endpoint": "x"}, r"unknown S3 options \['endpoint'\]"),
        ("s3://bucket/p", {"max_attempts": 0}, r"'s3://bucket/p': max_attempts is 1-20"),
    ],
    ids=[
        "other-scheme",
        "empty",
        "file-with-host",
        "bad-bucket",
        "no-bucket",
        "traversal-prefix",
        "unknown-option",
        "option-out-of-bounds",
    ],
)
def test_unusable_urls_and_options_are_rejected(url, options, message):
    with pytest.raises(InvalidBlobUrlError, match=message):
        open_blob_store(url, **options)


def test_local_store_takes_no_options(tmp_path):
    with pytest.raises(
        InvalidBlobUrlError, match=r"a local store takes no options, got \['region'\]"
    ):
        open_blob_store(str(tmp_path), region="eu-west-1")


def test_path_of_an_existing_file_is_rejected(tmp_path):
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(InvalidBlobUrlError, match=r"exists and is not a directory"):
        open_blob_store(str(tmp_path / "file"))
