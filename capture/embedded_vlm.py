"""The embedded vision-language model: a tiny Qwen2-VL, its image processor and chat template,
built offline in code.

For tests and examples of image capture (``docs/media.md``); nothing is downloaded. The tokenizer
is the embedded one (``capture/embedded.py``) plus Qwen2-VL's vision tokens (``<|vision_start|>``,
``<|vision_end|>``, ``<|image_pad|>``, ``<|video_pad|>``); the chat template is the embedded
ChatML template whose image parts render as ``<|vision_start|><|image_pad|><|vision_end|>``; the
image processor is transformers' Qwen2-VL processor (14-pixel patches, 2x2 merge, at most
``max_pixels``); the model is a ``Qwen2VLForConditionalGeneration`` with a one-block vision tower
and random weights drawn from a fixed seed.

Sampling is at temperature 1 from the raw logits, as the text engine samples, with one departure:
the vision tokens are never sampled. A generated image token would be read as a placeholder when
the row is trained (and its image would be missing), so both this engine and the trainer
(``training/media_logprobs.py``) take the distribution over the other tokens: the recorded logprob
is the log-softmax of the logits with the vision tokens masked, exactly what the trainer
recomputes. Positions are Qwen2-VL's multimodal rotary positions (``get_rope_index``), computed
from the prompt's image grids and passed explicitly, so no state is kept on the model between
calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, cast

import torch
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)
from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from grove.capture.embedded import EmbeddedEngine, build_tokenizer, chat_template, sample_token
from grove.capture.engine import FinishReason, Generation, SamplingParams
from grove.capture.errors import InvalidPromptError, PromptTooLongError, UnsupportedSamplingError
from grove.capture.media import ImageInput, MediaRenderer, VisionProcessor
from grove.capture.tiny_decoder import seeded, tiny_decoder_config

__all__ = [
    "EMBEDDED_VLM_NAME",
    "IMAGE_TOKEN",
    "VISION_TOKENS",
    "VLM_TEMPLATE",
    "EmbeddedVLMEngine",
    "build_image_processor",
    "build_vlm_config",
    "build_vlm_model",
    "build_vlm_renderer",
    "build_vlm_tokenizer",
    "vision_token_ids",
]

EMBEDDED_VLM_NAME: Final = "grove/embedded-tiny-vl"
VISION_START: Final = "<|vision_start|>"
VISION_END: Final = "<|vision_end|>"
IMAGE_TOKEN: Final = "<|image_pad|>"
VIDEO_TOKEN: Final = "<|video_pad|>"
VISION_TOKENS: Final = (VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN)
MAX_PIXELS: Final = 112 * 112
"""The image processor's pixel budget: at most 8 x 8 patches, 16 placeholder tokens an image."""
MIN_PIXELS: Final = 28 * 28

_TEXT_PARTS: Final = "{%- if part.text is defined %}{{- part.text }}{%- endif %}"
_IMAGE_AND_TEXT_PARTS: Final = (
    "{%- if part.type in ['image_url', 'input_image', 'image'] %}"
    f"{{{{- '{VISION_START}{IMAGE_TOKEN}{VISION_END}' }}}}"
    "{%- elif part.text is defined %}{{- part.text }}{%- endif %}"
)
VLM_TEMPLATE: Final = chat_template().replace(_TEXT_PARTS, _IMAGE_AND_TEXT_PARTS)
"""The embedded ChatML template, with one image token between vision markers per image part."""


def build_vlm_tokenizer() -> PreTrainedTokenizerFast:
    """The embedded tokenizer with the vision tokens added (special) and :data:`VLM_TEMPLATE`."""
    tokenizer = build_tokenizer(template=VLM_TEMPLATE)
    tokenizer.add_tokens(list(VISION_TOKENS), special_tokens=True)
    return tokenizer


def vision_token_ids(tokenizer: PreTrainedTokenizerFast) -> dict[str, int]:
    """The ids of the vision tokens in ``tokenizer``, by token text."""
    # one token converts to one id (transformers types it int | list[int])
    return {
        token: int(cast(int, tokenizer.convert_tokens_to_ids(token))) for token in VISION_TOKENS
    }


def build_image_processor(
    *, min_pixels: int = MIN_PIXELS, max_pixels: int = MAX_PIXELS
) -> Qwen2VLImageProcessorPil:
    """Transformers' Qwen2-VL image processor (PIL backend), sized for the tiny model."""
    return Qwen2VLImageProcessorPil(
        min_pixels=min_pixels,
        max_pixels=max_pixels,
        patch_size=14,
        temporal_patch_size=2,
        merge_size=2,
    )


def build_vlm_renderer(
    tokenizer: PreTrainedTokenizerFast, image_processor: Any | None = None
) -> MediaRenderer:
    """A renderer that expands each image into its placeholders (``capture/media.py``)."""
    vision = VisionProcessor(
        image_processor or build_image_processor(),
        image_token=IMAGE_TOKEN,
        image_token_id=vision_token_ids(tokenizer)[IMAGE_TOKEN],
    )
    return MediaRenderer(tokenizer, vision)


def build_vlm_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    context_length: int = 2048,
) -> Qwen2VLForConditionalGeneration:
    """A tiny Qwen2-VL for ``tokenizer`` (:func:`build_vlm_config`) with random weights from
    ``seed``; the global torch random state is left as it was."""
    config = build_vlm_config(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, context_length=context_length
    )
    return seeded(seed, lambda: Qwen2VLForConditionalGeneration(config))


def build_vlm_config(
    tokenizer: PreTrainedTokenizerFast,
    *,
    hidden_size: int = 64,
    num_layers: int = 2,
    context_length: int = 2048,
) -> Qwen2VLConfig:
    """The configuration of the tiny Qwen2-VL for ``tokenizer``, built without weights: its
    vision token ids, and a one-block vision tower with 14-pixel patches and a 2 x 2 merge."""
    ids = vision_token_ids(tokenizer)
    head_dim = hidden_size // 4
    half = head_dim // 2  # M-RoPE splits the rotary half into temporal, height, width sections
    sections = [half - 2 * (half // 3), half // 3, half // 3]
    return Qwen2VLConfig(
        text_config={
            **tiny_decoder_config(
                tokenizer,
                hidden_size=hidden_size,
                num_layers=num_layers,
                context_length=context_length,
            ),
            "rope_scaling": {"type": "mrope", "mrope_section": sections},
            "bos_token_id": None,
        },
        vision_config={
            "depth": 1,
            "embed_dim": 32,
            "hidden_size": hidden_size,
            "num_heads": 2,
            "mlp_ratio": 2,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids[VIDEO_TOKEN],
        vision_start_token_id=ids[VISION_START],
        vision_end_token_id=ids[VISION_END],
        # the config takes other keys at run time; its signature names only its own
        bos_token_id=None,  # type: ignore[call-arg]
        tie_word_embeddings=True,
    )


class EmbeddedVLMEngine(EmbeddedEngine):
    """The embedded engine over a tiny Qwen2-VL: generates from exact prompt tokens and the
    prompt's images (``grove.capture.media.ImageInput``, in prompt order), never sampling a vision
    token (see the module). Deterministic and serialized like :class:`EmbeddedEngine`."""

    name = "embedded-vl"

    def __init__(
        self,
        model: Qwen2VLForConditionalGeneration,
        *,
        stop_token_ids: Sequence[int],
        excluded_token_ids: Sequence[int],
        seed: int = 0,
        policy_version: int = 0,
        tokenizer: PreTrainedTokenizerFast | None = None,
    ) -> None:
        super().__init__(
            model,
            stop_token_ids=stop_token_ids,
            seed=seed,
            policy_version=policy_version,
            tokenizer=tokenizer,
        )
        self.excluded_token_ids = tuple(sorted(set(excluded_token_ids)))
        self.image_token_id = int(model.config.image_token_id)
        vision = model.config.vision_config
        assert isinstance(vision, Qwen2VLVisionConfig)  # the config builds it from its dict
        self.merge_size = int(vision.spatial_merge_size)

    @classmethod
    def build(
        cls, tokenizer: PreTrainedTokenizerFast, *, seed: int = 0, model_seed: int = 0
    ) -> EmbeddedVLMEngine:
        """An engine over :func:`build_vlm_model` for ``tokenizer``, stopping at end of turn."""
        return cls(
            build_vlm_model(tokenizer, seed=model_seed),
            stop_token_ids=[tokenizer.eos_token_id],
            excluded_token_ids=list(vision_token_ids(tokenizer).values()),
            seed=seed,
            tokenizer=tokenizer,
        )

    def check(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        media: Sequence[ImageInput] = (),
    ) -> None:
        """Raise the refusal ``generate`` would give: the text engine's rules, and one image
        per run of placeholders, each run as long as its image's grid asks."""
        text = self.model.config.text_config
        for name, got, supported in (
            ("temperature", sampling.temperature, 1.0),
            ("top_p", sampling.top_p, 1.0),
            ("top_k", sampling.top_k, 0),
        ):
            if got != supported:
                raise UnsupportedSamplingError(self.name, name, got, supported)
        if not prompt_token_ids:
            raise InvalidPromptError("a prompt has at least one token", list(prompt_token_ids))
        outside = sorted({t for t in prompt_token_ids if not 0 <= t < text.vocab_size})
        if outside:
            raise InvalidPromptError(f"token ids must lie in [0, {text.vocab_size})", outside[:10])
        placeholders = sum(1 for t in prompt_token_ids if t == self.image_token_id)
        needed = sum(
            image.grid[0] * image.grid[1] * image.grid[2] // self.merge_size**2 for image in media
        )
        if placeholders != needed:
            raise InvalidPromptError(
                f"the prompt's image tokens must match its {len(media)} images' {needed} "
                "placeholders",
                placeholders,
            )
        if len(prompt_token_ids) + sampling.max_tokens > text.max_position_embeddings:
            raise PromptTooLongError(
                len(prompt_token_ids), sampling.max_tokens, text.max_position_embeddings
            )
        if sampling.constraint is not None:
            super().check(prompt_token_ids, sampling)

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        media: Sequence[ImageInput] = (),
    ) -> Generation:
        """Sample up to ``max_tokens`` tokens after the prompt and its images."""
        self.check(prompt_token_ids, sampling, media)
        stops = self.stop_token_ids | set(sampling.stop_token_ids)
        with self._lock, torch.inference_mode():
            version = self.policy_version
            generator = (
                self._generator
                if sampling.seed is None
                else torch.Generator().manual_seed(sampling.seed)
            )
            mask = (
                None if sampling.constraint is None else self._mask(sampling.constraint, sampling)
            )
            inputs = torch.tensor([list(prompt_token_ids)], dtype=torch.long)  # (1, T)
            positions, delta = self._positions(inputs, media)  # (3, 1, T), (1, 1)
            extra: dict[str, Any] = {}
            if media:
                extra["pixel_values"] = torch.cat([image.pixels for image in media])
                extra["image_grid_thw"] = torch.tensor([list(image.grid) for image in media])
            excluded = torch.tensor(self.excluded_token_ids, dtype=torch.long)
            tokens: list[int] = []
            logprobs: list[float] = []
            finish: FinishReason = "length"
            cache = None
            for step in range(sampling.max_tokens):
                out = self.model(
                    input_ids=inputs,
                    position_ids=positions,
                    cache=cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **extra,
                )
                cache = out.cache
                logits = out.logits[0, -1].float()  # (V,)
                logits[excluded] = float("-inf")  # the vision tokens are never sampled
                token, logprob = sample_token(logits, mask, generator)
                tokens.append(token)
                logprobs.append(logprob)
                if token in stops:
                    finish = "stop"
                    break
                inputs = torch.tensor([[token]], dtype=torch.long)  # (1, 1)
                at = len(prompt_token_ids) + step
                positions = (torch.tensor([[at]]) + delta).expand(3, 1, 1)  # (3, 1, 1)
                extra = {}
        return Generation(
            token_ids=tuple(tokens),
            logprobs=tuple(logprobs),
            finish_reason=finish,
            policy_version=version,
        )

    def _positions(
        self, inputs: torch.Tensor, media: Sequence[ImageInput]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Multimodal rotary positions ``(3, 1, T)`` of the prompt and the offset ``(1, 1)``
        of the positions after it (0 without images)."""
        if not media:
            length = inputs.shape[1]
            return torch.arange(length).view(1, 1, -1).expand(3, 1, -1), torch.zeros(
                1, 1, dtype=torch.long
            )
        grid = torch.tensor([list(image.grid) for image in media])
        token_types = (inputs == self.image_token_id).int()
        positions, delta = self.model.model.get_rope_index(inputs, token_types, image_grid_thw=grid)
        return positions, delta
