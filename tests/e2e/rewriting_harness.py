"""A harness for the drop tests: two calls per rollout; a task with ``"rewrite": true`` sends its
second call a rewritten history (a new root), so its rollout has two rows and, without forest
training, is masked ``forest_training_disabled``."""

from __future__ import annotations

from typing import Any

from openai import OpenAI


def play(client: OpenAI, task: dict[str, Any], seed: int) -> dict[str, Any]:
    """One rollout of ``task``; the reward is 1 when the last answer is not empty."""
    model = client.models.list().data[0].id
    prompt = {"role": "user", "content": task["prompt"]}
    first = client.chat.completions.create(model=model, messages=[prompt], max_tokens=4)
    answer = {"role": "assistant", "content": first.choices[0].message.content or ""}
    follow_up = {"role": "user", "content": "Say more."}
    history = [prompt, answer, follow_up]
    if task.get("rewrite"):
        history = [{"role": "user", "content": f"{task['prompt']} Say more."}]
    second = client.chat.completions.create(model=model, messages=history, max_tokens=4)
    last = {"role": "assistant", "content": second.choices[0].message.content or ""}
    returned = [prompt, {**answer, "response_id": first.id}, follow_up]
    returned.append({**last, "response_id": second.id})
    return {"output": returned, "reward": float(bool(last["content"]))}
