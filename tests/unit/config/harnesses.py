"""Harnesses for the configuration tests: tiny rollouts that record what they were given.

Each harness appends JSON lines to the file named by its ``log`` option: ``{"event": "start"}``
when Grove calls it and ``{"event": "end", ...}`` before it returns, with the task, the seed, the
served model, the gateway it was pointed at, its API key, what an unauthenticated request to the
gateway got, and each model call's usage. ``tests/unit/config/runs.py`` reads the log back.
A call's id is ``c0``, ``c1``, ... (``X-Grove-Call-Id``), so selections can be compared exactly.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import openai
from openai import OpenAI

from grove.client import (
    ATTEMPT_TOKEN_HEADER,
    CALL_ID_HEADER,
    CAPTURE_KEY_HEADER,
    Attempt,
    GroveClient,
)

_LOCK = threading.Lock()
_MEETING = threading.Condition()
_RUNNING = [0]  # rollouts between their start and end records, in this process
_MEET_TIMEOUT_S = 60.0
_PROBE = httpx.Client(timeout=30.0)  # one client for every unauthenticated request


def _write(log: str, record: dict[str, Any]) -> None:
    with _LOCK, Path(log).open("a") as out:
        out.write(json.dumps(record) + "\n")


def _rollout_index(client: OpenAI) -> int:
    """The rollout's index, read from its capture key (``RUN-sS-gG-rR``)."""
    return int(str(client.default_headers[CAPTURE_KEY_HEADER]).rsplit("-r", 1)[1])


def _unauthenticated_status(client: OpenAI) -> int:
    return _PROBE.get(f"{client.base_url}models").status_code


def _call(
    client: OpenAI, model: str, messages: list[dict], call_id: str, **kwargs: Any
) -> tuple[dict, dict]:
    """One chat call; its answer as a message, and its usage and finish reason."""
    completion = client.chat.completions.create(
        model=model, messages=messages, extra_headers={CALL_ID_HEADER: call_id}, **kwargs
    )
    usage = completion.usage
    assert usage is not None
    answer = completion.choices[0].message.model_dump(exclude_none=True)
    return answer, {
        "call_id": call_id,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "finish_reason": completion.choices[0].finish_reason,
    }


def _played(
    name: str, client: OpenAI, model: str, task: dict, seed: int, options: dict, **facts: Any
) -> dict:
    return {
        "event": "end",
        "harness": name,
        "task": task,
        "seed": seed,
        "options": options,
        "rollout_index": _rollout_index(client),
        "model": model,
        "base_url": str(client.base_url),
        "api_key": client.api_key,
        "unauthenticated_status": _unauthenticated_status(client),
        **facts,
    }


def _meet(count: int) -> None:
    """Wait (up to a minute) until ``count`` rollouts are running at once, this one included."""
    with _MEETING:
        _RUNNING[0] += 1
        _MEETING.notify_all()
        _MEETING.wait_for(lambda: _RUNNING[0] >= count, timeout=_MEET_TIMEOUT_S)


def _leave() -> None:
    with _MEETING:
        _RUNNING[0] -= 1


def _conversation(
    name: str,
    client: OpenAI,
    task: dict,
    seed: int,
    log: str,
    calls: int,
    returned: int | None,
    meet: int = 1,
) -> dict[str, Any]:
    _write(log, {"event": "start", "harness": name})
    _meet(meet)
    try:
        return _converse(name, client, task, seed, log, calls, returned)
    finally:
        _leave()


def _converse(
    name: str, client: OpenAI, task: dict, seed: int, log: str, calls: int, returned: int | None
) -> dict[str, Any]:
    model = client.models.list().data[0].id
    history = [{"role": "user", "content": task["prompt"]}]
    usages, kept = [], []
    for index in range(calls):
        if index:
            history.append({"role": "user", "content": "again"})
        answer, usage = _call(client, model, history, f"c{index}")
        history.append(answer)
        usages.append(usage)
        if returned is None or index < returned:
            kept = list(history)
    options = {"calls": calls, "returned": returned}
    _write(log, _played(name, client, model, task, seed, options, calls=usages))
    return {"output": kept, "reward": float(len(kept[-1].get("content", "")))}


def play(
    client: OpenAI,
    task: dict,
    seed: int,
    *,
    log: str,
    calls: int = 1,
    returned: int | None = None,
    meet: int = 1,
) -> dict[str, Any]:
    """``calls`` chat calls in one conversation (no ``max_tokens``: ``engine.default_max_tokens``
    applies); returns the history up to its ``returned``-th answer (default: all of it). With
    ``meet`` above 1 a rollout first waits until that many rollouts run at once."""
    return _conversation("play", client, task, seed, log, calls, returned, meet)


def play_elsewhere(client: OpenAI, task: dict, seed: int, *, log: str) -> dict[str, Any]:
    """``play`` under another name: shows which ``harness.target`` Grove called."""
    return _conversation("play_elsewhere", client, task, seed, log, 1, None)


def rewrite_first_rollout(client: OpenAI, task: dict, seed: int, *, log: str) -> dict[str, Any]:
    """Two calls; rollout 0 sends its second call a rewritten context (a new root, so its forest
    has two paths), every other rollout continues the conversation (one path)."""
    _write(log, {"event": "start", "harness": "rewrite_first_rollout"})
    model = client.models.list().data[0].id
    first = [{"role": "user", "content": task["prompt"]}]
    answer, usage0 = _call(client, model, first, "c0")
    rewritten = _rollout_index(client) == 0
    second = (
        [{"role": "user", "content": f"{task['prompt']} (rewritten)"}]
        if rewritten
        else [*first, answer, {"role": "user", "content": "again"}]
    )
    answer2, usage1 = _call(client, model, second, "c1")
    _write(
        log, _played("rewrite_first_rollout", client, model, task, seed, {}, calls=[usage0, usage1])
    )
    output = [*first, answer, *second[-1:], answer2] if rewritten else [*second, answer2]
    return {"output": output, "reward": float(len(answer2.get("content", "")))}


def leave_a_call_pending(
    client: OpenAI, task: dict, seed: int, *, log: str, tokens: int
) -> dict[str, Any]:
    """Rollout 0 starts a second call of up to ``tokens`` tokens in a background thread and
    returns while it is still generating (the gateway then waits up to
    ``token_capture.pending_call_timeout_s`` for it); other rollouts make one call."""
    _write(log, {"event": "start", "harness": "leave_a_call_pending"})
    model = client.models.list().data[0].id
    history = [{"role": "user", "content": task["prompt"]}]
    answer, usage = _call(client, model, history, "c0")
    if _rollout_index(client) == 0:
        capture_key = str(client.default_headers[CAPTURE_KEY_HEADER])
        background = OpenAI(
            base_url=str(client.base_url),
            api_key=client.api_key,
            default_headers={
                CAPTURE_KEY_HEADER: capture_key,
                ATTEMPT_TOKEN_HEADER: str(client.default_headers[ATTEMPT_TOKEN_HEADER]),
            },
            max_retries=0,
        )
        long_call = [*history, answer, {"role": "user", "content": "go on"}]
        threading.Thread(
            target=_call_quietly,
            args=(background, model, long_call, "c1"),
            kwargs={"max_tokens": tokens, "seed": 7},
            daemon=True,
        ).start()
        _wait_until_pending(client, capture_key, "c1")
    _write(log, _played("leave_a_call_pending", client, model, task, seed, {}, calls=[usage]))
    return {"output": [*history, answer], "reward": float(len(answer.get("content", "")))}


def _call_quietly(client: OpenAI, model: str, messages: list[dict], call_id: str, **kw: Any):
    try:
        _call(client, model, messages, call_id, **kw)
    except openai.APIError:
        pass  # the gateway may be stopping when a late call ends; the ledger has what counts
    finally:
        client.close()


def _wait_until_pending(client: OpenAI, capture_key: str, call_id: str) -> None:
    grove = GroveClient(str(client.base_url), api_key=client.api_key)
    try:
        attempt = Attempt(grove, capture_key, client.default_headers[ATTEMPT_TOKEN_HEADER])
        deadline = time.monotonic() + 30.0
        while call_id not in attempt.status()["pending"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"call {call_id} never became pending")
            time.sleep(0.005)
    finally:
        grove.close()


def probe_context(
    client: OpenAI, task: dict, seed: int, *, log: str, max_tokens: int
) -> dict[str, Any]:
    """One call without ``max_tokens`` (the gateway fits it into the context left), then the
    same call asking for ``max_tokens`` explicitly (refused when it does not fit)."""
    _write(log, {"event": "start", "harness": "probe_context"})
    model = client.models.list().data[0].id
    history = [{"role": "user", "content": task["prompt"]}]
    answer, usage = _call(client, model, history, "c0")
    try:
        _call(client, model, history, "c1", max_tokens=max_tokens)
        refusal = None
    except openai.APIStatusError as error:
        body = error.body if isinstance(error.body, dict) else {}
        refusal = {"status": error.status_code, "code": body.get("code")}
    _write(
        log, _played("probe_context", client, model, task, seed, {}, calls=[usage], refusal=refusal)
    )
    return {"output": [*history, answer], "reward": 1.0}


def fork_aware(client: OpenAI, task: dict, seed: int, *, log: str) -> dict[str, Any]:
    """Two calls (``c0``, ``c1``) from the task's prompt, or, for a fork, one call (``f0``) that
    continues ``task["fork"]["messages"]``; the reward is the rollout's index, so rollout 0 of a
    group of two scores below its group's mean."""
    _write(log, {"event": "start", "harness": "fork_aware"})
    model = client.models.list().data[0].id
    fork = task.get("fork")
    if fork is None:
        history = [{"role": "user", "content": task["prompt"]}]
        calls = ["c0", "c1"]
    else:
        history = list(fork["messages"])
        calls = ["f0"]
    usages = []
    for call_id in calls:
        if call_id != "c0":
            history.append({"role": "user", "content": "again"})
        answer, usage = _call(client, model, history, call_id)
        history.append(answer)
        usages.append(usage)
    _write(log, _played("fork_aware", client, model, task, seed, {}, usages=usages))
    return {"output": history, "reward": float(_rollout_index(client))}
