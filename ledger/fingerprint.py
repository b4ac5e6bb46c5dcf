"""Content fingerprints of generated output: how a returned item is matched to its call.

The capture side records ``fingerprint_output`` of the output items it returned for a call as the
call's ``output_fingerprint``; the training side's selection policies fingerprint the items a
harness returns and look them up. Both import this module, so the two digests cannot drift.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

__all__ = ["FINGERPRINT_DOMAIN", "encode_output_item", "fingerprint_encoded", "fingerprint_output"]

IDENTITY_KEYS: Final = frozenset({"id", "call_id", "status", "response_id"})
FINGERPRINT_DOMAIN: Final = b"grove.output.v1\n"


def fingerprint_output(items: Sequence[Mapping[str, Any]]) -> str:
    """The content fingerprint of one whole generation's output items, in order (sha256 hex).

    Identity and status keys (``id``, ``call_id``, ``status``, ``response_id``) are dropped from
    each item and each tool call; ``None``, empty strings, lists and mappings are dropped
    (null/empty content equivalence); tool-call ``arguments`` strings are parsed as JSON when they
    parse. The capture side records this digest as ``output_fingerprint`` at commit.
    """
    return fingerprint_encoded([encode_output_item(item) for item in items])


def encode_output_item(item: Mapping[str, Any]) -> bytes:
    """One item's length-prefixed canonical JSON; a generation's fingerprint hashes these."""
    encoded = json.dumps(
        _normalize_item(item), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode()
    return len(encoded).to_bytes(8, "big") + encoded


def fingerprint_encoded(encoded_items: Sequence[bytes]) -> str:
    """The fingerprint of already encoded items (``encode_output_item``), for incremental use."""
    return hashlib.sha256(FINGERPRINT_DOMAIN + b"".join(encoded_items)).hexdigest()


def _normalize_item(item: Mapping[str, Any]) -> Any:
    normalized = {
        key: _normalize_value(key, value)
        for key, value in item.items()
        if key not in IDENTITY_KEYS and not _is_empty(value)
    }
    if isinstance(normalized.get("tool_calls"), list):
        normalized["tool_calls"] = [
            _normalize_item(call) if isinstance(call, Mapping) else call
            for call in normalized["tool_calls"]
        ]
    return normalized


def _normalize_value(key: str, value: Any) -> Any:
    if key == "arguments" and isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    if isinstance(value, Mapping):
        return {k: _normalize_value(k, v) for k, v in value.items() if not _is_empty(v)}
    if isinstance(value, list):
        return [_normalize_value("", v) for v in value]
    return value


def _is_empty(value: Any) -> bool:
    return value is None or (isinstance(value, str | list | tuple | Mapping) and len(value) == 0)
