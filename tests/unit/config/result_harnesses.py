"""Harnesses whose results say something ``play`` (``tests/unit/config/harnesses.py``) does not:
an environment mask (``docs/forest.md``, "Environment masks"), or a returned history that leaves
out a selected call's parent (``selection_not_closed``)."""

from __future__ import annotations

from typing import Any

from openai import OpenAI

from grove.client import CAPTURE_KEY_HEADER
from tests.unit.config.harnesses import play

SANDBOX_CRASH = "sandbox crashed before the verifier ran"


def crash_second_rollout(client: OpenAI, task: dict, seed: int, *, log: str) -> dict[str, Any]:
    """``play``'s result; rollout 1 of its group also carries ``environment_masked: true``."""
    result = play(client, task, seed, log=log)
    if str(client.default_headers[CAPTURE_KEY_HEADER]).endswith("-r1"):
        return {**result, "environment_masked": True, "environment_mask_reason": SANDBOX_CRASH}
    return result


def drop_first_answer(client: OpenAI, task: dict, seed: int, *, log: str) -> dict[str, Any]:
    """Rollout 0 of each group makes two calls and returns a history without the first answer, so
    its selection (the second call only) leaves out that call's parent; every other rollout plays
    one call."""
    if not str(client.default_headers[CAPTURE_KEY_HEADER]).endswith("-r0"):
        return play(client, task, seed, log=log)
    result = play(client, task, seed, log=log, calls=2)
    output = [item for index, item in enumerate(result["output"]) if index != 1]
    return {**result, "output": output}
