"""Logprobs of rows with images: a ``LogprobFunction`` that feeds each row's captured pixels.

A row carries the media of every call on its path, placed in row coordinates
(``training/rows.py``): the processor's output captured at generation time, never processed
again. For a Qwen2-VL-style model (``transformers`` ``Qwen2VLForConditionalGeneration`` and its
kin) each row runs as its own sequence with ``pixel_values`` (its images' patches concatenated in
row order), ``image_grid_thw`` (one ``(frames, height, width)`` patch grid per image) and
``mm_token_type_ids`` (1 on image placeholders), from which the model derives its multimodal
rotary positions exactly as at generation. A row without media runs on its token ids alone.

``excluded_token_ids`` are tokens the engine never samples (the embedded vision-language engine
never samples a vision token, ``capture/embedded_vlm.py``): their logits are masked before the
log-softmax, so the trainer's distribution is the engine's. Positions holding such a token (an
image's placeholders, never generated) get logprob 0.0 instead of ``-inf``; they are prompt
tokens and carry no loss.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from grove.training.errors import BatchError
from grove.training.rows import RowMedia
from grove.training.trainer import StepBatch

__all__ = ["MediaLogprobs"]


class MediaLogprobs:
    """A ``LogprobFunction`` (``training/trainer.py``) for vision-language models: each row
    with its images' ``pixel_values`` and ``image_grid_thw`` (``docs/media.md``)."""

    def __init__(self, *, image_token_id: int, excluded_token_ids: Sequence[int] = ()) -> None:
        self.image_token_id = image_token_id
        self.excluded_token_ids = tuple(sorted(set(excluded_token_ids)))

    def __call__(self, model: torch.nn.Module, batch: StepBatch, rows: slice) -> torch.Tensor:
        """Differentiable logprobs ``(r, T)`` of the rows ``rows`` of ``batch``: position ``t``
        holds log p(token_t | tokens_<t, images), position 0 holds 0.0."""
        token_ids = batch.token_ids[rows]  # (r, T)
        indices = range(batch.rows)[rows]
        media = [batch.media[i] if i < len(batch.media) else () for i in indices]
        return torch.cat(
            [
                self._row(model, ids[None], placed)
                for ids, placed in zip(token_ids, media, strict=True)
            ]
        )

    def _row(
        self, model: torch.nn.Module, token_ids: torch.Tensor, media: Sequence[RowMedia]
    ) -> torch.Tensor:
        """Logprobs ``(1, T)`` of one row ``token_ids`` ``(1, T)`` with its media."""
        inputs: dict[str, torch.Tensor] = {}
        if media:
            self._check_spans(token_ids[0], media)
            pixels = [placed.item.pixels for placed in media]
            if any(p is None for p in pixels):
                raise BatchError(
                    "media_pixels",
                    f"media {media[0].item.media_id!r} of call {media[0].call_id!r} reached the "
                    "trainer without pixels; rows of images need their captured pixels",
                )
            inputs["pixel_values"] = torch.cat(pixels)  # type: ignore[arg-type]
            inputs["image_grid_thw"] = torch.tensor(
                [[p.item.frames, p.item.height, p.item.width] for p in media]
            )  # (images, 3)
            inputs["mm_token_type_ids"] = (token_ids == self.image_token_id).int()  # (1, T)
        output = model(input_ids=token_ids, **inputs)
        logits = output.logits if hasattr(output, "logits") else output  # (1, T, V)
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
        if self.excluded_token_ids:
            logits = logits.clone()
            logits[..., list(self.excluded_token_ids)] = float("-inf")
        predicted = logits[:, :-1].log_softmax(dim=-1)  # (1, T-1, V)
        targets = token_ids[:, 1:]  # (1, T-1)
        logprobs = predicted.gather(-1, targets[..., None]).squeeze(-1)  # (1, T-1)
        if self.excluded_token_ids:
            excluded = torch.isin(targets, torch.tensor(self.excluded_token_ids))
            logprobs = torch.where(excluded, torch.zeros_like(logprobs), logprobs)
        return torch.nn.functional.pad(logprobs, (1, 0), value=0.0)  # (1, T)

    def _check_spans(self, token_ids: torch.Tensor, media: Sequence[RowMedia]) -> None:
        """Every placed image covers image tokens only, and the row holds no others."""
        covered = 0
        for placed in media:
            span = token_ids[placed.token_start : placed.token_end]
            if span.numel() == 0 or bool((span != self.image_token_id).any()):
                raise BatchError(
                    "media_span",
                    f"media {placed.item.media_id!r} of call {placed.call_id!r} spans "
                    f"[{placed.token_start}, {placed.token_end}) of its row, which must be "
                    f"image tokens ({self.image_token_id}) only",
                )
            covered += span.numel()
        total = int((token_ids == self.image_token_id).sum())
        if total != covered:
            raise BatchError(
                "media_span",
                f"the row holds {total} image tokens but its media cover {covered}",
            )
