"""A multi-turn agent with recency compaction: a Grove harness on the official ``openai`` client.

``play(client, task, seed, **options)`` is the harness ``grove train`` calls once per rollout
(``grove/demo/demo.yaml``: ``harness.target: examples.recency_agent:play``). The agent keeps its
whole semantic history but sends the model only the task and the last ``keep_rounds`` rounds (an
assistant answer and its observation); when older rounds are dropped, the task message says so.
That rewrite starts a new root in the capture graph, so a rollout of ``turns`` calls becomes more
than one training row. It rejects some answers (empty ones, and a seeded fraction of the rest)
with ``grove.client.reject`` and samples again; rejected answers never enter its history. When
it is done it returns its ordinary result — the returned history and the verifier's reward — and
Grove selects the accepted calls from it.

The toy task: answer in plain lowercase words. The reward is the fraction of characters in the
accepted answers that are lowercase ASCII letters or spaces, something a tiny random model can
learn within a few GRPO steps on a CPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from openai import OpenAI

from grove.client import CALL_ID_HEADER, reject

__all__ = ["compact", "plain_word_fraction", "play"]


def plain_word_fraction(text: str) -> float:
    """The verifier: the share of ``text``'s characters that are a-z or a space (0 when empty)."""
    if not text:
        return 0.0
    return sum(c == " " or "a" <= c <= "z" for c in text) / len(text)


def compact(task: str, rounds: Sequence[tuple[dict, dict]], keep_rounds: int) -> list[dict]:
    """The context the model sees: the task and the last ``keep_rounds`` rounds."""
    kept = list(rounds[-keep_rounds:]) if keep_rounds else []
    dropped = len(rounds) - len(kept)
    intro = task if not dropped else f"{task} ({dropped} earlier rounds omitted.)"
    messages = [{"role": "user", "content": intro}]
    for answer, observation in kept:
        messages += [answer, observation]
    return messages


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def play(
    client: OpenAI,
    task: dict[str, Any],
    seed: int,
    *,
    turns: int = 4,
    keep_rounds: int = 2,
    max_tokens: int = 12,
    reject_fraction: float = 0.15,
    max_response_retries: int = 1,
) -> dict[str, Any]:
    """One rollout of ``task["prompt"]``: ``turns`` answers, each with its observation; returns
    the harness result (``output``: the accepted history, ``reward``). Rejections derive from
    ``seed``, so the same seed under the same weights replays the same rollout."""
    model = client.models.list().data[0].id
    prompt = task["prompt"]
    accepted: list[str] = []
    rounds: list[tuple[dict, dict]] = []
    returned: list[dict] = [{"role": "user", "content": prompt}]
    for turn in range(turns):
        context = compact(prompt, rounds, keep_rounds)
        for retry in range(max_response_retries + 1):
            call_id = f"t{turn}-{retry}"
            completion = client.chat.completions.create(
                model=model,
                messages=context,
                max_tokens=max_tokens,
                extra_headers={CALL_ID_HEADER: call_id},
            )
            text = completion.choices[0].message.content or ""
            last_chance = retry == max_response_retries
            if last_chance or (text and _unit(seed, call_id) >= reject_fraction):
                break
            reject(client, completion.id, "resampled")
        answer = {"role": "assistant", "content": text}
        accepted.append(text)
        score = plain_word_fraction(text)
        observation = {"role": "user", "content": f"Observation {turn}: score {score:.2f}"}
        rounds.append((answer, observation))
        returned += [{**answer, "response_id": completion.id}, observation]
    reward = sum(map(plain_word_fraction, accepted)) / len(accepted)
    return {"output": returned, "reward": reward}
