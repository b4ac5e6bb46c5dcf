"""An agent that runs outside Grove, against ``grove train`` with ``harness.target: external``.

It uses only ``grove.client`` and the official ``openai`` package: for each prompt group it opens
``--rollouts`` attempts, plays a short conversation in each (two answers, the second after an
observation on the first), resamples an empty answer once (rejecting the first), and posts the
returned history with its reward (the share of plain lowercase words in the answers)::

    python examples/external_agent.py --base-url http://127.0.0.1:8000/v1 --groups 4 --rollouts 2

Grove trains on each prompt group once all its rollouts have posted their results.
"""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from grove.client import Attempt, GroveClient

__all__ = ["main", "play_group"]

PROMPTS = (
    "Describe a river in a few plain words.",
    "Say what a good morning looks like, in plain words.",
    "Name three animals of the forest, in plain words.",
)


def _reward(texts: list[str]) -> float:
    joined = " ".join(texts)
    if not joined:
        return 0.0
    return sum(c == " " or "a" <= c <= "z" for c in joined) / len(joined)


def _answer(attempt: Attempt, model: str, messages: list[dict[str, Any]]) -> Any:
    llm = attempt.openai()
    try:
        completion = llm.chat.completions.create(model=model, messages=messages, max_tokens=8)
        if not completion.choices[0].message.content:
            attempt.reject(completion.id, "empty answer")
            completion = llm.chat.completions.create(model=model, messages=messages, max_tokens=8)
        return completion
    finally:
        llm.close()


def play_group(grove: GroveClient, group: str, rollouts: int, prompt: str) -> list[float]:
    """Play ``rollouts`` attempts of prompt group ``group``; their rewards."""
    model = grove.model()
    rewards = []
    for index in range(rollouts):
        key = f"{group}-r{index}"
        attempt = grove.open_attempt(key, rollout_id=key, prompt_group=group, rollout_index=index)
        messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
        returned = list(messages)  # the history, each answer with the response id it came with
        texts = []
        for turn in range(2):
            completion = _answer(attempt, model, messages)
            answer = {"role": "assistant", "content": completion.choices[0].message.content or ""}
            observation = {"role": "user", "content": f"Observation {turn}: noted."}
            texts.append(answer["content"])
            messages += [answer, observation]
            returned += [{**answer, "response_id": completion.id}, observation]
        reward = _reward(texts)
        attempt.post_result({"output": returned, "reward": reward})
        rewards.append(reward)
    return rewards


def main() -> None:
    """Play ``--groups`` prompt groups against the gateway at ``--base-url``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="the gateway, ending in /v1")
    parser.add_argument("--api-key", default="grove", help="the gateway's bearer token")
    parser.add_argument("--groups", type=int, default=4, help="prompt groups to play")
    parser.add_argument("--rollouts", type=int, default=2, help="rollouts per prompt group")
    parser.add_argument("--prefix", default=f"ext{uuid.uuid4().hex[:6]}", help="group id prefix")
    args = parser.parse_args()
    with GroveClient(args.base_url, api_key=args.api_key) as grove:
        for g in range(args.groups):
            group = f"{args.prefix}-g{g}"
            rewards = play_group(grove, group, args.rollouts, PROMPTS[g % len(PROMPTS)])
            print(f"{group}: rewards {', '.join(f'{r:.2f}' for r in rewards)}", flush=True)


if __name__ == "__main__":
    main()
