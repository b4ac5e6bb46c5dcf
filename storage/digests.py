"""Digests: of stored bytes (blob integrity) and, domain-separated, of tokens, chains and media.

All digests are SHA-256, written as 64 lowercase hex characters.

- **Blob digest** (``blob_sha256``): the plain SHA-256 of the stored bytes, no domain tag, so that
  ``sha256sum`` of a downloaded blob agrees with the ledger's ``call.committed`` event.
- **Content digests** hash a domain tag, a zero byte, then a fixed-width encoding of the content,
  so a digest of one kind can never be mistaken for a digest of another kind:

  ======================  =========================================================================
  ``grove.tokens.v1``     token ids: u64le count, then each id as int32 little-endian
  ``grove.chain.v1``      a call's place in its context: parent marker (``00`` for a root, ``01``
                          followed by the parent's 32 raw digest bytes), then the raw token digests
                          of the call's prompt delta and of its generated tokens
  ``grove.media.v1``      a media tensor: u32le length + dtype name, u32le rank, each dimension as
                          u64le, then the tensor's bytes (C order, little-endian)
  ======================  =========================================================================

A chain digest commits to every token of the context up to and including the call, and to which of
those tokens were generated; ``row_chain_digests`` recomputes the chain from a training row's
token ids, so a row can be checked against the chain digests recorded for its calls.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from grove.storage.errors import InvalidDeltaError

__all__ = [
    "CHAIN_DOMAIN",
    "MEDIA_DOMAIN",
    "TOKENS_DOMAIN",
    "TokenIds",
    "blob_sha256",
    "chain_digest",
    "chain_digests",
    "media_digest",
    "row_chain_digests",
    "token_digest",
    "token_ids_array",
]

TOKENS_DOMAIN = b"grove.tokens.v1"
CHAIN_DOMAIN = b"grove.chain.v1"
MEDIA_DOMAIN = b"grove.media.v1"
_MAX_TOKEN_ID = 2**31 - 1

TokenIds = Sequence[int] | torch.Tensor | np.ndarray
"""Token ids as a sequence of ints, or a 1-D integer tensor or array."""


def blob_sha256(data: bytes | bytearray | memoryview) -> str:
    """The plain SHA-256 of stored bytes, as recorded in ``call.committed`` and checked on read."""
    return hashlib.sha256(data).hexdigest()


def token_ids_array(tokens: TokenIds, field: str = "token ids") -> np.ndarray:
    """``tokens`` as a little-endian int32 array (the canonical encoding hashed by
    ``grove.tokens.v1``), after checking kind, rank and range; ``field`` names them in errors."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise InvalidDeltaError(field, "must hold integer token ids", tokens.dtype)
        array = tokens.detach().cpu().numpy()
    elif isinstance(tokens, (str, bytes)):
        raise InvalidDeltaError(field, "must be a sequence of integer token ids", type(tokens))
    else:
        array = np.asarray(tokens)
        if array.size == 0:
            array = array.astype(np.int32)
    if array.ndim != 1:
        raise InvalidDeltaError(field, "must be one-dimensional", f"shape {tuple(array.shape)}")
    if array.dtype.kind not in "iu":
        raise InvalidDeltaError(field, "must hold integer token ids", array.dtype)
    if array.size and (array.min() < 0 or array.max() > _MAX_TOKEN_ID):
        raise InvalidDeltaError(
            field,
            f"must hold token ids in [0, {_MAX_TOKEN_ID}]",
            f"min {array.min()}, max {array.max()}",
        )
    return array.astype("<i4", copy=False)


def _token_digest_bytes(tokens: TokenIds, field: str) -> bytes:
    array = token_ids_array(tokens, field)
    h = hashlib.sha256(TOKENS_DOMAIN + b"\x00")
    h.update(struct.pack("<Q", array.size))
    h.update(array.tobytes())
    return h.digest()


def token_digest(tokens: TokenIds) -> str:
    """The ``grove.tokens.v1`` digest of a token sequence (independent of its container type)."""
    return _token_digest_bytes(tokens, "token ids").hex()


def _parent_marker(parent: str | None) -> bytes:
    if parent is None:
        return b"\x00"
    try:
        raw = bytes.fromhex(parent)
    except (TypeError, ValueError):
        raw = b""
    if len(raw) != 32 or parent != raw.hex():
        raise InvalidDeltaError(
            "parent chain digest", "must be 64 lowercase hex characters or None", repr(parent)
        )
    return b"\x01" + raw


def chain_digest(parent: str | None, prompt_delta: TokenIds, generated: TokenIds) -> str:
    """The ``grove.chain.v1`` digest of a call: its parent's chain digest (``None`` for a root)
    folded with the call's prompt-delta and generated token ids."""
    h = hashlib.sha256(CHAIN_DOMAIN + b"\x00")
    h.update(_parent_marker(parent))
    h.update(_token_digest_bytes(prompt_delta, "prompt_delta"))
    h.update(_token_digest_bytes(generated, "generated"))
    return h.hexdigest()


def chain_digests(
    calls: Iterable[tuple[TokenIds, TokenIds]], parent: str | None = None
) -> list[str]:
    """The chain digest of each call of a chain, given ``(prompt_delta, generated)`` per call in
    order from the call after ``parent`` (``None``: from the root)."""
    digests: list[str] = []
    for prompt_delta, generated in calls:
        parent = chain_digest(parent, prompt_delta, generated)
        digests.append(parent)
    return digests


def row_chain_digests(token_ids: TokenIds, lengths: Sequence[tuple[int, int]]) -> list[str]:
    """The chain digests of a row's calls, recomputed from the row's token ids.

    ``lengths`` gives ``(len(prompt_delta), len(generated))`` for each call of the row's path,
    root first; together they must cover the row's tokens exactly. Compare the result with the
    chain digests recorded for the calls to check that the row is exactly their concatenation.
    """
    array = token_ids_array(token_ids, "row token ids")
    total = sum(prompt + generated for prompt, generated in lengths)
    if total != array.size or any(p < 0 or g < 0 for p, g in lengths):
        raise InvalidDeltaError(
            "row lengths",
            f"must be non-negative and cover the row's {array.size} tokens exactly",
            f"{total} tokens in {list(lengths)}",
        )
    spans = []
    start = 0
    for prompt, generated in lengths:
        spans.append(
            (array[start : start + prompt], array[start + prompt : start + prompt + generated])
        )
        start += prompt + generated
    return chain_digests(spans)


def media_digest(pixels: torch.Tensor) -> str:
    """The ``grove.media.v1`` digest of a media tensor: dtype, shape and bytes."""
    if not isinstance(pixels, torch.Tensor):
        raise InvalidDeltaError("media pixels", "must be a torch tensor", type(pixels).__name__)
    tensor = pixels.detach().cpu().contiguous()
    dtype = str(tensor.dtype).removeprefix("torch.").encode()
    h = hashlib.sha256(MEDIA_DOMAIN + b"\x00")
    h.update(struct.pack("<I", len(dtype)) + dtype)
    h.update(struct.pack("<I", tensor.dim()))
    h.update(b"".join(struct.pack("<Q", size) for size in tensor.shape))
    h.update(_tensor_bytes(tensor))
    return h.hexdigest()


def _tensor_bytes(tensor: torch.Tensor) -> bytes:
    """The C-order little-endian bytes of a contiguous CPU tensor (any dtype, bfloat16 included)."""
    if tensor.numel() == 0:
        return b""
    return tensor.reshape(-1).view(torch.uint8).numpy().tobytes()
