"""S3 configuration: checksums when required, standard retries, timeouts, and where endpoints and
credentials come from. Building the filesystem does not connect, so no server is needed here."""

from __future__ import annotations

import pytest

from grove.storage import InvalidBlobUrlError, S3Options
from grove.storage.s3 import CLIENT_CONNECTIONS, botocore_config, s3_client, s3_filesystem


def test_botocore_config_computes_and_validates_checksums_only_when_required():
    config = botocore_config(S3Options())
    assert (config["request_checksum_calculation"], config["response_checksum_validation"]) == (
        "when_required",
        "when_required",
    )


def test_botocore_config_uses_standard_retries_counting_every_attempt():
    assert botocore_config(S3Options(max_attempts=7))["retries"] == {
        "mode": "standard",
        "total_max_attempts": 7,
    }


def test_botocore_config_sets_both_timeouts():
    config = botocore_config(S3Options(connect_timeout=2.5, read_timeout=12.0))
    assert (config["connect_timeout"], config["read_timeout"]) == (2.5, 12.0)


def test_filesystem_takes_endpoint_region_and_credentials_from_explicit_options():
    options = S3Options(
        endpoint_url="http://127.0.0.1:9000",
        access_key_id="key",
        secret_access_key="secret",
        region="eu-west-1",
    )
    fs = s3_filesystem(options, env={"AWS_ENDPOINT_URL_S3": "http://elsewhere:1"})
    assert (fs.endpoint_url, fs.key, fs.secret, fs.client_kwargs["region_name"]) == (
        "http://127.0.0.1:9000",
        "key",
        "secret",
        "eu-west-1",
    )


def test_filesystem_prefers_the_s3_specific_endpoint_variable():
    env = {"AWS_ENDPOINT_URL_S3": "http://s3-only:1", "AWS_ENDPOINT_URL": "http://all:2"}
    assert s3_filesystem(S3Options(), env=env).endpoint_url == "http://s3-only:1"


def test_filesystem_falls_back_to_the_general_endpoint_variable():
    assert s3_filesystem(S3Options(), env={"AWS_ENDPOINT_URL": "http://all:2"}).endpoint_url == (
        "http://all:2"
    )


def test_filesystem_region_falls_back_to_aws_region_then_default_region_then_us_east_1():
    assert [
        s3_filesystem(S3Options(), env=env).client_kwargs["region_name"]
        for env in ({"AWS_REGION": "a", "AWS_DEFAULT_REGION": "b"}, {"AWS_DEFAULT_REGION": "b"}, {})
    ] == ["a", "b", "us-east-1"]


def test_filesystem_leaves_retrying_to_botocore_and_caches_no_listings():
    fs = s3_filesystem(S3Options(), env={})
    assert (fs.retries, fs.dircache.use_listings_cache) == (1, False)


def test_s3_client_takes_the_filesystems_endpoint_region_retries_and_timeouts():
    options = S3Options(
        endpoint_url="http://127.0.0.1:9000",
        region="eu-west-1",
        max_attempts=3,
        connect_timeout=2.5,
        read_timeout=12.0,
    )
    meta = s3_client(s3_filesystem(options, env={})).meta
    assert (
        meta.endpoint_url,
        meta.region_name,
        meta.config.retries,
        meta.config.connect_timeout,
        meta.config.read_timeout,
        meta.config.max_pool_connections,
    ) == (
        "http://127.0.0.1:9000",
        "eu-west-1",
        {"mode": "standard", "total_max_attempts": 3},
        2.5,
        12.0,
        CLIENT_CONNECTIONS,
    )


def test_s3_client_checksums_only_when_required():
    config = s3_client(s3_filesystem(S3Options(), env={})).meta.config
    assert (config.request_checksum_calculation, config.response_checksum_validation) == (
        "when_required",
        "when_required",
    )


def test_filesystems_are_not_shared_between_stores():
    assert s3_filesystem(S3Options(), env={}) is not s3_filesystem(S3Options(), env={})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"max_attempts": 0}, r"max_attempts is 1-20, got 0"),
        ({"max_attempts": 21}, r"max_attempts is 1-20, got 21"),
        ({"connect_timeout": 0}, r"connect_timeout is in \(0, 300\] seconds, got 0"),
        ({"read_timeout": 7200}, r"read_timeout is in \(0, 3600\] seconds, got 7200"),
        ({"access_key_id": "key"}, r"access_key_id and secret_access_key are given together"),
    ],
    ids=[
        "no-attempts",
        "too-many-attempts",
        "zero-connect-timeout",
        "long-read-timeout",
        "half-credentials",
    ],
)
def test_s3_options_out_of_bounds_are_rejected(fields, message):
    with pytest.raises(InvalidBlobUrlError, match=message):
        S3Options(**fields)
