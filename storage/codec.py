"""The call-delta codec: one committed call's tensors as one safetensors blob, exactly.

A call stores only what it adds to its context (``docs/storage.md``, "Codec"): the new prompt
tokens (for a root, its whole rendered prompt), the generated tokens with their generation
logprobs, and, where present, routed experts and the processed media of its new prompt tokens.

Blob layout (safetensors; ``docs/storage.md`` has the full description):

==================  ==============================  ==========================================
tensor              dtype, shape                    meaning
==================  ==============================  ==========================================
``prompt_delta``    int32 ``(P,)``                  new prompt token ids
``generated``       int32 ``(G,)``                  generated token ids
``logprobs``        float32 ``(G,)``                generation logprob of each generated token
``routes``          integer ``(P + G, [L,] top_k)`` routed experts per delta token (optional)
``media.{i}``       any supported dtype and shape   processed pixels of media ``i``
==================  ==============================  ==========================================

The header's metadata holds one entry, ``grove``: canonical JSON (sorted keys, no spaces) with the
codec name, its version, the media descriptors in order and, where recorded, ``messages``: the
conversation items the call adds to its context (``docs/fork.md``, "The conversation").
safetensors orders the tensors itself, so equal deltas always encode to identical bytes — the
write-once store relies on that for idempotent retries.

``encode_delta`` is on the capture path of every model call, so it skips the Python side of
``safetensors.torch.save`` (its shared-memory search and per-tensor ``ctypes`` views, meant for
whole models) and hands each validated tensor to safetensors' own serializer by pointer, as that
function does last: the bytes are the ones ``safetensors.torch.save`` writes
(``tests/unit/storage/test_codec.py`` checks that on random deltas). Validation reads each tensor
through one zero-copy numpy view: construction checks the tensors, ``encode_delta`` checks them
again (a tensor may have been changed in place since), and ``CallDelta.from_lists`` does not
recheck the token ids it has just checked while converting them.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import numpy as np
import safetensors
import safetensors.torch
import torch
from safetensors import SafetensorError

from grove.storage.digests import TokenIds, media_digest, token_ids_array
from grove.storage.errors import BlobFormatError, InvalidDeltaError
from grove.storage.keys import capture_key_of

__all__ = [
    "CODEC_NAME",
    "CODEC_VERSION",
    "MEDIA_DTYPES",
    "ROUTE_DTYPES",
    "CallDelta",
    "MediaDescriptor",
    "MediaKind",
    "MediaTensor",
    "decode_delta",
    "describe_media",
    "encode_delta",
]

CODEC_NAME = "grove.call-delta"
CODEC_VERSION = 1
ROUTE_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
MEDIA_DTYPES = frozenset(
    {
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
    }
)
MediaKind = Literal["image", "video"]
_MEDIA_KINDS = ("image", "video")
_FIXED_TENSORS = ("prompt_delta", "generated", "logprobs")
# The dtype names ``safetensors.torch.save`` gives safetensors' serializer: ``str(dtype)``'s tail.
_DTYPE_NAMES = {dtype: str(dtype).removeprefix("torch.") for dtype in MEDIA_DTYPES | ROUTE_DTYPES}
# The ``grove`` metadata's canonical JSON: sorted keys, no spaces, no NaN (one encoder, reused).
_HEADER_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
# safetensors >= 0.8 takes each tensor by pointer (``TensorSpec``); older versions take its bytes.
_TENSOR_SPEC: Any = getattr(safetensors, "TensorSpec", None)
# A live, non-null address for empty tensors, whose own pointer may be null (0 bytes are read).
_EMPTY = np.zeros(8, dtype=np.uint8)
_EMPTY_ADDRESS: int = _EMPTY.ctypes.data


@dataclass(frozen=True)
class MediaDescriptor:
    """Where one media item sits in a call's new prompt tokens, and what it is.

    Produced by the capture engine (usually through ``describe_media``), stored in the blob's
    metadata, read by the projector to re-own media in rows. ``[token_start, token_end)`` is a
    non-empty span inside the call's ``prompt_delta``; ``frames`` is 1 for an image; ``digest`` is
    the ``grove.media.v1`` digest of the pixels.
    """

    media_id: str
    kind: MediaKind
    height: int
    width: int
    frames: int
    token_start: int
    token_end: int
    digest: str


@dataclass(frozen=True, eq=False)
class MediaTensor:
    """A media item's descriptor and its processed pixels (the processor's output tensor)."""

    descriptor: MediaDescriptor
    pixels: torch.Tensor


def describe_media(
    *,
    media_id: str,
    kind: MediaKind,
    pixels: torch.Tensor,
    height: int,
    width: int,
    token_span: tuple[int, int],
    frames: int = 1,
) -> MediaTensor:
    """A ``MediaTensor`` for ``pixels``, with the digest computed; validated with its delta."""
    descriptor = MediaDescriptor(
        media_id=media_id,
        kind=kind,
        height=height,
        width=width,
        frames=frames,
        token_start=token_span[0],
        token_end=token_span[1],
        digest=media_digest(pixels),
    )
    return MediaTensor(descriptor=descriptor, pixels=pixels)


@dataclass(frozen=True, eq=False)
class CallDelta:
    """One committed call's tensors: what the call adds to its context.

    Produced by the capture engine, stored by ``BlobStore.put_delta``, read back by the training
    projector. Every tensor field is a torch tensor (lists are refused; ``from_lists`` converts):

    - ``prompt_delta``: int32 ``(P,)``, token ids >= 0 — a root's whole prompt, a continuation's
      new observation tokens;
    - ``generated``: int32 ``(G,)``, token ids >= 0;
    - ``logprobs``: float32 ``(G,)``, never NaN or +inf — one per generated token;
    - ``routes``: ``None`` (no routed experts captured) or an integer ``(P + G, layers, top_k)``
      (or ``(P + G, top_k)``: one MoE layer) tensor, one row per delta token, in delta order;
    - ``media``: media items of the new prompt tokens, spans ordered and disjoint, ids unique;
    - ``messages``: the conversation items the call adds, as the tokens do — its request's items
      after its parent's conversation (a root: all of them), then its own answer — as normalized
      Chat messages (JSON objects); ``None`` where they were not recorded (blobs written before
      Grove recorded them, or deltas built without them). A call's whole conversation is the
      concatenation along its chain (``docs/fork.md``, "The conversation").

    Construction validates all of it and raises ``InvalidDeltaError``. Equality is exact: same
    dtypes, shapes and bits.
    """

    prompt_delta: torch.Tensor
    generated: torch.Tensor
    logprobs: torch.Tensor
    routes: torch.Tensor | None = None
    media: tuple[MediaTensor, ...] = ()
    messages: tuple[dict[str, Any], ...] | None = None

    def __post_init__(self) -> None:
        self._settle(tokens_checked=False)

    def _settle(self, *, tokens_checked: bool) -> None:
        object.__setattr__(self, "media", tuple(self.media))
        if self.messages is not None:
            object.__setattr__(self, "messages", tuple(self.messages))
        _validate(self, tokens_checked=tokens_checked)

    @classmethod
    def from_lists(
        cls,
        prompt_delta: Sequence[int],
        generated: Sequence[int],
        logprobs: Sequence[float],
        *,
        routes: torch.Tensor | None = None,
        media: Sequence[MediaTensor] = (),
        messages: Sequence[dict[str, Any]] | None = None,
    ) -> CallDelta:
        """A ``CallDelta`` from plain token-id and logprob lists, as an HTTP response has them."""
        try:
            logprob_array = np.asarray(logprobs, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidDeltaError("logprobs", "must be a sequence of floats", exc) from None
        values = (
            _int32_tensor(prompt_delta, "prompt_delta"),
            _int32_tensor(generated, "generated"),
            torch.from_numpy(logprob_array.astype(np.float32)),
            routes,
            media,
            messages,
        )
        # The dataclass's own __init__ would check the token ids token_ids_array just checked.
        delta = object.__new__(cls)
        for name, value in zip(_FIELD_NAMES, values, strict=True):
            object.__setattr__(delta, name, value)
        delta._settle(tokens_checked=True)
        return delta

    @property
    def delta_len(self) -> int:
        """Tokens this call adds to its context: ``len(prompt_delta) + len(generated)``."""
        return int(self.prompt_delta.numel() + self.generated.numel())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CallDelta):
            return NotImplemented
        if (self.routes is None) != (other.routes is None) or len(self.media) != len(other.media):
            return False
        if self.messages != other.messages:
            return False
        pairs = [
            (self.prompt_delta, other.prompt_delta),
            (self.generated, other.generated),
            (self.logprobs, other.logprobs),
            *(
                [(self.routes, other.routes)]
                if self.routes is not None and other.routes is not None
                else []
            ),
            *[(a.pixels, b.pixels) for a, b in zip(self.media, other.media, strict=True)],
        ]
        return all(
            a.descriptor == b.descriptor for a, b in zip(self.media, other.media, strict=True)
        ) and all(_same_bits(a, b) for a, b in pairs)

    __hash__ = None  # type: ignore[assignment]


_FIELD_NAMES = tuple(field.name for field in fields(CallDelta))
_DESCRIPTOR_FIELDS = tuple(field.name for field in fields(MediaDescriptor))


def _int32_tensor(tokens: TokenIds, field: str) -> torch.Tensor:
    """Checked int32 token ids in a tensor of their own: copied only where the array
    ``token_ids_array`` made is (or views) the caller's memory."""
    array = token_ids_array(tokens, field).astype(np.int32, copy=False)
    if array is tokens or not array.flags.owndata or not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return _raw(a) == _raw(b)


def _raw(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def _require_tensor(value: object, field: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InvalidDeltaError(field, "must be a torch tensor", type(value).__name__)
    return value


def _require(condition: bool, field: str, rule: str, got: object) -> None:
    if not condition:
        raise InvalidDeltaError(field, rule, got)


def _host(tensor: torch.Tensor, field: str) -> torch.Tensor:
    """``tensor`` as its blob holds it: dense, on the CPU, contiguous, out of autograd — the
    tensor itself where it already is (the usual case), else a copy or view that is."""
    if tensor.layout != torch.strided:
        raise InvalidDeltaError(field, "must be a dense (strided) tensor", tensor.layout)
    if not tensor.is_cpu:
        tensor = tensor.cpu()
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    return tensor


def _validate_tokens(value: object, field: str) -> torch.Tensor:
    tensor = _require_tensor(value, field)
    if tensor.dtype != torch.int32:
        raise InvalidDeltaError(field, "must have dtype torch.int32", tensor.dtype)
    if tensor.dim() != 1:
        raise InvalidDeltaError(field, "must be one-dimensional", f"shape {tuple(tensor.shape)}")
    host = _host(tensor, field)
    if host.numel():
        low = int(host.numpy().min())
        _require(low >= 0, field, "must hold token ids >= 0", f"minimum {low}")
    return host


def _validate_logprobs(value: object, generated: torch.Tensor) -> torch.Tensor:
    logprobs = _require_tensor(value, "logprobs")
    if logprobs.dtype != torch.float32:
        raise InvalidDeltaError("logprobs", "must have dtype torch.float32", logprobs.dtype)
    if logprobs.shape != generated.shape:
        raise InvalidDeltaError(
            "logprobs",
            f"must have one value per generated token, shape ({generated.numel()},)",
            f"shape {tuple(logprobs.shape)}",
        )
    host = _host(logprobs, "logprobs")
    if host.numel():
        values = host.numpy()
        top = float(values.max())  # NaN if any value is NaN: a maximum propagates NaN
        if math.isnan(top) or top == math.inf:  # count them only to name them in the error
            nan = int(np.isnan(values).sum())
            _require(nan == 0, "logprobs", "must not be NaN", f"{nan} NaN value(s)")
            positive_inf = int(np.isposinf(values).sum())
            _require(
                positive_inf == 0, "logprobs", "must not be +inf", f"{positive_inf} +inf value(s)"
            )
    return host


def _validate(delta: CallDelta, *, tokens_checked: bool = False) -> dict[str, torch.Tensor]:
    """Check every rule of ``delta`` (``InvalidDeltaError``, the first broken); its tensors by
    blob name, as the blob holds them (``_host``). ``tokens_checked``: the token ids are int32
    host tensors ``from_lists`` has just made from arrays ``token_ids_array`` checked."""
    if tokens_checked:
        prompt, generated = delta.prompt_delta, delta.generated
    else:
        prompt = _validate_tokens(delta.prompt_delta, "prompt_delta")
        generated = _validate_tokens(delta.generated, "generated")
    tensors = {
        "prompt_delta": prompt,
        "generated": generated,
        "logprobs": _validate_logprobs(delta.logprobs, generated),
    }
    if delta.routes is not None:
        routes = _require_tensor(delta.routes, "routes")
        _require(routes.dtype in ROUTE_DTYPES, "routes", "must have an integer dtype", routes.dtype)
        rows = prompt.numel() + generated.numel()
        if not (routes.dim() in (2, 3) and routes.shape[0] == rows and min(routes.shape[1:]) >= 1):
            raise InvalidDeltaError(
                "routes",
                f"must have shape ({rows}, top_k) or ({rows}, layers, top_k), each >= 1 (one row "
                "per delta token)",
                f"shape {tuple(routes.shape)}",
            )
        tensors["routes"] = _host(routes, "routes")
    for index, pixels in enumerate(_validate_media(delta.media, prompt.numel())):
        tensors[f"media.{index}"] = pixels
    _validate_messages(delta.messages)
    return tensors


def _validate_messages(messages: tuple[dict[str, Any], ...] | None) -> None:
    if messages is None:
        return
    for index, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)):
            raise InvalidDeltaError(
                f"messages[{index}]",
                "must be a JSON object with a string role",
                type(message).__name__,
            )


def _validate_media(media: tuple[MediaTensor, ...], prompt_len: int) -> list[torch.Tensor]:
    """Check the media items' rules; their pixels in order, as the blob holds them (``_host``)."""
    seen: set[str] = set()
    previous_end = 0
    pixels_in_order = []
    for index, item in enumerate(media):
        field = f"media[{index}]"
        _require(isinstance(item, MediaTensor), field, "must be a MediaTensor", type(item).__name__)
        d = item.descriptor
        _require(
            isinstance(d, MediaDescriptor), field, "must have a MediaDescriptor", type(d).__name__
        )
        _require(
            isinstance(d.media_id, str) and d.media_id != "",
            field,
            "media_id must be a non-empty string",
            repr(d.media_id),
        )
        _require(
            d.media_id not in seen,
            field,
            "media_id must be unique within the call",
            repr(d.media_id),
        )
        seen.add(d.media_id)
        _require(d.kind in _MEDIA_KINDS, field, f"kind must be one of {_MEDIA_KINDS}", repr(d.kind))
        for name in ("height", "width", "frames", "token_start", "token_end"):
            value = getattr(d, name)
            _require(type(value) is int, field, f"{name} must be an int", repr(value))
        _require(
            d.height >= 1 and d.width >= 1,
            field,
            "height and width must be >= 1",
            f"{d.height}x{d.width}",
        )
        _require(d.frames >= 1, field, "frames must be >= 1", d.frames)
        _require(
            d.kind != "image" or d.frames == 1, field, "an image has exactly 1 frame", d.frames
        )
        _require(
            previous_end <= d.token_start < d.token_end <= prompt_len,
            field,
            f"token span must be non-empty, inside the {prompt_len} new prompt tokens, "
            f"and after the previous span (ending at {previous_end})",
            f"[{d.token_start}, {d.token_end})",
        )
        previous_end = d.token_end
        pixels = _require_tensor(item.pixels, f"{field}.pixels")
        _require(
            pixels.dtype in MEDIA_DTYPES,
            f"{field}.pixels",
            "must have a supported dtype",
            pixels.dtype,
        )
        _require(
            pixels.numel() > 0,
            f"{field}.pixels",
            "must not be empty",
            f"shape {tuple(pixels.shape)}",
        )
        host = _host(pixels, f"{field}.pixels")
        actual = media_digest(host)
        _require(actual == d.digest, field, f"digest must be the pixels' digest {actual}", d.digest)
        pixels_in_order.append(host)
    return pixels_in_order


def encode_delta(delta: CallDelta) -> bytes:
    """The safetensors bytes of ``delta``; revalidates first, so bad input never reaches a store."""
    if not isinstance(delta, CallDelta):
        raise InvalidDeltaError("delta", "must be a CallDelta", type(delta).__name__)
    tensors = _validate(delta)
    header: dict[str, Any] = {
        "codec": CODEC_NAME,
        "version": CODEC_VERSION,
        "media": [
            {name: getattr(item.descriptor, name) for name in _DESCRIPTOR_FIELDS}
            for item in delta.media
        ],
    }
    if delta.messages is not None:
        header["messages"] = list(delta.messages)
    try:
        grove = _HEADER_JSON.encode(header)
    except (TypeError, ValueError) as exc:
        raise InvalidDeltaError("messages", "must be JSON-serializable", str(exc)) from None
    return _serialize(tensors, {"grove": grove})


def _serialize(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """``safetensors.torch.save(tensors, metadata=metadata)`` for dense, contiguous CPU tensors of
    Grove's dtypes on a little-endian host: the call to safetensors' serializer that it ends with,
    without its checks for model state dicts. Tensors that share memory are written as copies
    would be (``save`` refuses them). ``tensors`` keeps every pointer alive during the call."""
    if _TENSOR_SPEC is None:
        specs: dict[str, Any] = {
            name: {"dtype": _DTYPE_NAMES[t.dtype], "shape": list(t.shape), "data": _raw(t)}
            for name, t in tensors.items()
        }
    else:
        specs = {
            name: _TENSOR_SPEC(
                dtype=_DTYPE_NAMES[t.dtype],
                shape=t.shape,
                data_ptr=t.data_ptr() or _EMPTY_ADDRESS,
                data_len=t.nbytes,
            )
            for name, t in tensors.items()
        }
    return bytes(safetensors.serialize(specs, metadata=metadata))


class _Malformed(Exception):
    """A rule that blob bytes break; ``decode_delta`` turns it into ``BlobFormatError``."""


def _read_metadata(data: bytes) -> dict[str, Any]:
    if len(data) < 8:
        raise _Malformed(f"shorter than the 8-byte safetensors header length ({len(data)} bytes)")
    (length,) = struct.unpack("<Q", data[:8])
    if length > len(data) - 8:
        raise _Malformed(f"header length {length} exceeds the blob's {len(data)} bytes")
    try:
        grove = json.loads(json.loads(data[8 : 8 + length])["__metadata__"]["grove"])
    except (ValueError, KeyError, TypeError) as exc:
        raise _Malformed(
            f"no readable 'grove' metadata in the safetensors header ({exc})"
        ) from None
    if not isinstance(grove, dict) or grove.get("codec") != CODEC_NAME:
        raise _Malformed(f"metadata codec is not {CODEC_NAME!r}")
    if grove.get("version") != CODEC_VERSION:
        raise _Malformed(f"codec version {grove.get('version')!r} is not {CODEC_VERSION}")
    if not isinstance(grove.get("media"), list):
        raise _Malformed("metadata 'media' is not a list")
    if not isinstance(grove.get("messages", []), list):
        raise _Malformed("metadata 'messages' is not a list")
    return grove


def _decode(data: bytes) -> CallDelta:
    metadata = _read_metadata(data)
    descriptors = metadata["media"]
    messages = metadata.get("messages")
    try:
        tensors = safetensors.torch.load(bytes(data))
    except SafetensorError as exc:
        raise _Malformed(f"safetensors cannot read it ({exc})") from None
    expected = {*_FIXED_TENSORS, *(f"media.{i}" for i in range(len(descriptors)))}
    if set(tensors) - {"routes"} != expected:
        raise _Malformed(f"tensors {sorted(tensors)} are not {sorted(expected)} (+ 'routes')")
    try:
        media = tuple(
            MediaTensor(MediaDescriptor(**fields), tensors[f"media.{i}"])
            for i, fields in enumerate(descriptors)
        )
        return CallDelta(
            prompt_delta=tensors["prompt_delta"],
            generated=tensors["generated"],
            logprobs=tensors["logprobs"],
            routes=tensors.get("routes"),
            media=media,
            messages=None if messages is None else tuple(messages),
        )
    except (InvalidDeltaError, TypeError) as exc:
        raise _Malformed(f"its contents break the codec's rules ({exc})") from None


def decode_delta(data: bytes, *, key: str | None = None) -> CallDelta:
    """The ``CallDelta`` in ``data``; ``BlobFormatError`` (naming ``key``) if it is not one."""
    try:
        return _decode(data)
    except _Malformed as exc:
        raise BlobFormatError(key, capture_key_of(key) if key else None, str(exc)) from None
