"""The codec's own encoder writes exactly what ``safetensors.torch.save`` writes, and its cheaper
checks refuse exactly what the torch-op checks refused (``storage/codec.py``, module docstring).

The references below are the encoder and tensor checks as they were before ``encode_delta`` called
safetensors' serializer itself: the blob bytes and the errors must not have moved.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict

import numpy as np
import pytest
import safetensors.torch
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grove.storage import (
    CallDelta,
    InvalidDeltaError,
    decode_delta,
    describe_media,
    encode_delta,
)
from grove.storage.codec import MEDIA_DTYPES, ROUTE_DTYPES

EXAMPLES = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_TOKEN_ID = 2**31 - 1


def torch_save_encoding(delta: CallDelta) -> bytes:
    """The blob of ``delta`` as ``encode_delta`` wrote it through ``safetensors.torch.save``."""
    tensors = {
        "prompt_delta": delta.prompt_delta,
        "generated": delta.generated,
        "logprobs": delta.logprobs,
    }
    if delta.routes is not None:
        tensors["routes"] = delta.routes
    for index, item in enumerate(delta.media):
        tensors[f"media.{index}"] = item.pixels
    tensors = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
    header: dict = {
        "codec": "grove.call-delta",
        "version": 1,
        "media": [asdict(item.descriptor) for item in delta.media],
    }
    if delta.messages is not None:
        header["messages"] = list(delta.messages)
    grove = json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return safetensors.torch.save(tensors, metadata={"grove": grove})


def _random_tensor(seed: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=generator) * 1000).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=torch.int64).to(
        dtype
    )


_DTYPES = sorted(MEDIA_DTYPES, key=str)
_ROUTE_DTYPES = sorted(ROUTE_DTYPES, key=str)
_TEXT = st.text(max_size=12)  # any code point: non-ASCII, quotes, control characters
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_TEXT, inner, max_size=3),
    max_leaves=8,
)
_LOGPROB = st.floats(width=32, allow_nan=False, allow_infinity=False) | st.just(-math.inf)


@st.composite
def _media(draw: st.DrawFn, prompt_len: int) -> tuple:
    count = draw(st.integers(0, min(3, prompt_len // 2)))
    bounds = sorted(
        draw(
            st.lists(
                st.integers(0, prompt_len), min_size=2 * count, max_size=2 * count, unique=True
            )
        )
    )
    items = []
    for index in range(count):
        dtype = draw(st.sampled_from(_DTYPES))
        shape = tuple(draw(st.lists(st.integers(1, 4), max_size=3)))  # () is a 0-dim scalar
        pixels = _random_tensor(draw(st.integers(0, 2**32)), dtype, shape)
        if pixels.dim() >= 2 and draw(st.booleans()):
            pixels = pixels.transpose(0, 1)  # not contiguous
        kind = draw(st.sampled_from(["image", "video"]))
        items.append(
            describe_media(
                media_id=f"m{index}-{draw(_TEXT)}",
                kind=kind,
                pixels=pixels,
                height=draw(st.integers(1, 2048)),
                width=draw(st.integers(1, 2048)),
                frames=1 if kind == "image" else draw(st.integers(1, 8)),
                token_span=(bounds[2 * index], bounds[2 * index + 1]),
            )
        )
    return tuple(items)


@st.composite
def deltas(draw: st.DrawFn) -> CallDelta:
    """Any valid delta: empty or not, with or without routes, media and messages."""
    prompt = draw(st.lists(st.integers(0, MAX_TOKEN_ID), max_size=40))
    generated = draw(st.lists(st.integers(0, MAX_TOKEN_ID), max_size=20))
    logprobs = draw(st.lists(_LOGPROB, min_size=len(generated), max_size=len(generated)))
    routes = None
    if draw(st.booleans()):
        dtype = draw(st.sampled_from(_ROUTE_DTYPES))
        inner = tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)))
        routes = _random_tensor(
            draw(st.integers(0, 2**32)), dtype, (*inner, len(prompt) + len(generated))
        )
        routes = routes.movedim(-1, 0)  # (P + G, [L,] top_k), not contiguous
        if draw(st.booleans()):
            routes = routes.contiguous()
    media = draw(_media(len(prompt)))
    messages = draw(
        st.none()
        | st.lists(
            st.fixed_dictionaries({"role": _TEXT, "content": _TEXT}, optional={"extra": _JSON}),
            max_size=3,
        )
    )
    if draw(st.booleans()):
        return CallDelta.from_lists(
            prompt, generated, logprobs, routes=routes, media=media, messages=messages
        )
    return CallDelta(
        prompt_delta=torch.tensor(prompt, dtype=torch.int32),
        generated=torch.tensor(generated, dtype=torch.int32),
        logprobs=torch.tensor(logprobs, dtype=torch.float32),
        routes=routes,
        media=media,
        messages=messages,
    )


@EXAMPLES
@given(delta=deltas())
def test_encode_delta_writes_the_bytes_safetensors_torch_save_writes(delta: CallDelta):
    data = encode_delta(delta)
    assert data == torch_save_encoding(delta)
    assert decode_delta(data) == delta


def test_tensors_that_share_memory_encode_as_their_copies_would():
    # safetensors.torch.save refuses tensors that share memory; the blob is the one of copies.
    tokens = torch.tensor([5, 6], dtype=torch.int32)
    delta = CallDelta(tokens, tokens, torch.tensor([-1.0, -2.0]))
    copies = CallDelta(tokens.clone(), tokens.clone(), torch.tensor([-1.0, -2.0]))
    assert encode_delta(delta) == torch_save_encoding(copies)


def test_a_logprobs_tensor_that_requires_grad_encodes_its_values():
    logprobs = torch.tensor([-0.5, -1.25], requires_grad=True)
    delta = CallDelta(
        torch.tensor([1], dtype=torch.int32), torch.tensor([2, 3], dtype=torch.int32), logprobs
    )
    assert encode_delta(delta) == torch_save_encoding(delta)


def test_from_lists_never_shares_the_callers_memory():
    array = np.array([1, 2], dtype=np.int32)
    tensor = torch.tensor([3], dtype=torch.int32)
    delta = CallDelta.from_lists(array, tensor, [-0.5])
    array[0], tensor[0] = 9, 9
    assert delta.prompt_delta.tolist() == [1, 2]
    assert delta.generated.tolist() == [3]


def test_from_lists_refuses_token_ids_out_of_int32_range():
    with pytest.raises(
        InvalidDeltaError, match=r"generated: must hold token ids in \[0, 2147483647\]"
    ):
        CallDelta.from_lists([1], [2**31], [-0.5])
    with pytest.raises(InvalidDeltaError, match=r"prompt_delta: must hold token ids in"):
        CallDelta.from_lists([-1], [2], [-0.5])


def test_encode_rejects_a_nan_written_through_a_numpy_view():
    delta = CallDelta.from_lists([1], [2, 3], [-0.5, -1.0])
    delta.logprobs.numpy()[1] = math.nan
    with pytest.raises(InvalidDeltaError, match=r"logprobs: must not be NaN; got 1 NaN value"):
        encode_delta(delta)


def test_a_sparse_tensor_is_refused_as_not_dense():
    routes = torch.zeros(3, 2, dtype=torch.int32).to_sparse()
    with pytest.raises(InvalidDeltaError, match=r"routes: must be a dense \(strided\) tensor"):
        CallDelta.from_lists([1], [2, 3], [-0.5, -1.0], routes=routes)


# the cheaper checks against the torch-op checks they replace


def torch_op_refusal(
    prompt: torch.Tensor, generated: torch.Tensor, logprobs: torch.Tensor
) -> tuple[str, str, str] | None:
    """(field, rule, got) of the first tensor rule broken, as the torch-op checks found it."""
    for field, tensor in (("prompt_delta", prompt), ("generated", generated)):
        if tensor.dtype != torch.int32:
            return field, "must have dtype torch.int32", str(tensor.dtype)
        if tensor.dim() != 1:
            return field, "must be one-dimensional", f"shape {tuple(tensor.shape)}"
        if tensor.numel() and int(tensor.min()) < 0:
            return field, "must hold token ids >= 0", f"minimum {int(tensor.min())}"
    if logprobs.dtype != torch.float32:
        return "logprobs", "must have dtype torch.float32", str(logprobs.dtype)
    if logprobs.shape != generated.shape:
        rule = f"must have one value per generated token, shape ({generated.numel()},)"
        return "logprobs", rule, f"shape {tuple(logprobs.shape)}"
    nan = int(torch.isnan(logprobs).sum())
    if nan:
        return "logprobs", "must not be NaN", f"{nan} NaN value(s)"
    positive_inf = int(torch.isposinf(logprobs).sum())
    if positive_inf:
        return "logprobs", "must not be +inf", f"{positive_inf} +inf value(s)"
    return None


_TOKEN = st.integers(-3, MAX_TOKEN_ID)
_ANY_FLOAT = st.floats(width=32) | st.sampled_from([math.nan, math.inf, -math.inf, -0.0])


@st.composite
def _token_tensors(draw: st.DrawFn) -> torch.Tensor:
    values = draw(st.lists(_TOKEN, max_size=6))
    dtype = draw(st.sampled_from([torch.int32, torch.int32, torch.int32, torch.int64]))
    tensor = torch.tensor(values, dtype=dtype)
    if len(values) % 2 == 0 and draw(st.booleans()):
        tensor = tensor.reshape(2, -1)
    return tensor


@EXAMPLES
@given(
    prompt=_token_tensors(),
    generated=_token_tensors(),
    logprobs=st.lists(_ANY_FLOAT, max_size=6),
    logprob_dtype=st.sampled_from([torch.float32, torch.float32, torch.float32, torch.float64]),
)
def test_the_cheaper_checks_refuse_what_the_torch_op_checks_refused_with_the_same_error(
    prompt: torch.Tensor, generated: torch.Tensor, logprobs: list[float], logprob_dtype: torch.dtype
):
    logprob_tensor = torch.tensor(logprobs, dtype=logprob_dtype)
    expected = torch_op_refusal(prompt, generated, logprob_tensor)
    try:
        CallDelta(prompt, generated, logprob_tensor)
    except InvalidDeltaError as error:
        assert (error.field, error.rule, str(error.got)) == expected
    else:
        assert expected is None
