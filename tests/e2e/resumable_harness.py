"""An external harness that can die in flight and be resumed as a fork (``docs/fork.md``,
"Resume").

``python -m tests.e2e.resumable_harness play BASE_URL STATE``: opens attempt ``rollout-0`` with
``grove.client``, saves its capture key and attempt token to ``STATE`` (JSON) before it calls the
model, as a harness that may be resumed must, then plays two turns (a question, then an
observation), rewriting ``STATE`` with its history after each answer, and waits to be killed
(``"waiting": true`` in ``STATE``) — a harness stopped in the middle of its rollout.

``python -m tests.e2e.resumable_harness resume BASE_URL STATE``: reads ``STATE``, finds the
attempt's last committed call, opens ``rollout-0-resumed`` as a fork of it (the same rollout of
the same group, with the saved token as the source's), sends the conversation the opening
answered plus one more observation, and posts the result: that history and reward 1. It prints
the fork's opening answer (JSON).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from grove.client import GroveClient

KEY = "rollout-0"
RESUMED = "rollout-0-resumed"
ROLLOUT = {"rollout_id": "r0", "prompt_group": "g0", "rollout_index": 0}
QUESTION = {"role": "user", "content": "Count the apples in the basket."}


def _answer(attempt: Any, model: str, history: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's next message; its response id rides along in the returned history, so the
    result names each of its calls (``docs/train.md``, returned history)."""
    llm = attempt.openai()
    completion = llm.chat.completions.create(model=model, messages=history, max_tokens=6)
    return completion.choices[0].message.model_dump(exclude_none=True)


def play(base_url: str, state: Path) -> None:
    """Open the attempt, save its token, play two turns, wait to be killed."""
    grove = GroveClient(base_url)
    attempt = grove.open_attempt(KEY, **ROLLOUT)
    saved = {"capture_key": KEY, "attempt_token": attempt.attempt_token, "history": []}
    state.write_text(json.dumps(saved))
    model = grove.model()
    history = [QUESTION]
    for observation in ("apples=3", None):
        history.append(_answer(attempt, model, history))
        state.write_text(json.dumps({**saved, "history": history}))
        if observation is not None:
            history.append({"role": "tool", "content": observation})
    state.write_text(json.dumps({**saved, "history": history, "waiting": True}))
    while True:
        time.sleep(1)


def resume(base_url: str, state: Path) -> None:
    """Continue the saved attempt from its last committed call as a fork, and finish it."""
    saved = json.loads(state.read_text())
    grove = GroveClient(base_url)
    source = grove.attempt(saved["capture_key"], saved["attempt_token"])
    call_id = source.last_committed_call()
    if call_id is None:
        raise SystemExit(f"attempt {saved['capture_key']} committed no call: play it again")
    fork = grove.open_attempt(
        RESUMED,
        **ROLLOUT,
        fork_from=(saved["capture_key"], call_id),
        source_token=saved["attempt_token"],
    )
    assert fork.fork is not None
    history = [*fork.fork["messages"], {"role": "tool", "content": "apples=4"}]
    llm = fork.openai()
    completion = llm.chat.completions.create(model=grove.model(), messages=history, max_tokens=6)
    answer = completion.choices[0].message.model_dump(exclude_none=True)
    output = [*history, {**answer, "response_id": completion.id}]
    fork.post_result({"output": output, "reward": 1.0})
    print(json.dumps(fork.fork))


if __name__ == "__main__":
    command, url, path = sys.argv[1:4]
    {"play": play, "resume": resume}[command](url, Path(path))
