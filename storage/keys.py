"""Blob keys: the documented alphabet, validation, and the builders for each namespace.

A key is ``/``-separated segments relative to the store's root. Each segment is 1-200 characters
of ``A-Z a-z 0-9 . _ : @ -`` (the ledger's stream-id alphabet, so any capture key is a segment),
starts with a letter or digit and never contains ``..``. A key has at least two segments, is at
most 1024 bytes (S3's limit), and has no leading or trailing ``/`` and no empty segment, so it can
never escape the root or name a directory. Namespaces:

- ``staging/{capture_key}/{call_id}`` — one call's delta blob, written before its commit event;
- ``published/{partition}/{name}`` — blobs handed to training, owned by the publisher.

Names starting with ``.`` can never be keys; the local backend uses them for its temporary files.
"""

from __future__ import annotations

import re

from grove.storage.errors import InvalidKeyError

__all__ = [
    "MAX_KEY_BYTES",
    "PUBLISHED",
    "SEGMENT_PATTERN",
    "STAGING",
    "capture_key_of",
    "published_key",
    "published_prefix",
    "staging_key",
    "staging_prefix",
    "validate_key",
    "validate_prefix",
    "validate_segment",
]

_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,199}"
SEGMENT_PATTERN = re.compile(rf"\A{_SEGMENT}\Z")  # \Z, not $: "$" passes a trailing newline
_KEY_PATTERN = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})+")  # the fast path; rules below explain
MAX_KEY_BYTES = 1024
STAGING = "staging"
PUBLISHED = "published"


def validate_segment(segment: object, *, what: str = "segment") -> str:
    """``segment`` if it is one valid key segment; else ``InvalidKeyError`` naming the rule."""
    if not isinstance(segment, str):
        raise InvalidKeyError(segment, f"a {what} is a string, got {type(segment).__name__}")
    if not SEGMENT_PATTERN.fullmatch(segment):
        raise InvalidKeyError(
            segment,
            f"a {what} is 1-200 of 'A-Z a-z 0-9 . _ : @ -' starting with a letter or digit",
        )
    if ".." in segment:
        raise InvalidKeyError(segment, f"a {what} never contains '..'")
    return segment


def _validate_segments(key: object) -> list[str]:
    if not isinstance(key, str):
        raise InvalidKeyError(key, f"a key is a string, got {type(key).__name__}")
    if key.startswith("/"):
        raise InvalidKeyError(key, "a key is relative to the store root (no leading '/')")
    if len(key.encode()) > MAX_KEY_BYTES:
        raise InvalidKeyError(key, f"a key is at most {MAX_KEY_BYTES} bytes")
    segments = key.split("/")
    for segment in segments:
        if segment == "":
            raise InvalidKeyError(key, "a key has no empty segments (no '//' or trailing '/')")
        try:
            validate_segment(segment)
        except InvalidKeyError as exc:
            raise InvalidKeyError(key, f"segment {segment!r}: {exc.rule}") from None
    return segments


def validate_key(key: object) -> str:
    """``key`` if it is a valid blob key of at least two segments; else ``InvalidKeyError``."""
    if (
        isinstance(key, str)
        and _KEY_PATTERN.fullmatch(key)
        and ".." not in key
        and len(key) <= MAX_KEY_BYTES  # the pattern admits ASCII only: characters are bytes
    ):
        return key
    if len(_validate_segments(key)) < 2:
        raise InvalidKeyError(key, "a key has at least two segments (namespace and name)")
    return key  # type: ignore[return-value]


def validate_prefix(prefix: object) -> str:
    """``prefix`` if it is ``""`` or valid segments followed by ``/``; else ``InvalidKeyError``."""
    if prefix == "":
        return ""
    if not isinstance(prefix, str) or not prefix.endswith("/"):
        raise InvalidKeyError(prefix, "a prefix is '' or whole segments ending with '/'")
    _validate_segments(prefix[:-1])
    return prefix


def staging_key(capture_key: str, call_id: str) -> str:
    """The key of one call's delta blob: ``staging/{capture_key}/{call_id}``."""
    return staging_prefix(capture_key) + validate_segment(call_id, what="call id")


def staging_prefix(capture_key: str) -> str:
    """The prefix of an attempt's staging partition: ``staging/{capture_key}/``."""
    validate_segment(capture_key, what="capture key")
    return f"{STAGING}/{capture_key}/"


def published_key(partition: str, name: str) -> str:
    """The key of a published blob: ``published/{partition}/{name}``."""
    return published_prefix(partition) + validate_segment(name, what="name")


def published_prefix(partition: str) -> str:
    """The prefix of a publication partition: ``published/{partition}/``."""
    validate_segment(partition, what="partition")
    return f"{PUBLISHED}/{partition}/"


def capture_key_of(key: str) -> str | None:
    """The capture key a staging key belongs to, or ``None`` for keys outside ``staging/``."""
    segments = key.split("/")
    if len(segments) >= 3 and segments[0] == STAGING:
        return segments[1]
    return None
