"""The harness side of the crash and concurrency suites: rollouts played over HTTP against the
gateway with the official ``openai`` client, and every acknowledgement written down.

An acknowledgement is a 2xx answer: the event it stands for (``attempt.opened``,
``call.committed`` with its response id, ``call.failed`` for a rejected answer,
``rollout.selected``) must be in the ledger whatever happens to the gateway afterwards. When
the gateway dies mid-rollout (its connection breaks), ``play`` raises ``GatewayLost`` with the
history the harness had accepted so far, for the caller to end or abandon the rollout.

The agent is the recency agent's policy (``examples.recency_agent``): one round kept, so the
third call rewrites the context; answers are rejected and resampled with a seeded probability.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai

from examples.recency_agent import compact, plain_word_fraction
from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CALL_ID_HEADER, CAPTURE_KEY_HEADER

from .conftest import MODEL

__all__ = ["Ack", "GatewayLost", "Harness", "Progress"]


@dataclass(frozen=True)
class Ack:
    """One acknowledged event: the attempt, the event type, and the call it names (if any)."""

    capture_key: str
    event_type: str
    call_id: str | None = None
    response_id: str | None = None


@dataclass
class Progress:
    """A rollout as far as the harness got: the history it accepted and the calls it made."""

    capture_key: str
    rollout_id: str
    group: str
    index: int
    returned: list[dict[str, Any]] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    calls: int = 0
    token: str = ""  # the attempt's token, as opening it answered

    @property
    def result(self) -> dict[str, Any]:
        """The harness's ordinary result: the returned history and the verifier's reward."""
        reward = plain_word_fraction(" ".join(self.answers)) if self.answers else 0.0
        return {"output": self.returned, "reward": reward}


class GatewayLost(Exception):
    """The gateway's connection broke in the middle of a rollout (it died)."""

    def __init__(self, progress: Progress, cause: Exception) -> None:
        self.progress = progress
        super().__init__(f"gateway lost during {progress.capture_key}: {cause!r}")


_TRANSPORT_ERRORS = (httpx.TransportError, openai.APIConnectionError)


class Harness:
    """Plays rollouts against the gateway at ``base_url``; ``acks`` lists what it was told."""

    def __init__(
        self,
        base_url: str,
        *,
        seed: int,
        turns: int = 3,
        max_tokens: int = 4,
        reject_fraction: float = 0.15,
    ) -> None:
        self.rng = random.Random(seed)
        self.turns = turns
        self.max_tokens = max_tokens
        self.reject_fraction = reject_fraction
        self.acks: list[Ack] = []
        self.connect(base_url)

    def connect(self, base_url: str) -> None:
        """Talk to the gateway at ``base_url`` from now on (after a restart)."""
        self.client = openai.OpenAI(
            base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120
        )
        self.http = httpx.Client(base_url=f"{base_url}/v1", timeout=120)

    def close(self) -> None:
        """Close the connections."""
        self.client.close()
        self.http.close()

    def _post(self, progress: Progress, path: str, body: dict[str, Any]) -> httpx.Response:
        headers = {ATTEMPT_TOKEN_HEADER: progress.token} if progress.token else {}
        try:
            return self.http.post(path, json=body, headers=headers)
        except _TRANSPORT_ERRORS as error:
            raise GatewayLost(progress, error) from error

    def play(self, capture_key: str, rollout_id: str, group: str, index: int) -> Progress:
        """Open the attempt and make every call of the rollout; the result is not posted."""
        progress = Progress(capture_key, rollout_id, group, index)
        opened = self._post(
            progress,
            "/attempts",
            {
                "capture_key": capture_key,
                "rollout_id": rollout_id,
                "prompt_group": group,
                "rollout_index": index,
            },
        )
        opened.raise_for_status()
        progress.token = opened.json()["attempt_token"]
        self.acks.append(Ack(capture_key, "attempt.opened"))
        task = f"Task {group}: answer in plain words."
        progress.returned.append({"role": "user", "content": task})
        rounds: list[tuple[dict, dict]] = []
        for turn in range(self.turns):
            answer = self._answer(progress, compact(task, rounds, keep_rounds=1), turn)
            observation = {"role": "user", "content": f"Observation {turn}."}
            rounds.append(({"role": "assistant", "content": answer["content"]}, observation))
            progress.returned += [answer, observation]
            progress.answers.append(answer["content"])
        return progress

    def _answer(self, progress: Progress, context: list[dict], turn: int) -> dict[str, Any]:
        """One accepted answer: a call, rejected and resampled once with a seeded probability,
        and resampled while it holds U+0000 (a byte the tiny model can emit, which a PostgreSQL
        ledger cannot store in the returned history)."""
        for retry in range(4):
            call_id = f"t{turn}-{retry}"
            try:
                completion = self.client.chat.completions.create(
                    model=MODEL,
                    messages=context,
                    max_tokens=self.max_tokens,
                    seed=self.rng.randrange(2**31),
                    extra_headers={
                        CAPTURE_KEY_HEADER: progress.capture_key,
                        ATTEMPT_TOKEN_HEADER: progress.token,
                        CALL_ID_HEADER: call_id,
                    },
                )
            except _TRANSPORT_ERRORS as error:
                raise GatewayLost(progress, error) from error
            progress.calls += 1
            self.acks.append(Ack(progress.capture_key, "call.committed", call_id, completion.id))
            text = completion.choices[0].message.content or ""
            unusable = "\x00" in text and retry < 3
            if unusable or (retry == 0 and self.rng.random() < self.reject_fraction):
                path = f"/attempts/{progress.capture_key}/calls/{call_id}/reject"
                self._post(progress, path, {"detail": "resampled"}).raise_for_status()
                self.acks.append(Ack(progress.capture_key, "call.failed", call_id))
                continue
            return {"role": "assistant", "content": text, "response_id": completion.id}
        raise AssertionError("unreachable: the retry is always accepted")

    def post_result(self, progress: Progress) -> bool:
        """Post the rollout's result; True when it was recorded, False when the gateway refused
        to select from it (422: e.g. no accepted answer)."""
        answer = self._post(progress, f"/attempts/{progress.capture_key}/result", progress.result)
        if answer.status_code == 422:
            return False
        answer.raise_for_status()
        self.acks.append(Ack(progress.capture_key, "rollout.selected"))
        return True
