"""Blob keys: the documented alphabet, and the builders of each namespace."""

from __future__ import annotations

import pytest

from grove.storage import (
    InvalidKeyError,
    capture_key_of,
    published_key,
    published_prefix,
    staging_key,
    staging_prefix,
    validate_key,
)
from grove.storage.keys import validate_prefix


def test_staging_key_is_staging_capture_key_call_id():
    assert staging_key("g3-r1-a0", "call-7") == "staging/g3-r1-a0/call-7"


def test_staging_prefix_ends_with_a_slash():
    assert staging_prefix("g3-r1-a0") == "staging/g3-r1-a0/"


def test_published_key_is_published_partition_name():
    assert published_key("step-12", "row-0") == "published/step-12/row-0"
    assert published_prefix("step-12") == "published/step-12/"


def test_keys_accept_every_character_of_the_alphabet():
    segment = "Az09._:@-x"
    assert validate_key(f"staging/{segment}/{segment}") == f"staging/{segment}/{segment}"


def test_any_ledger_stream_id_alphabet_capture_key_is_a_segment():
    assert staging_key("attempt:7@host_1.run-2", "c1") == "staging/attempt:7@host_1.run-2/c1"


@pytest.mark.parametrize(
    ("key", "rule"),
    [
        ("staging/../escape", r"starting with a letter or digit"),
        ("staging/a..b/c", r"never contains '\.\.'"),
        ("/staging/a/b", r"no leading '/'"),
        ("staging//b", r"no empty segments"),
        ("staging/a/b/", r"no empty segments"),
        ("", r"no empty segments"),
        ("staging", r"at least two segments"),
        ("staging/.hidden/b", r"starting with a letter or digit"),
        ("staging/-dash/b", r"starting with a letter or digit"),
        ("staging/with space/b", r"1-200 of"),
        ("staging/caf\u00e9/b", r"1-200 of"),
        ("staging/a\\b/c", r"1-200 of"),
        (f"staging/{'a' * 201}/b", r"1-200 of"),
        ("staging/" + "/".join(["a" * 200] * 6), r"at most 1024 bytes"),
    ],
    ids=[
        "parent-segment",
        "double-dot-inside",
        "absolute",
        "empty-segment",
        "trailing-slash",
        "empty",
        "one-segment",
        "leading-dot",
        "leading-dash",
        "space",
        "non-ascii",
        "backslash",
        "long-segment",
        "long-key",
    ],
)
def test_validate_key_rejects_keys_outside_the_alphabet(key, rule):
    with pytest.raises(InvalidKeyError, match=rule):
        validate_key(key)


def test_validate_key_rejects_a_non_string():
    with pytest.raises(InvalidKeyError, match=r"a key is a string, got bytes"):
        validate_key(b"staging/a/b")


def test_staging_key_rejects_a_capture_key_with_a_slash():
    with pytest.raises(InvalidKeyError, match=r"'a/b'.*a capture key is 1-200"):
        staging_key("a/b", "c1")


def test_staging_key_rejects_an_empty_call_id():
    with pytest.raises(InvalidKeyError, match=r"a call id is 1-200"):
        staging_key("cap", "")


def test_capture_key_of_a_staging_key_is_its_second_segment():
    assert capture_key_of("staging/cap-1/call-1") == "cap-1"


def test_capture_key_of_a_published_key_is_none():
    assert capture_key_of("published/step-1/row-0") is None


def test_validate_prefix_accepts_empty_and_segments_ending_with_a_slash():
    assert (validate_prefix(""), validate_prefix("staging/")) == ("", "staging/")


def test_validate_prefix_rejects_a_prefix_without_trailing_slash():
    with pytest.raises(InvalidKeyError, match=r"ending with '/'"):
        validate_prefix("staging/cap")
