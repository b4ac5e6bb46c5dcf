"""A harness for ``token_capture.strict``: one conversation of several calls that records which
call the gateway refused (``tests/unit/config/test_capture_keys.py``).

It appends one JSON line per rollout to the file named by its ``log`` option, in the form
``tests/unit/config/runs.py`` reads: ``{"event": "end", "answered": N, "refused": {"status",
"code"} or null}``. A refused call ends the conversation; the history up to it is returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import openai
from openai import OpenAI

from grove.client import CALL_ID_HEADER


def converse(client: OpenAI, task: dict, seed: int, *, log: str, calls: int) -> dict[str, Any]:
    """Up to ``calls`` chat calls, each continuing the last answer with ``again``."""
    model = client.models.list().data[0].id
    history: list[dict[str, Any]] = [{"role": "user", "content": task["prompt"]}]
    refused, answered = None, 0
    for index in range(calls):
        request = history if index == 0 else [*history, {"role": "user", "content": "again"}]
        try:
            completion = client.chat.completions.create(
                model=model, messages=request, extra_headers={CALL_ID_HEADER: f"c{index}"}
            )
        except openai.APIStatusError as error:
            body = error.body if isinstance(error.body, dict) else {}
            refused = {"status": error.status_code, "code": body.get("code")}
            break
        history = [*request, completion.choices[0].message.model_dump(exclude_none=True)]
        answered += 1
    with Path(log).open("a") as out:
        out.write(json.dumps({"event": "end", "answered": answered, "refused": refused}) + "\n")
    return {"output": history, "reward": float(answered)}
