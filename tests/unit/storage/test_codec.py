"""The call-delta codec: exact round trips, deterministic bytes, and clear errors for bad input."""

from __future__ import annotations

import hashlib
import json

import pytest
import safetensors.torch
import torch

from grove.storage import (
    BlobFormatError,
    CallDelta,
    InvalidDeltaError,
    MediaDescriptor,
    MediaTensor,
    decode_delta,
    describe_media,
    encode_delta,
    media_digest,
)


def _tokens(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)


def _image(media_id: str = "img-a", span: tuple[int, int] = (1, 3), **overrides) -> MediaTensor:
    fields = {"media_id": media_id, "kind": "image", "height": 2, "width": 2, "token_span": span}
    fields.update(overrides)
    return describe_media(pixels=torch.arange(12, dtype=torch.float32).reshape(3, 2, 2), **fields)


def _delta(**overrides) -> CallDelta:
    fields = {
        "prompt_delta": _tokens(11, 12, 13, 14),
        "generated": _tokens(21, 22),
        "logprobs": torch.tensor([-0.5, -1.25]),
    }
    fields.update(overrides)
    return CallDelta(**fields)


# round trips


def test_text_delta_round_trips_exactly():
    assert decode_delta(encode_delta(_delta())) == _delta()


def test_delta_with_routes_and_media_round_trips_exactly():
    video = describe_media(
        media_id="vid-b",
        kind="video",
        pixels=torch.rand(2, 3, 4, 4).to(torch.bfloat16),
        height=4,
        width=4,
        frames=2,
        token_span=(3, 4),
    )
    delta = _delta(
        routes=torch.arange(24, dtype=torch.int16).reshape(6, 4), media=(_image(), video)
    )
    decoded = decode_delta(encode_delta(delta))
    assert decoded == delta
    assert decoded.media[1].descriptor.frames == 2
    assert decoded.routes is not None and decoded.routes.dtype == torch.int16


def test_delta_with_no_generated_tokens_round_trips():
    delta = _delta(generated=_tokens(), logprobs=torch.zeros(0))
    assert decode_delta(encode_delta(delta)) == delta


def test_negative_infinity_logprob_round_trips():
    delta = _delta(logprobs=torch.tensor([float("-inf"), -0.0]))
    assert torch.equal(decode_delta(encode_delta(delta)).logprobs, delta.logprobs)


def test_from_lists_builds_int32_tokens_and_float32_logprobs():
    delta = CallDelta.from_lists([11, 12, 13, 14], [21, 22], [-0.5, -1.25])
    assert delta == _delta()


MESSAGES = (
    {"content": "Count the apples.", "role": "user"},
    {"content": "Three.", "role": "assistant"},
)


def test_a_deltas_conversation_items_round_trip_in_order():
    delta = _delta(messages=MESSAGES)
    decoded = decode_delta(encode_delta(delta))
    assert decoded == delta
    assert decoded.messages == MESSAGES


def test_a_delta_without_conversation_items_decodes_with_none():
    assert decode_delta(encode_delta(_delta())).messages is None


def test_deltas_with_other_conversation_items_differ():
    assert _delta(messages=MESSAGES) != _delta(messages=MESSAGES[:1])
    assert _delta(messages=MESSAGES) != _delta()


def test_a_conversation_item_without_a_role_is_refused():
    with pytest.raises(InvalidDeltaError, match=r"messages\[1\]: must be a JSON object with"):
        _delta(messages=({"role": "user", "content": "hi"}, {"content": "no role"}))


def test_a_conversation_item_that_is_not_json_is_refused_at_encoding():
    delta = _delta(messages=({"role": "user", "content": float("nan")},))
    with pytest.raises(InvalidDeltaError, match="messages: must be JSON-serializable"):
        encode_delta(delta)


def test_delta_len_is_prompt_delta_plus_generated():
    assert _delta().delta_len == 6


# deterministic bytes


def test_equal_deltas_encode_to_identical_bytes():
    first = _delta(routes=torch.zeros(6, 2, dtype=torch.int32), media=(_image(),))
    second = _delta(routes=torch.zeros(6, 2, dtype=torch.int32), media=(_image(),))
    assert encode_delta(first) == encode_delta(second)


def test_encoding_of_a_fixed_delta_has_a_pinned_digest():
    # Pins the blob format: a change here changes every stored digest (a codec version bump).
    data = encode_delta(_delta())
    assert (len(data), hashlib.sha256(data).hexdigest()) == (
        320,
        "e975caca4fc0b3f022831f35aa804fa011a15746e6ae7e630e5993b2f6bd2a41",
    )


def test_blob_is_plain_safetensors_with_grove_metadata():
    tensors = safetensors.torch.load(encode_delta(_delta(media=(_image(),))))
    assert sorted(tensors) == ["generated", "logprobs", "media.0", "prompt_delta"]


def test_equality_is_bitwise_so_negative_zero_differs_from_zero():
    assert _delta(logprobs=torch.tensor([-0.0, -1.0])) != _delta(logprobs=torch.tensor([0.0, -1.0]))


# bad input


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"prompt_delta": [11, 12]}, r"prompt_delta: must be a torch tensor; got list"),
        (
            {"generated": _tokens(1, 2).long()},
            r"generated: must have dtype torch.int32; got torch.int64",
        ),
        ({"prompt_delta": _tokens(1, 2, 3, 4).reshape(2, 2)}, r"prompt_delta: must be one-dim"),
        (
            {"prompt_delta": _tokens(5, -1)},
            r"prompt_delta: must hold token ids >= 0; got minimum -1",
        ),
        (
            {"logprobs": torch.tensor([-0.5, -1.0], dtype=torch.float64)},
            r"logprobs: must have dtype torch.float32",
        ),
        (
            {"logprobs": torch.tensor([-0.5])},
            r"logprobs: must have one value per generated token, shape \(2,\); got shape \(1,\)",
        ),
        ({"logprobs": torch.tensor([float("nan"), -1.0])}, r"logprobs: must not be NaN; got 1 NaN"),
        ({"logprobs": torch.tensor([float("inf"), -1.0])}, r"logprobs: must not be \+inf"),
        ({"routes": torch.zeros(6, 2)}, r"routes: must have an integer dtype; got torch.float32"),
        (
            {"routes": torch.zeros(5, 2, dtype=torch.int32)},
            r"routes: must have shape \(6, top_k\).*got shape \(5, 2\)",
        ),
        ({"routes": [[0, 1]] * 6}, r"routes: must be a torch tensor; got list"),
    ],
    ids=[
        "list-payload",
        "int64-tokens",
        "two-dim-tokens",
        "negative-token",
        "float64-logprobs",
        "logprobs-length",
        "nan-logprob",
        "inf-logprob",
        "float-routes",
        "routes-rows",
        "list-routes",
    ],
)
def test_invalid_tensor_fields_raise_a_clear_error(overrides, message):
    with pytest.raises(InvalidDeltaError, match=message):
        _delta(**overrides)


@pytest.mark.parametrize(
    ("media", "message"),
    [
        ((_image(span=(3, 5)),), r"media\[0\]: token span must be non-empty, inside the 4 new"),
        ((_image(span=(2, 2)),), r"media\[0\]: token span must be non-empty"),
        (
            (_image("a", (2, 4)), _image("b", (0, 2))),
            r"media\[1\]: token span .* after the previous",
        ),
        ((_image("a", (0, 3)), _image("b", (2, 4))), r"media\[1\]: token span"),
        ((_image("a", (0, 1)), _image("a", (1, 2))), r"media\[1\]: media_id must be unique"),
        ((_image(frames=2),), r"media\[0\]: an image has exactly 1 frame; got 2"),
        ((_image(kind="audio"),), r"media\[0\]: kind must be one of \('image', 'video'\)"),
        ((_image(height=0),), r"media\[0\]: height and width must be >= 1; got 0x2"),
        (("pixels",), r"media\[0\]: must be a MediaTensor; got str"),
    ],
    ids=[
        "span-outside",
        "span-empty",
        "spans-unordered",
        "spans-overlap",
        "duplicate-id",
        "image-frames",
        "unknown-kind",
        "zero-height",
        "not-media",
    ],
)
def test_invalid_media_raise_a_clear_error(media, message):
    with pytest.raises(InvalidDeltaError, match=message):
        _delta(media=media)


def test_media_whose_digest_does_not_match_its_pixels_is_rejected():
    image = _image()
    forged = MediaTensor(image.descriptor, image.pixels + 1)
    with pytest.raises(InvalidDeltaError, match=r"media\[0\]: digest must be the pixels' digest"):
        _delta(media=(forged,))


def test_media_descriptor_digest_is_the_media_digest_of_the_pixels():
    image = _image()
    assert image.descriptor.digest == media_digest(image.pixels)


def test_from_lists_rejects_fractional_token_ids():
    with pytest.raises(InvalidDeltaError, match=r"prompt_delta: must hold integer token ids"):
        CallDelta.from_lists([1.5], [2], [-0.1])


def test_from_lists_rejects_non_numeric_logprobs():
    with pytest.raises(InvalidDeltaError, match=r"logprobs: must be a sequence of floats"):
        CallDelta.from_lists([1], [2], ["high"])


def test_encode_rejects_a_delta_mutated_after_construction():
    delta = _delta()
    delta.generated[0] = -3
    with pytest.raises(InvalidDeltaError, match=r"generated: must hold token ids >= 0"):
        encode_delta(delta)


# decoding foreign bytes


def _foreign(tensors: dict[str, torch.Tensor], grove: dict | None) -> bytes:
    metadata = None if grove is None else {"grove": json.dumps(grove)}
    return safetensors.torch.save(tensors, metadata=metadata)


_FIXED = {"prompt_delta": _tokens(1), "generated": _tokens(2), "logprobs": torch.tensor([-1.0])}
_HEADER = {"codec": "grove.call-delta", "version": 1, "media": []}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"garbage", r"shorter than the 8-byte safetensors header"),
        (b"\xff" * 8 + b"{}", r"header length .* exceeds"),
        (_foreign(_FIXED, None), r"no readable 'grove' metadata"),
        (
            _foreign(_FIXED, {**_HEADER, "codec": "other"}),
            r"metadata codec is not 'grove.call-delta'",
        ),
        (_foreign(_FIXED, {**_HEADER, "version": 2}), r"codec version 2 is not 1"),
        (_foreign({**_FIXED, "extra": _tokens(1)}, _HEADER), r"tensors .*'extra'.* are not"),
        (
            _foreign({"generated": _tokens(2), "logprobs": torch.tensor([-1.0])}, _HEADER),
            r"are not",
        ),
        (
            _foreign({**_FIXED, "logprobs": torch.tensor([-1.0, -2.0])}, _HEADER),
            r"break the codec's rules",
        ),
    ],
    ids=[
        "too-short",
        "header-length",
        "no-metadata",
        "other-codec",
        "other-version",
        "extra-tensor",
        "missing-tensor",
        "invalid-contents",
    ],
)
def test_decode_of_foreign_bytes_raises_format_error(data, message):
    with pytest.raises(BlobFormatError, match=message):
        decode_delta(data, key="staging/cap/c1")


def test_decode_format_error_names_key_and_capture_key():
    with pytest.raises(BlobFormatError, match=r"key 'staging/cap/c1' \(capture key 'cap'\)"):
        decode_delta(b"garbage", key="staging/cap/c1")


def test_media_descriptor_survives_the_round_trip_field_for_field():
    delta = _delta(media=(_image(),))
    assert decode_delta(encode_delta(delta)).media[0].descriptor == MediaDescriptor(
        media_id="img-a",
        kind="image",
        height=2,
        width=2,
        frames=1,
        token_start=1,
        token_end=3,
        digest=media_digest(torch.arange(12, dtype=torch.float32).reshape(3, 2, 2)),
    )
