"""In-process harnesses: resolving ``harness.target`` and playing one rollout through it.

A harness is a function ``play(client, task, seed, **options) -> result``: ``client`` is an
``openai.OpenAI`` bound to the rollout's attempt (its calls are captured; reject a response with
``grove.client.reject(client, response_id)``), ``task`` the task record, ``seed`` the rollout's
seed (``rollout_seed``), ``options`` the configuration's ``harness.options``. It returns its
ordinary result: the returned history as ``output`` (Chat messages or Responses items) and the
verifier's ``reward``. Grove opens the attempt before (``open_rollout``), runs the harness
(``run_harness``) and posts the result after (``post_result``). A ``HarnessError`` from the last
two — the harness raised, returned no finite reward, or its result was refused or could not be
posted — is the harness's failure on that rollout: the training run drops the rollout's prompt
group (``harness_failed``) and its drop budget decides whether training goes on.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import importlib
import math
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from grove.client import Attempt, GroveClient, GroveClientError
from grove.errors import JobError

__all__ = [
    "Harness",
    "HarnessError",
    "RolloutSpec",
    "attempt_tokens",
    "fork_task",
    "open_rollout",
    "post_result",
    "resolve_harness",
    "rollout_seed",
    "run_harness",
]

Harness = Callable[..., Mapping[str, Any]]


class HarnessError(JobError, RuntimeError):
    """The harness could not be used, or failed on a rollout (``rollout_id`` then names it)."""

    def __init__(self, message: str, rollout_id: str | None = None) -> None:
        self.rollout_id = rollout_id
        super().__init__(message if rollout_id is None else f"rollout {rollout_id}: {message}")


def resolve_harness(target: str, config_dir: Path | None = None) -> Harness:
    """The function named ``module:function``, its module imported as ``python -m`` would from
    the current directory (which comes first on the import path, as for uvicorn's ``module:app``),
    then from ``config_dir``, the configuration file's directory (a harness beside its
    configuration is found from any directory, without ``PYTHONPATH``); refused with what is
    wrong, the directories searched and what to do."""
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise HarnessError(
            f"harness.target {target!r} must be 'module:function' (or 'external' for agents "
            "that run elsewhere)"
        )
    here = os.getcwd()
    searched = [here]
    if config_dir is not None and str(config_dir.resolve()) != here:
        searched.append(str(config_dir.resolve()))
    if here not in sys.path:
        sys.path.insert(0, here)
    if len(searched) > 1 and searched[1] not in sys.path:
        sys.path.insert(sys.path.index(here) + 1, searched[1])
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        beside = f" or the configuration's directory {searched[1]}" if len(searched) > 1 else ""
        raise HarnessError(
            f"harness.target {target!r}: cannot import {module_name!r} ({error}) from the "
            f"current directory {here}{beside} or the import path; put the module beside the "
            "configuration file, run grove from the directory that holds it, or add its "
            "directory to PYTHONPATH"
        ) from error
    function = getattr(module, attribute, None)
    if function is None:
        raise HarnessError(f"harness.target {target!r}: {module_name} has no {attribute!r}")
    if not callable(function):
        raise HarnessError(f"harness.target {target!r}: {attribute} is not callable")
    return function


def rollout_seed(run_seed: int, step: int, group: int, index: int) -> int:
    """Rollout ``index`` of group ``group`` of step ``step``'s seed: the same in every run with
    the same ``seed``, so runs and resumed runs play alike."""
    digest = hashlib.sha256(f"grove-rollout/{run_seed}/{step}/{group}/{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") >> 1


@dataclass(frozen=True)
class RolloutSpec:
    """One rollout to play: its attempt's coordinates, task, seed and the policy version (the
    optimizer steps taken) it starts under; ``fork_from`` the committed call ``(capture_key,
    call_id)`` it forks (``docs/fork.md``), None for a rollout from the task's start."""

    capture_key: str
    rollout_id: str
    prompt_group: str
    index: int
    task: Mapping[str, Any]
    seed: int
    policy_version: int = 0
    fork_from: tuple[str, str] | None = None


def attempt_tokens(secret: str) -> Callable[[str], str]:
    """The attempt token of each capture key of a run whose attempt secret is ``secret``
    (HMAC-SHA256, URL-safe base64: 43 characters), so the run can present the token of any
    attempt it opened, a resumed run included (forks need their source's token)."""
    key = secret.encode()

    def token_for(capture_key: str) -> str:
        digest = hmac.new(key, capture_key.encode(), hashlib.sha256).digest()
        return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()

    return token_for


def open_rollout(
    grove: GroveClient, spec: RolloutSpec, *, forest_mode: bool, selection_policy: str
) -> Attempt:
    """Open the rollout's attempt on the gateway."""
    return grove.open_attempt(
        spec.capture_key,
        rollout_id=spec.rollout_id,
        prompt_group=spec.prompt_group,
        rollout_index=spec.index,
        forest_mode=forest_mode,
        selection_policy=selection_policy,
        seed=spec.seed,
        policy_version=spec.policy_version,
        fork_from=spec.fork_from,
    )


def run_harness(
    attempt: Attempt, harness: Harness, spec: RolloutSpec, options: Mapping[str, Any]
) -> Mapping[str, Any]:
    """Run the harness on a client bound to ``attempt``; its result, checked. A ``HarnessError``
    naming the rollout when the harness raises or returns no finite ``reward``. A fork's harness
    finds the conversation it continues in ``task["fork"]`` (``fork_task``)."""
    task = fork_task(spec, attempt)
    client = attempt.openai()
    try:
        result = harness(client, task, spec.seed, **options)
    except Exception as error:
        raise HarnessError(f"the harness raised {error!r}", spec.rollout_id) from error
    finally:
        client.close()
    reward = result.get("reward") if isinstance(result, Mapping) else None
    if not isinstance(reward, int | float) or isinstance(reward, bool) or not math.isfinite(reward):
        raise HarnessError(
            "the harness must return a mapping with a finite number 'reward' (and its returned "
            f"history as 'output'), got {type(result).__name__}"
            + (f" with reward {reward!r}" if isinstance(result, Mapping) else ""),
            spec.rollout_id,
        )
    return result


def fork_task(spec: RolloutSpec, attempt: Attempt) -> dict[str, Any]:
    """The task record the harness receives: the rollout's task and, for a fork, ``fork``: the
    source call (``capture_key``, ``call_id``), its conversation through its answer, which the
    harness continues, as Chat messages (``messages``), Responses items (``input``) and a
    Messages API conversation (``messages_api``), and the tokens of that conversation
    (``cum_len``) (``docs/fork.md``)."""
    task = dict(spec.task)
    if spec.fork_from is None:
        return task
    source = attempt.fork or {}
    messages = source.get("messages")
    if not isinstance(messages, list):
        raise HarnessError(
            f"the fork source, call {spec.fork_from[1]!r} of attempt {spec.fork_from[0]!r}, has "
            "no recorded conversation (its blobs were written before Grove recorded "
            "conversations): fork a call recorded since",
            spec.rollout_id,
        )
    task["fork"] = {
        "capture_key": spec.fork_from[0],
        "call_id": spec.fork_from[1],
        "messages": messages,
        "input": source.get("input"),
        "messages_api": source.get("messages_api"),
        "cum_len": source.get("source_cum_len"),
    }
    return task


def post_result(attempt: Attempt, spec: RolloutSpec, result: Mapping[str, Any]) -> float:
    """Post the harness's result (the gateway settles the attempt and selects its calls); the
    reward. A ``HarnessError`` when the gateway refuses the result as one that cannot select
    calls (422) or cannot be reached."""
    try:
        attempt.post_result(result)
    except GroveClientError as error:
        if error.status != 422:
            raise
        raise HarnessError(f"the gateway refused its result: {error}", spec.rollout_id) from error
    except httpx.TransportError as error:
        raise HarnessError(f"its result could not be posted: {error!r}", spec.rollout_id) from error
    return float(result["reward"])
