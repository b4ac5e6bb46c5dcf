"""A multi-turn agent with recency compaction, talking to the Grove gateway through ``openai``.

The agent keeps its whole semantic history but sends the model only the task and the last
``keep_rounds`` rounds (an assistant answer and its observation); when older rounds are dropped,
the task message says so. That rewrite starts a new root in the capture graph, so a rollout of
``turns`` calls becomes more than one training row. It rejects some answers (empty ones, and a
seeded fraction of the rest) and resamples, as a ``select_response`` hook would; rejected answers
never enter its history. When it is done it posts its ordinary result — the returned history and
the verifier's reward — and Grove selects the accepted calls from it.

The toy task: answer in plain lowercase words. The reward is the fraction of characters in the
accepted answers that are lowercase ASCII letters or spaces, something a tiny random model can
learn within a few GRPO steps on a CPU.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from openai import OpenAI

__all__ = [
    "TASKS",
    "AgentSettings",
    "RecencyAgent",
    "RolloutReport",
    "compact",
    "plain_word_fraction",
]

TASKS = (
    "Describe the weather in a few plain words.",
    "Tell a short story about a fox in plain words.",
    "Explain what an agent does, in plain words.",
    "Name the things you see in a garden, in plain words.",
)
CAPTURE_HEADER = "X-Grove-Capture-Key"
CALL_HEADER = "X-Grove-Call-Id"


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


@dataclass(frozen=True)
class AgentSettings:
    """How the agent plays: turns, rounds kept, answer length, rejection rate and retries."""

    turns: int = 4
    keep_rounds: int = 2
    max_tokens: int = 12
    reject_fraction: float = 0.15
    max_response_retries: int = 1


@dataclass
class RolloutReport:
    """What one rollout did."""

    capture_key: str
    reward: float
    calls: int
    rejected: int
    accepted: list[str] = field(default_factory=list)


def _unit(*parts: object) -> float:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _seed(*parts: object) -> int:
    return int(_unit("seed", *parts) * 2**31)


class RecencyAgent:
    """Plays rollouts against a Grove gateway at ``base_url`` (which ends in ``/v1``)."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        settings: AgentSettings | None = None,
        api_key: str = "grove",
    ) -> None:
        self.model = model
        self.settings = settings or AgentSettings()
        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0)
        self.http = httpx.Client(
            base_url=base_url, headers={"Authorization": f"Bearer {api_key}"}, timeout=600
        )

    def close(self) -> None:
        """Close the HTTP connections."""
        self.client.close()
        self.http.close()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        response = self.http.post(path, json=body)
        if response.status_code >= 400:
            raise RuntimeError(f"POST {path} answered {response.status_code}: {response.text}")
        return response.json()

    def play(
        self,
        capture_key: str,
        *,
        rollout_id: str,
        group: str,
        index: int,
        task: str,
        seed_key: str | None = None,
    ) -> RolloutReport:
        """One rollout: open the attempt, play every turn, post the result.

        Sampling seeds and rejections derive from ``seed_key`` (default: the capture key), so the
        same key replays the same rollout under the same weights.
        """
        settings = self.settings
        self._post(
            "/attempts",
            {
                "capture_key": capture_key,
                "rollout_id": rollout_id,
                "prompt_group": group,
                "rollout_index": index,
            },
        )
        report = RolloutReport(capture_key, 0.0, 0, 0)
        rounds: list[tuple[dict, dict]] = []
        returned: list[dict] = [{"role": "user", "content": task}]
        for turn in range(settings.turns):
            context = compact(task, rounds, settings.keep_rounds)
            answer, response_id = self._answer(
                capture_key, seed_key or capture_key, context, turn, report
            )
            report.accepted.append(answer["content"])
            score = plain_word_fraction(answer["content"])
            observation = {"role": "user", "content": f"Observation {turn}: score {score:.2f}"}
            rounds.append((answer, observation))
            returned += [{**answer, "response_id": response_id}, observation]
        report.reward = sum(map(plain_word_fraction, report.accepted)) / len(report.accepted)
        self._post(f"/attempts/{capture_key}/result", {"output": returned, "reward": report.reward})
        return report

    def _answer(
        self,
        capture_key: str,
        seed_key: str,
        context: list[dict],
        turn: int,
        report: RolloutReport,
    ) -> tuple[dict, str]:
        settings = self.settings
        for retry in range(settings.max_response_retries + 1):
            call_id = f"t{turn}-{retry}"
            completion = self.client.chat.completions.create(
                model=self.model,
                messages=context,
                max_tokens=settings.max_tokens,
                seed=_seed(seed_key, call_id),
                extra_headers={CAPTURE_HEADER: capture_key, CALL_HEADER: call_id},
            )
            report.calls += 1
            text = completion.choices[0].message.content or ""
            last_chance = retry == settings.max_response_retries
            rejected = not text or _unit(seed_key, call_id) < settings.reject_fraction
            if rejected and not last_chance:
                self._post(
                    f"/attempts/{capture_key}/calls/{call_id}/reject", {"detail": "resampled"}
                )
                report.rejected += 1
                continue
            return {"role": "assistant", "content": text}, completion.id
        raise AssertionError("unreachable: the last retry is always accepted")
