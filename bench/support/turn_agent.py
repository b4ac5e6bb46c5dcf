"""A deterministic little agent that talks to a Grove gateway over HTTP, turn by turn.

The agent has a system prompt and a task; each turn after the first appends an observation that
depends only on the turn number (a gauge reading), then asks the model, with the official
``openai`` client, and appends the answer. Turn ``n``'s call is named ``t{n}`` (``X-Grove-Call-Id``)
and samples at temperature 1 with the seed its caller gives, so two plays of the agent with other
seeds diverge as real sampling does, and a play with the same seeds repeats exactly.

``TurnAgent.open`` opens an attempt (``POST /v1/attempts``), optionally as a fork of a committed
call of another attempt (``fork_from``, ``docs/fork.md``); ``play`` plays a range of turns on it
from a given conversation; ``post_result`` posts the conversation as its returned history.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import httpx
from openai import OpenAI

from grove.client import SOURCE_TOKEN_HEADER

__all__ = ["OPENING", "Conversation", "TurnAgent", "call_id", "observation"]

OPENING: Final = (
    {"role": "system", "content": "You are a careful field agent. Read the gauge each turn."},
    {"role": "user", "content": "Log the gauge for eight turns, then report the trend."},
)
"""The conversation before turn 1."""

TIMEOUT_S: Final = 120.0


def observation(turn: int) -> dict[str, str]:
    """The observation the agent appends before turn ``turn`` (> 1): a function of the turn."""
    return {"role": "user", "content": f"Turn {turn}: the gauge reads {(37 * turn) % 100} units."}


def call_id(turn: int) -> str:
    """The id of turn ``turn``'s call."""
    return f"t{turn}"


@dataclass
class Conversation:
    """What one attempt of the agent said and heard: its messages (``OPENING`` first), and per
    turn played the generated tokens the gateway reported (``usage.completion_tokens``)."""

    messages: list[dict[str, Any]] = field(default_factory=lambda: [dict(m) for m in OPENING])
    generated: dict[int, int] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        """Generated tokens over the turns played."""
        return sum(self.generated.values())


class TurnAgent:
    """The agent's clients against one gateway at ``base_url``: httpx for the attempt API, the
    official ``openai`` client for model calls; each request carries its attempt's token."""

    def __init__(self, base_url: str, model: str, max_tokens: int) -> None:
        self.base_url = base_url
        self.model = model
        self.max_tokens = max_tokens
        self.http = httpx.Client(base_url=base_url, timeout=TIMEOUT_S)
        self.tokens: dict[str, str] = {}

    def open(
        self, key: str, *, group: str, index: int, fork_from: tuple[str, str] | None = None
    ) -> dict[str, Any]:
        """Open attempt ``key`` as rollout ``index`` of ``group`` (a fork of call ``fork_from``
        = (capture key, call id) when given); the gateway's answer."""
        body: dict[str, Any] = {
            "capture_key": key,
            "rollout_id": key,
            "prompt_group": group,
            "rollout_index": index,
        }
        headers: dict[str, str] = {}
        if fork_from is not None:
            body["fork_from"] = {"capture_key": fork_from[0], "call_id": fork_from[1]}
            headers[SOURCE_TOKEN_HEADER] = self.tokens[fork_from[0]]  # a fork needs it
        answer = self._post("/v1/attempts", body, headers)
        self.tokens[key] = answer["attempt_token"]
        return answer

    def play(
        self,
        key: str,
        conversation: Conversation,
        turns: Sequence[int],
        seed: Callable[[int], int],
        *,
        continuing: bool = True,
    ) -> None:
        """Play ``turns`` on attempt ``key`` from ``conversation`` (extended in place): before
        each turn after the first an observation, then one call with seed ``seed(turn)``. With
        ``continuing`` every call must be admitted as a continuation except turn 1's (a fork's
        first call continues its source call), else ``RuntimeError``."""
        headers = {"X-Grove-Capture-Key": key, "X-Grove-Attempt-Token": self.tokens[key]}
        with OpenAI(
            base_url=f"{self.base_url}/v1", api_key="bench", max_retries=0, timeout=TIMEOUT_S
        ) as client:
            for turn in turns:
                if turn > 1:
                    conversation.messages.append(observation(turn))
                raw = client.chat.completions.with_raw_response.create(
                    model=self.model,
                    messages=conversation.messages,  # type: ignore[arg-type]
                    max_tokens=self.max_tokens,
                    temperature=1.0,
                    seed=seed(turn),
                    extra_headers={**headers, "X-Grove-Call-Id": call_id(turn)},
                )
                decision = raw.headers.get("X-Grove-Decision")
                if continuing and turn > 1 and decision != "continuation":
                    raise RuntimeError(f"turn {turn} of {key} was admitted as {decision}")
                completion = raw.parse()
                conversation.messages.append(completion.choices[0].message.model_dump())
                if completion.usage is None:
                    raise RuntimeError(f"turn {turn} of {key} answered no usage")
                conversation.generated[turn] = completion.usage.completion_tokens

    def post_result(self, key: str, conversation: Conversation, reward: float) -> dict[str, Any]:
        """Post ``conversation`` as attempt ``key``'s returned history with ``reward``."""
        body = {"reward": reward, "output": conversation.messages}
        return self._post(
            f"/v1/attempts/{key}/result", body, {"X-Grove-Attempt-Token": self.tokens[key]}
        )

    def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
        answer = self.http.post(path, json=body, headers=headers)
        if answer.status_code != 200:
            raise RuntimeError(f"POST {path}: {answer.status_code} {answer.text}")
        result: dict[str, Any] = answer.json()
        return result

    def close(self) -> None:
        """Close the attempt API's connections."""
        self.http.close()
