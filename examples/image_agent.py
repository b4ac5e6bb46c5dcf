"""An agent that looks at images: a Grove harness on the official ``openai`` client.

``play(client, task, seed, **options)`` is a ``harness.target`` for a run of the embedded
vision-language model (``model.architecture: vlm``, ``docs/media.md``). A task carries its
question and its images, inline as data URLs (Grove fetches nothing)::

    {"prompt": "What is in the picture?", "images": ["data:image/png;base64,..."]}

The agent sends the question with every image (Chat ``image_url`` parts), then asks ``follow_ups``
more questions in the same conversation, re-sending the images byte for byte with the history, so
Grove continues the call (the retained images are verified, not stored again) and the rollout
trains as one row holding every image. ``task_images`` writes such a task's images in code.

The reward is verifiable from the answers alone: the mean, over the answers, of
``1 / (1 + characters)`` — the tiny model is asked to be brief.
"""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
from openai import OpenAI
from PIL import Image

from grove.client import CALL_ID_HEADER

__all__ = ["image_data_url", "image_message", "play"]

FOLLOW_UP = "Say it shorter."


def image_data_url(seed: int, height: int, width: int) -> str:
    """A noise image drawn from ``seed``, ``height`` x ``width`` RGB pixels, as a PNG data URL."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_message(text: str, images: list[str]) -> dict[str, Any]:
    """A user message: ``text`` and then each image as a Chat ``image_url`` part."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for url in images]
    return {"role": "user", "content": parts}


def play(
    client: OpenAI,
    task: dict[str, Any],
    seed: int,
    *,
    follow_ups: int = 1,
    max_tokens: int = 6,
) -> dict[str, Any]:
    """One rollout of ``task``: its question with its images, then ``follow_ups`` more questions
    in the same conversation; returns the harness result (``output``: the history, ``reward``)."""
    del seed  # sampling is seeded by the gateway; the agent itself draws nothing
    model = client.models.list().data[0].id
    history: list[dict[str, Any]] = [image_message(task["prompt"], list(task.get("images", [])))]
    returned = list(history)  # the history, each answer naming the response it came from
    answers: list[str] = []
    for turn in range(1 + follow_ups):
        if turn:
            question = {"role": "user", "content": FOLLOW_UP}
            history.append(question)
            returned.append(question)
        completion = client.chat.completions.create(
            model=model,
            messages=history,
            max_tokens=max_tokens,
            extra_headers={CALL_ID_HEADER: f"c{turn}"},
        )
        text = completion.choices[0].message.content or ""
        answers.append(text)
        answer = {"role": "assistant", "content": text}
        history.append(answer)
        returned.append({**answer, "response_id": completion.id})
    reward = sum(1.0 / (1 + len(text)) for text in answers) / len(answers)
    return {"output": returned, "reward": reward}
