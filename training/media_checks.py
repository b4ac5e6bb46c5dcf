"""Media checks at finalization: a rollout's images must be what the trained model reads.

Before the projector records a trainable decision for a rollout with images, each image placed in
its rows is held to the model's rules (:class:`MediaRules`, from the model's configuration):

- the tokens at the image's span are exactly the model's image token, every one of them;
- the span's length is what its patch grid takes: ``frames * height * width / merge_size**2``
  placeholders (a grid that ``merge_size**2`` does not divide takes none, so never fits).

A rollout that breaks either rule would stop training when the model matches image features to
image tokens; instead its rollout is masked (:data:`MEDIA_MASK_REASON`) before it is recorded,
counted with the step's masked rollouts, and its siblings train. Each image is checked once, in
the row that owns it (every call's media is owned by exactly one row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch

from grove.training.errors import RowError
from grove.training.forest import MaskReason
from grove.training.rows import RowMedia, RowTensors

__all__ = ["MEDIA_MASK_REASON", "MediaRules", "check_row_media", "media_rules"]

MEDIA_MASK_REASON: Final = MaskReason.MEDIA_INVALID
"""The mask reason of a rollout whose images break the model's rules."""


@dataclass(frozen=True)
class MediaRules:
    """How the trained model reads an image: ``image_token_id``, the placeholder token of each
    image patch group, and ``merge_size``, the side of the patch square one placeholder covers
    (Qwen2-VL's ``vision_config.spatial_merge_size``)."""

    image_token_id: int
    merge_size: int

    def __post_init__(self) -> None:
        if self.image_token_id < 0 or self.merge_size < 1:
            raise ValueError(
                f"media rules need an image token id >= 0 and a merge size >= 1, got "
                f"{self.image_token_id} and {self.merge_size}"
            )

    def placeholders(self, frames: int, height: int, width: int) -> int | None:
        """The placeholder tokens a ``frames`` x ``height`` x ``width`` patch grid takes (None
        when ``merge_size**2`` does not divide its patches)."""
        patches, square = frames * height * width, self.merge_size**2
        return patches // square if patches % square == 0 else None


def media_rules(model_config: Any) -> MediaRules | None:
    """The media rules of a Qwen2-VL-style model configuration (``image_token_id`` and
    ``vision_config.spatial_merge_size``), or None for a model without an image token."""
    image_token_id = getattr(model_config, "image_token_id", None)
    if image_token_id is None:
        return None
    vision = getattr(model_config, "vision_config", None)
    merge_size = getattr(vision, "spatial_merge_size", None)
    if merge_size is None:
        raise ValueError(
            f"a model with image token {image_token_id} needs vision_config.spatial_merge_size "
            "to check its images' placeholders"
        )
    return MediaRules(int(image_token_id), int(merge_size))


def check_row_media(rows: Sequence[RowTensors], rules: MediaRules) -> None:
    """Hold each owned image of ``rows`` to ``rules`` (module docstring); a ``RowError`` that
    masks the rollout :data:`MEDIA_MASK_REASON` names the first image that breaks one."""
    for row in rows:
        for placed in row.media:
            if placed.owned:
                _check(row.token_ids, placed, rules)


def _check(token_ids: torch.Tensor, placed: RowMedia, rules: MediaRules) -> None:
    item = placed.item
    name = f"image {item.media_id!r}"
    expected = rules.placeholders(item.frames, item.height, item.width)
    length = placed.token_end - placed.token_start
    if length != expected:
        grid = f"{item.frames} x {item.height} x {item.width}"
        takes = (
            f"{expected} placeholders"
            if expected is not None
            else f"no whole number of placeholders (merge size {rules.merge_size})"
        )
        raise _media_invalid(
            "media_placeholder_count",
            placed,
            f"{name} spans {length} tokens, but its patch grid {grid} takes {takes}",
        )
    span = token_ids[placed.token_start : placed.token_end]
    others = (span != rules.image_token_id).nonzero()
    if others.numel():
        offset = int(others[0, 0])
        raise _media_invalid(
            "media_placeholder_token",
            placed,
            f"{name} holds token {int(span[offset])} at placeholder {offset} of its span "
            f"[{item.token_start}, {item.token_end}); every placeholder must be the model's "
            f"image token {rules.image_token_id}",
        )


def _media_invalid(rule: str, placed: RowMedia, detail: str) -> RowError:
    return RowError(rule, placed.call_id, detail, mask_reason=MEDIA_MASK_REASON)
