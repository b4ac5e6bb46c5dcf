"""Images in model calls: read from content parts, processed, rendered as placeholder tokens,
captured with the call's delta, and verified when a continuation retains them.

The rules (``docs/media.md``):

- An image is a content part of a user (or system, tool) message: Chat ``{"type": "image_url",
  "image_url": {"url": DATA_URL}}`` or Responses ``{"type": "input_image", "image_url":
  DATA_URL}``, the image inline as a ``data:image/...;base64,`` URL (Grove fetches nothing).
- The renderer (:class:`MediaRenderer`) processes every image of a request with the model's image
  processor, renders the messages with the chat template (one image token per image, as the
  template writes it), then expands the ``k``-th image token into the ``n_k`` placeholder tokens
  the processor asks for — what a Qwen2-VL-style processor does. Everything downstream (the
  splice, admission, the boundary check) sees the expanded text, so a continuation's parent
  chain holds its retained images' placeholders exactly.
- :func:`plan_media` then decides what the call stores. A root stores every image of its
  request; a continuation stores only the images of its new messages, spans in its prompt
  delta. Before that, each image the request retains from the call it continues (the images of
  the matched prefix) is verified against what the parent chain captured — pixel digest, patch
  grid, and the placeholder token ids at its span — and a mismatch is refused with
  ``RetainedMediaMismatchError`` (409) before anything is recorded, naming the message and the
  image. A candidate the splice roots is verified the same way: a changed image never hides
  behind a new root.
- The engine receives every image of the prompt in prompt order (:class:`ImageInput`).

An image comes only from the bytes of its data URL (:func:`decode_data_url`): the text after
``base64,`` is decoded strictly (the base64 alphabet and padding, nothing else) and the bytes are
opened as an image in memory. It is never a path, a file name or a web address: Grove opens no
file and fetches nothing for a client (``docs/security.md``, "Images"). Before decoding, the
decoded size is bounded (``GatewayLimits.max_image_bytes``, worked out from the base64 length);
before the pixels are decoded, the width and height read from the image's header are bounded
(``GatewayLimits.max_image_pixels``), so a small file that would decode to a huge image is
refused without decoding it.

Descriptors (``storage.MediaDescriptor``) record an image's geometry as the processor's patch
grid: ``frames`` x ``height`` x ``width`` patches (Qwen2-VL's ``image_grid_thw``), which is what a
trainer feeds back with the pixels.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import numpy as np
import torch
from PIL import Image, ImageOps
from transformers import PreTrainedTokenizerBase

from grove.capture.errors import (
    ImagesNotSupportedError,
    InvalidImageError,
    RenderError,
    RetainedMediaMismatchError,
    SpliceError,
)
from grove.capture.limits import GatewayLimits
from grove.capture.render import Renderer, RenderOptions
from grove.capture.splice import PromptPlan
from grove.capture.template_tokens import TemplateTokenError, expand_template_token
from grove.storage import MediaDescriptor, MediaTensor, describe_media, media_digest

__all__ = [
    "IMAGE_PART_TYPES",
    "ImageInput",
    "ImageRef",
    "MediaPlan",
    "MediaRenderer",
    "ProcessedImage",
    "VisionProcessor",
    "chain_media",
    "decode_data_url",
    "plan_media",
    "request_images",
]

IMAGE_PART_TYPES: Final = frozenset({"image_url", "input_image"})
"""Content part types that carry an image (Chat Completions, Responses)."""
DEFAULT_CACHED_IMAGES: Final = 256


@dataclass(frozen=True)
class ImageRef:
    """One image of a request: image ``image_index`` (0-based, counted in its message) of
    message ``message_index`` of the normalized request, and its data URL."""

    message_index: int
    image_index: int
    url: str

    @property
    def media_id(self) -> str:
        """The image's id in its call's blob: ``message-{m}/image-{i}`` of its request."""
        return f"message-{self.message_index}/image-{self.image_index}"


@dataclass(frozen=True, eq=False)
class ProcessedImage:
    """The processor's output for one image. ``pixels`` float ``(patches, patch_dim)``;
    ``grid`` ``(frames, height, width)`` in patches; ``placeholder_tokens`` the image tokens the
    prompt holds for it; ``digest`` the ``grove.media.v1`` digest of ``pixels``."""

    pixels: torch.Tensor
    grid: tuple[int, int, int]
    placeholder_tokens: int
    digest: str


@dataclass(frozen=True, eq=False)
class ImageInput:
    """One image as the engine takes it (producer: :func:`plan_media`; consumer: a vision
    engine): processed pixels and patch grid, in prompt order, and the data URL it came from
    (for an engine that processes images itself, ``capture/vllm_vlm.py``)."""

    pixels: torch.Tensor
    grid: tuple[int, int, int]
    url: str = ""


@dataclass(frozen=True, eq=False)
class MediaPlan:
    """What a call with images stores and generates from.

    ``stored``: the media of the call's prompt delta (spans in delta coordinates), for its blob;
    ``inputs``: every image of its prompt, in prompt order, for the engine.
    """

    stored: tuple[MediaTensor, ...] = ()
    inputs: tuple[ImageInput, ...] = ()


def request_images(messages: Sequence[Mapping[str, Any]]) -> list[ImageRef]:
    """The image parts of normalized ``messages``, in order; a malformed part is refused."""
    found = []
    for message_index, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        image_index = 0
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") not in IMAGE_PART_TYPES:
                continue
            url = part.get("image_url")
            if isinstance(url, Mapping):
                url = url.get("url")
            if not isinstance(url, str):
                raise InvalidImageError(
                    message_index, image_index, "an image part needs an image URL string", part
                )
            found.append(ImageRef(message_index, image_index, url))
            image_index += 1
    return found


class VisionProcessor:
    """A Qwen2-VL-style image processor and the tokens its images take in a prompt.

    ``image_processor`` maps a list of PIL images to ``pixel_values`` ``(patches, patch_dim)``
    and ``image_grid_thw`` ``(images, 3)``; an image takes ``t * h * w / merge_size**2``
    ``image_token`` placeholders. Processed images are kept by the sha256 of their URL (a
    continuation re-sends its retained images), up to ``cached_images``. ``limits`` bound each
    image's decoded bytes and pixels (the gateway sets its own). Thread-safe.
    """

    def __init__(
        self,
        image_processor: Any,
        *,
        image_token: str,
        image_token_id: int,
        cached_images: int = DEFAULT_CACHED_IMAGES,
        limits: GatewayLimits | None = None,
    ) -> None:
        self.image_processor = image_processor
        self.limits = limits or GatewayLimits()
        self.image_token = image_token
        self.image_token_id = image_token_id
        self.merge_size = int(image_processor.merge_size)
        self.cached_images = cached_images
        self._cache: OrderedDict[str, ProcessedImage] = OrderedDict()
        self._lock = threading.Lock()

    def process(self, ref: ImageRef) -> ProcessedImage:
        """The processed image of ``ref`` (from the cache when its URL was processed before)."""
        key = hashlib.sha256(ref.url.encode()).hexdigest()
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                return cached
        processed = self._process(ref)
        with self._lock:
            self._cache[key] = processed
            while len(self._cache) > self.cached_images:
                self._cache.popitem(last=False)
        return processed

    def _process(self, ref: ImageRef) -> ProcessedImage:
        image = decode_data_url(ref, self.limits)
        try:
            out = self.image_processor(images=[image], return_tensors="np")
        except (ValueError, TypeError) as exc:
            raise InvalidImageError(
                ref.message_index, ref.image_index, f"the image processor refused it ({exc})", ""
            ) from None
        pixels = torch.from_numpy(np.ascontiguousarray(out["pixel_values"], dtype=np.float32))
        t, h, w = (int(v) for v in np.asarray(out["image_grid_thw"]).reshape(-1, 3)[0])
        return ProcessedImage(
            pixels=pixels,
            grid=(t, h, w),
            placeholder_tokens=t * h * w // self.merge_size**2,
            digest=media_digest(pixels),
        )


class MediaRenderer(Renderer):
    """A :class:`grove.capture.render.Renderer` whose renderings carry each image's placeholders.

    The chat template writes one ``image_token`` per image part; :meth:`render` expands the
    ``k``-th into the placeholders of the ``k``-th image of the messages. Text that already
    holds the image token is refused (a placeholder count could not be trusted).
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vision: VisionProcessor) -> None:
        super().__init__(tokenizer)
        self.vision = vision

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RenderOptions,
        *,
        add_generation_prompt: bool | None = None,
    ) -> str:
        """The template's text with each image token the template wrote expanded into the
        image's placeholder tokens; an image token's text inside message text stays text
        (``docs/security.md``, "Text stays text")."""
        text = super().render(messages, options, add_generation_prompt=add_generation_prompt)
        images = [self.vision.process(ref) for ref in request_images(messages)]
        counts = [image.placeholder_tokens for image in images]
        try:
            return expand_template_token(text, self.vision.image_token, counts)
        except TemplateTokenError as exc:
            raise RenderError(
                options.model, f"{exc}: the chat template writes exactly one per image part"
            ) from None


def chain_media(
    parent: Sequence[MediaDescriptor], call_media: Sequence[MediaDescriptor], prev_len: int
) -> tuple[MediaDescriptor, ...]:
    """A call's chain media: its parent chain's, then its own moved from its prompt delta
    (which starts at ``prev_len`` in the chain) to chain coordinates."""
    moved = (
        replace(d, token_start=d.token_start + prev_len, token_end=d.token_end + prev_len)
        for d in call_media
    )
    return (*parent, *moved)


def plan_media(
    renderer: Renderer,
    messages: Sequence[Mapping[str, Any]],
    plan: PromptPlan,
    candidate_media: Sequence[MediaDescriptor] | None,
    candidate_tokens: Sequence[int] | None,
    *,
    capture_key: str,
    model: str,
) -> MediaPlan:
    """The media a planned call stores and generates from; refusals before anything is written.

    ``candidate_media`` and ``candidate_tokens`` are the chain media (chain coordinates) and
    exact chain tokens of the call admission chose as parent (``plan.decision
    .candidate_call_id``), when it chose one — whether the splice continued it or rooted it.
    ``model`` is the served model's name, for the refusal of images by a text-only renderer.
    """
    refs = request_images(messages)
    if not refs:
        return MediaPlan()
    if not isinstance(renderer, MediaRenderer):
        raise ImagesNotSupportedError(model, refs[0].message_index)
    vision = renderer.vision
    images = [vision.process(ref) for ref in refs]
    decision = plan.decision
    prefix_items = decision.boundary.prefix_item_count
    retained = sum(1 for ref in refs if ref.message_index < prefix_items)
    candidate = decision.candidate_call_id
    if candidate is not None and candidate_media is not None and candidate_tokens is not None:
        _verify_retained(
            vision,
            refs[:retained],
            images[:retained],
            candidate_media,
            candidate_tokens,
            capture_key=capture_key,
            parent_call_id=candidate,
        )
    first_new = retained if plan.prev_len > 0 else 0
    delta = plan.delta_token_ids
    spans = _placeholder_spans(vision, delta, images[first_new:], plan, refs[first_new:])
    stored = tuple(
        describe_media(
            media_id=ref.media_id,
            kind="image",
            pixels=image.pixels,
            frames=image.grid[0],
            height=image.grid[1],
            width=image.grid[2],
            token_span=span,
        )
        for ref, image, span in zip(refs[first_new:], images[first_new:], spans, strict=True)
    )
    inputs = tuple(
        ImageInput(image.pixels, image.grid, ref.url)
        for ref, image in zip(refs, images, strict=True)
    )
    return MediaPlan(stored=stored, inputs=inputs)


def _verify_retained(
    vision: VisionProcessor,
    refs: Sequence[ImageRef],
    images: Sequence[ProcessedImage],
    captured: Sequence[MediaDescriptor],
    chain_tokens: Sequence[int],
    *,
    capture_key: str,
    parent_call_id: str,
) -> None:
    """Each retained image equals the chain's image at its position: digest, grid, and the
    placeholder token ids at the chain's span."""

    def mismatch(ref: ImageRef, field: str, got: object, expected: object) -> Exception:
        return RetainedMediaMismatchError(
            capture_key,
            parent_call_id,
            ref.message_index,
            ref.image_index,
            field,
            got,
            expected,
        )

    if len(refs) != len(captured):
        # The first retained image the chain does not hold, else the last one retained.
        ref = refs[len(captured)] if len(refs) > len(captured) else (refs[-1] if refs else None)
        raise RetainedMediaMismatchError(
            capture_key,
            parent_call_id,
            -1 if ref is None else ref.message_index,
            -1 if ref is None else ref.image_index,
            "retained image count",
            len(refs),
            len(captured),
        )
    for ref, image, descriptor in zip(refs, images, captured, strict=True):
        grid = (descriptor.frames, descriptor.height, descriptor.width)
        if image.grid != grid:
            raise mismatch(ref, "patch grid (frames, height, width)", image.grid, grid)
        if image.digest != descriptor.digest:
            raise mismatch(ref, "pixel digest", image.digest, descriptor.digest)
        span = list(chain_tokens[descriptor.token_start : descriptor.token_end])
        expected = [vision.image_token_id] * image.placeholder_tokens
        if span != expected:
            raise mismatch(
                ref,
                f"placeholder tokens at chain span [{descriptor.token_start}, "
                f"{descriptor.token_end})",
                f"{image.placeholder_tokens} x token {vision.image_token_id}",
                span[:8] + (["..."] if len(span) > 8 else []),
            )


def _placeholder_spans(
    vision: VisionProcessor,
    tokens: Sequence[int],
    images: Sequence[ProcessedImage],
    plan: PromptPlan,
    refs: Sequence[ImageRef],
) -> list[tuple[int, int]]:
    """The span of each image's placeholders in ``tokens`` (the call's prompt delta), in order:
    the ``k``-th image takes the next ``n_k`` image tokens, which must be consecutive."""
    positions = [i for i, token in enumerate(tokens) if token == vision.image_token_id]
    needed = sum(image.placeholder_tokens for image in images)
    if len(positions) != needed:
        raise SpliceError(
            f"the call's new prompt tokens hold {len(positions)} image tokens, its "
            f"{len(images)} new images need {needed} ({plan.decision.kind.value})",
            plan.decision.parent_call_id,
        )
    spans = []
    cursor = 0
    for ref, image in zip(refs, images, strict=True):
        start = positions[cursor]
        end = start + image.placeholder_tokens
        if positions[cursor : cursor + image.placeholder_tokens] != list(range(start, end)):
            raise SpliceError(
                f"the placeholders of image {ref.image_index} of message {ref.message_index} "
                "are not consecutive tokens",
                plan.decision.parent_call_id,
            )
        spans.append((start, end))
        cursor += image.placeholder_tokens
    return spans


def decode_data_url(ref: ImageRef, limits: GatewayLimits) -> Image.Image:
    """The RGB image of an inline ``data:image/...;base64,`` URL, from its decoded bytes only
    (module docstring); anything else (a web address, a path, text that is not strict base64,
    bytes that are no image, an image over ``limits``) is refused without echoing it."""
    url = ref.url
    head, comma, body = url.partition(",")
    if not (url.startswith("data:image/") and comma and head.endswith(";base64")):
        scheme = url.split(":", 1)[0][:16] if ":" in url else "no scheme"
        raise InvalidImageError(
            ref.message_index,
            ref.image_index,
            "only inline data:image/...;base64, URLs are accepted (Grove opens no file and "
            "fetches nothing)",
            f"a URL with {scheme!r}",
        )
    decoded_size = len(body) // 4 * 3
    if decoded_size > limits.max_image_bytes:
        raise _too_large(ref, f"{decoded_size} bytes", f"{limits.max_image_bytes} bytes", "bytes")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidImageError(
            ref.message_index, ref.image_index, f"the data is not strict base64 ({exc})", head
        ) from None
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
        width, height = image.size
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _unreadable(ref, head, exc) from None
    if width * height > limits.max_image_pixels:
        shown = f"{width} x {height} = {width * height} pixels"
        raise _too_large(ref, shown, f"{limits.max_image_pixels} pixels", "pixels")
    try:
        image.load()
        return ImageOps.exif_transpose(image).convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise _unreadable(ref, head, exc) from None


def _unreadable(ref: ImageRef, head: str, exc: Exception) -> InvalidImageError:
    return InvalidImageError(
        ref.message_index,
        ref.image_index,
        f"the bytes are not a readable image ({type(exc).__name__})",
        head,
    )


def _too_large(ref: ImageRef, found: str, limit: str, what: str) -> InvalidImageError:
    return InvalidImageError(
        ref.message_index,
        ref.image_index,
        f"the image holds {found}, over the gateway's limit of {limit} (raise "
        f"gateway.limits.max_image_{what} to allow more)",
        "an image too large",
    )
