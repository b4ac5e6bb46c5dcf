"""Rollouts played in this process through a capture service, for the tamper and access suites.

A rollout follows the recency agent's context policy (``examples.recency_agent.compact``, one
round kept): its third call rewrites the context, so it finalizes with two rows. The result is
recorded as the gateway records it: settle, then ``grove.services.serve.LedgerSelector`` on the
returned history.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.recency_agent import compact, plain_word_fraction
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CaptureService, ModelCall
from grove.capture.render import RenderOptions
from grove.services.serve import LedgerSelector

from .conftest import MODEL

__all__ = ["OPTIONS", "SAMPLING", "Played", "play", "record_result"]

OPTIONS = RenderOptions(model=MODEL)
SAMPLING = SamplingParams(max_tokens=4)


@dataclass(frozen=True)
class Played:
    """One rollout as played: its attempt, its calls in order and the result it returned."""

    capture_key: str
    rollout_id: str
    group: str
    call_ids: tuple[str, ...]
    result: dict[str, Any]


def play(
    capture: CaptureService,
    capture_key: str,
    *,
    group: str,
    index: int,
    turns: int = 3,
    select: bool = True,
) -> Played:
    """Open an attempt, make ``turns`` calls, and (``select``) record its result."""
    rollout_id = f"{group}-r{index}"
    capture.open_attempt(
        capture_key, rollout_id=rollout_id, prompt_group=group, rollout_index=index
    )
    task = f"Task {group}: answer in plain words."
    rounds: list[tuple[dict, dict]] = []
    returned: list[dict[str, Any]] = [{"role": "user", "content": task}]
    call_ids = []
    for turn in range(turns):
        context = compact(task, rounds, keep_rounds=1)
        outcome = capture.generate(capture_key, ModelCall(context, OPTIONS, SAMPLING, f"t{turn}"))
        observation = {"role": "user", "content": f"Observation {turn}."}
        rounds.append((outcome.message, observation))
        returned += [{**outcome.message, "response_id": outcome.response_id}, observation]
        call_ids.append(outcome.call_id)
    answers = " ".join(answer["content"] for answer, _ in rounds)
    result = {"output": returned, "reward": plain_word_fraction(answers)}
    if select:
        record_result(capture, capture_key, result)
    return Played(capture_key, rollout_id, group, tuple(call_ids), result)


def record_result(capture: CaptureService, capture_key: str, result: dict[str, Any]) -> None:
    """Settle the attempt (no wait) and record the selection of ``result``."""
    state = capture.settle(capture_key, timeout_s=0.0)
    capture.select(capture_key, LedgerSelector()(state, result))
