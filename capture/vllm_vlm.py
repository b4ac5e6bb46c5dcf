"""The vLLM engine for a vision-language model: exact prompt token ids plus the prompt's images.

vLLM's ``/v1/completions`` takes token ids but no images, so a call with images goes to vLLM's
token-in endpoint ``POST /inference/v1/generate`` (vLLM 0.32, registered by ``--enable-scale-out``;
``vllm/entrypoints/scale_out/token_in_token_out/``), with the images as ``content_parts``
(``{"type": "image_url", "url": DATA_URL}``, the data URLs the call was rendered from). The server
processes each image itself and expands the prompt's image token into that image's placeholders,
so the prompt is sent with each run of placeholders collapsed to one image token; the server
echoes the prompt it expanded, which is checked equal to Grove's (same patch grids, same
placeholder spans) before the generation is taken. Calls without images take the same endpoint
with no content parts.

Like the embedded vision engine (``capture/embedded_vlm.py``), the vision tokens are never
sampled: they get a logit bias of -100, and the server must run ``--logprobs-mode
processed_logprobs`` so that the returned logprobs are those of the biased distribution the token
was drawn from (``docs/media.md``, "vLLM").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from grove.capture.engine import Generation, SamplingParams
from grove.capture.errors import InvalidPromptError, UnsupportedSamplingError
from grove.capture.media import ImageInput
from grove.capture.vllm import (
    EngineResponseError,
    LogprobsMode,
    VllmEngine,
    checked_finish,
    only_choice,
)

__all__ = ["GENERATE_PATH", "VISION_LOGIT_BIAS", "VllmVLMEngine"]

GENERATE_PATH: Final = "/inference/v1/generate"
VISION_LOGIT_BIAS: Final = -100.0
"""The bias that keeps vision tokens from being sampled (vLLM's logit bias, applied before its
processed logprobs)."""


class VllmVLMEngine(VllmEngine):
    """A :class:`grove.capture.vllm.VllmEngine` that also takes the prompt's images (``media``, in
    prompt order, as :func:`grove.capture.media.plan_media` gives them). ``image_token_id`` is the
    model's image placeholder token; ``vision_token_ids`` the tokens never sampled; ``merge_size``
    the processor's patch merge (placeholders per image: ``t * h * w / merge_size**2``)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float,
        image_token_id: int,
        vision_token_ids: Sequence[int],
        merge_size: int = 2,
        api_key: str | None = None,
        logprobs_mode: LogprobsMode = "processed_logprobs",
    ) -> None:
        super().__init__(
            base_url, model, timeout_s=timeout_s, api_key=api_key, logprobs_mode=logprobs_mode
        )
        self.image_token_id = image_token_id
        self.vision_token_ids = tuple(sorted(set(vision_token_ids)))
        self.merge_size = merge_size

    def check(
        self, prompt: Sequence[int], sampling: SamplingParams, media: Sequence[ImageInput] = ()
    ) -> None:
        """Raise the refusal ``generate`` would give: the text engine's rules, processed
        logprobs, and one image (with its data URL) per run of placeholders of its grid's size."""
        if self.logprobs_mode != "processed_logprobs":
            raise UnsupportedSamplingError(
                f"{self.name} (server --logprobs-mode {self.logprobs_mode})",
                "logprobs_mode",
                self.logprobs_mode,
                "processed_logprobs",
            )
        super().check(prompt, sampling)
        runs = _placeholder_runs(prompt, self.image_token_id)
        wanted = [i.grid[0] * i.grid[1] * i.grid[2] // self.merge_size**2 for i in media]
        if runs != wanted:
            raise InvalidPromptError(
                f"the prompt's image token runs must match its {len(media)} images' "
                f"placeholders {wanted}",
                runs,
            )
        if any(not image.url for image in media):
            raise InvalidPromptError("every image sent to vLLM needs its data URL", len(media))

    def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingParams,
        media: Sequence[ImageInput] = (),
    ) -> Generation:
        """Sample one generation after the prompt and its images on the server."""
        prompt = list(prompt_token_ids)
        self.check(prompt, sampling, media)
        request = self._generate_request(prompt, sampling, media)
        with self._generating() as version:
            body = self._post(GENERATE_PATH, request, prompt, sampling)
        return replace(self._tokens_generation(body, prompt, sampling), policy_version=version)

    def _generate_request(
        self, prompt: list[int], sampling: SamplingParams, media: Sequence[ImageInput]
    ) -> dict[str, Any]:
        completion = self._request(prompt, sampling)
        params = {
            key: completion[key]
            for key in (
                "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                "presence_penalty", "frequency_penalty", "seed", "stop_token_ids", "n",
            )
        }  # fmt: skip
        params["logprobs"] = 0
        params["logit_bias"] = {str(t): VISION_LOGIT_BIAS for t in self.vision_token_ids}
        if "structured_outputs" in completion:
            params["structured_outputs"] = completion["structured_outputs"]
        return {
            "model": self.model,
            "token_ids": _collapse(prompt, self.image_token_id),
            "content_parts": [{"type": "image_url", "url": image.url} for image in media],
            "sampling_params": params,
            "return_token_ids": True,
            "stream": False,
        }

    def _tokens_generation(
        self, body: Any, prompt: list[int], sampling: SamplingParams
    ) -> Generation:
        url = self._url(GENERATE_PATH)
        echoed = body.get("prompt_token_ids") if isinstance(body, dict) else None
        if echoed != prompt:
            raise EngineResponseError(
                url,
                f"the prompt the server expanded equals Grove's {len(prompt)} tokens (same image "
                "grids and placeholders)",
                echoed if not isinstance(echoed, list) else echoed[:40],
            )
        choice = only_choice(url, body, "a generation")
        token_ids = choice.get("token_ids")
        content = (choice.get("logprobs") or {}).get("content")
        if not isinstance(token_ids, list) or not token_ids or not isinstance(content, list):
            raise EngineResponseError(url, "token_ids and logprobs.content are returned", choice)
        if [entry.get("token_id") for entry in content] != token_ids:
            raise EngineResponseError(url, "logprobs.content names token_ids in order", content)
        return Generation(
            token_ids=tuple(int(t) for t in token_ids),
            logprobs=tuple(float(entry["logprob"]) for entry in content),
            finish_reason=checked_finish(url, choice, sampling, len(token_ids)),
        )


def _placeholder_runs(prompt: Sequence[int], token: int) -> list[int]:
    """The lengths of the runs of ``token`` in ``prompt``, in order."""
    runs: list[int] = []
    previous = None
    for t in prompt:
        if t == token:
            if previous == token:
                runs[-1] += 1
            else:
                runs.append(1)
        previous = t
    return runs


def _collapse(prompt: Sequence[int], token: int) -> list[int]:
    """``prompt`` with each run of ``token`` collapsed to one (vLLM expands it again)."""
    return [t for i, t in enumerate(prompt) if t != token or i == 0 or prompt[i - 1] != token]
