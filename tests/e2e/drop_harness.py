"""A harness for the drop tests: each task says which of its rollouts fail and how.

A rollout makes one chat call (``max_tokens`` 4) and returns it; its reward is 1. The task's
fields name rollouts by index (the capture key's ``-r{index}``):

- ``"slow": [i, ...]``: rollout ``i`` sleeps the ``slow_s`` option's seconds before it returns;
- ``"raise": [i, ...]``: rollout ``i`` raises ``ValueError("boom in rollout i")`` after its call;
- ``"hang": [i, ...]``: rollout ``i`` keeps calling the model every 50 ms and never returns on its
  own: once Grove closes its attempt a call is refused (409 ``attempt_closed``), and it unwinds
  by raising ``openai.ConflictError``; it appends that refusal's code to the ``log`` option's file
  (JSON lines) first, so a test can see it unwound;
- ``"interrupt": [i, ...]``: rollout ``i`` raises ``KeyboardInterrupt`` once per file named by the
  ``once`` option (the file is created then), as a person pressing Ctrl-C would stop the run;
- ``"rewrite": [i, ...]``: rollout ``i`` sends a second call with a rewritten history (a new
  root), so without forest training it is masked ``forest_training_disabled``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import openai
from openai import OpenAI

from grove.client import CAPTURE_KEY_HEADER


def _index(client: OpenAI) -> int:
    """The rollout's index, from its capture key ``…-r{index}`` (or ``…-r{index}-a{n}``)."""
    key = str(client.default_headers[CAPTURE_KEY_HEADER])
    return int(key.rsplit("-r", 1)[1].split("-a", 1)[0])


def _ask(client: OpenAI, model: str, messages: list[dict]) -> dict[str, Any]:
    completion = client.chat.completions.create(model=model, messages=messages, max_tokens=4)
    message = completion.choices[0].message
    return {"role": "assistant", "content": message.content or "", "response_id": completion.id}


def _hang(client: OpenAI, model: str, prompt: dict, log: str | None) -> None:
    while True:
        try:
            _ask(client, model, [prompt])
        except openai.ConflictError as refused:
            if log is not None:
                body = refused.body if isinstance(refused.body, dict) else {}
                with Path(log).open("a") as out:
                    out.write(json.dumps({"refused": body.get("code")}) + "\n")
            raise
        time.sleep(0.05)


def play(
    client: OpenAI,
    task: dict[str, Any],
    seed: int,
    *,
    log: str | None = None,
    once: str | None = None,
    slow_s: float = 0.0,
) -> dict[str, Any]:
    """One rollout of ``task`` (see the module docstring)."""
    index = _index(client)
    model = client.models.list().data[0].id
    prompt = {"role": "user", "content": task["prompt"]}
    if index in task.get("hang", ()):
        _hang(client, model, prompt, log)
    answer = _ask(client, model, [prompt])
    if index in task.get("slow", ()):
        time.sleep(slow_s)
    if index in task.get("raise", ()):
        raise ValueError(f"boom in rollout {index}")
    if index in task.get("interrupt", ()) and once is not None and not Path(once).exists():
        Path(once).touch()
        raise KeyboardInterrupt
    output = [prompt, answer]
    if index in task.get("rewrite", ()):
        rewritten = [{"role": "user", "content": f"{task['prompt']} Say more."}]
        output = [*output, rewritten[0], _ask(client, model, rewritten)]
    return {"output": output, "reward": 1.0}
