"""``grove serve --strict`` refuses an unexplained root: 409 ``unexplained_root`` over HTTP.

The served model's chat template writes `` (turn N)`` into the first message of a conversation
with N answers (``tests/fixtures/templates.py``), so the second call of a conversation cannot
continue the first from its exact tokens.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.gateway import CAPTURE_KEY_HEADER
from tests.fixtures.templates import save_turn_marking_model

from .test_cli_serve import grove_serve


def conversation(base_url: str) -> httpx.Response:
    """Open attempt ``a1``, make one call, and answer the second call of its conversation."""
    attempt = {"capture_key": "a1", "rollout_id": "r1", "prompt_group": "g", "rollout_index": 0}
    opened = httpx.post(f"{base_url}/v1/attempts", json=attempt, timeout=10)
    opened.raise_for_status()
    headers = {CAPTURE_KEY_HEADER: "a1", ATTEMPT_TOKEN_HEADER: opened.json()["attempt_token"]}
    messages = [{"role": "user", "content": "Count the apples."}]
    body = {"model": "turn-marking", "messages": messages, "max_tokens": 4}
    first = httpx.post(f"{base_url}/v1/chat/completions", json=body, headers=headers, timeout=60)
    answer = first.json()["choices"][0]["message"]
    follow_up = [*messages, answer, {"role": "user", "content": "And the pears?"}]
    return httpx.post(
        f"{base_url}/v1/chat/completions",
        json={**body, "messages": follow_up},
        headers=headers,
        timeout=60,
    )


def test_grove_serve_strict_refuses_an_unexplained_root_with_409(tmp_path: Path):
    model = save_turn_marking_model(tmp_path / "turn-marking")
    with grove_serve(tmp_path / "work", "--model", str(model), "--strict") as base_url:
        second = conversation(base_url)
    error = second.json()["error"]
    assert (second.status_code, error["code"]) == (409, "unexplained_root")
    assert "diverged at message 0" in error["message"]
