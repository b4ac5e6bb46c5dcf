"""A small client for harnesses that run outside Grove: open an attempt, talk to the model through
an ``openai`` client bound to it, reject a response, post the result (``docs/train.md``).

An attempt is one execution of the harness for one logical rollout. Every model call of the
attempt carries its capture key in the ``X-Grove-Capture-Key`` header and the attempt's secret in
``X-Grove-Attempt-Token`` (``docs/security.md``); the bound clients set both once, so the harness
code is ordinary ``openai`` code::

    grove = GroveClient("http://127.0.0.1:8000/v1")
    attempt = grove.open_attempt("run1-g0-r0", rollout_id="g0-r0", prompt_group="g0",
                                 rollout_index=0)
    llm = attempt.openai()
    answer = llm.chat.completions.create(model=grove.model(), messages=[...])
    attempt.post_result({"output": [..., answer.choices[0].message.model_dump()], "reward": 1.0})

The gateway's refusals arrive as ``GroveClientError`` (a ``GroveError``) with the gateway's stable
``code``; its own failures (5xx) as the subclass ``GatewayServerError``.

``open_attempt`` proposes the attempt's token itself (``secrets.token_urlsafe(32)``), repeats the
opening with the same token when the connection fails, and opens a capture key it opened before
with the token it proposed then (the last ``REMEMBERED_TOKENS`` keys), so a lost answer neither
locks the harness out of its attempt nor makes a second token. Tokens go only to the gateway.
"""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
from openai import AsyncOpenAI

from grove_errors import GroveError

__all__ = [
    "ATTEMPT_TOKEN_HEADER",
    "CALL_ID_HEADER",
    "CAPTURE_KEY_HEADER",
    "SOURCE_TOKEN_HEADER",
    "Attempt",
    "GatewayServerError",
    "GroveClient",
    "GroveClientError",
    "anthropic_client",
    "reject",
]

CAPTURE_KEY_HEADER = "X-Grove-Capture-Key"
SOURCE_TOKEN_HEADER = "X-Grove-Source-Attempt-Token"
CALL_ID_HEADER = "X-Grove-Call-Id"
ATTEMPT_TOKEN_HEADER = "X-Grove-Attempt-Token"
OPEN_TRIES = 3  # openings sent, with one token, before a failing connection is reported
REMEMBERED_TOKENS = 10_000  # capture keys whose proposed token a client keeps for a re-opening


class GroveClientError(GroveError, RuntimeError):
    """The gateway refused a request: ``status``, its error ``code`` and ``message`` (a 4xx:
    the request needs a change; ``grove train`` stops with exit status 1)."""

    def __init__(self, method: str, path: str, status: int, code: str, message: str) -> None:
        self.status = status
        self.code = code
        self.message = message
        super().__init__(f"{method} {path} answered {status} {code}: {message}")


class GatewayServerError(GroveClientError):
    """The gateway failed on its side (a 5xx, e.g. ``internal_error`` with an incident id that its
    log explains): ``grove train`` stops with exit status 75, the same run may succeed later."""


def _checked(response: httpx.Response) -> Any:
    if response.status_code < 400:
        return response.json()
    try:
        error = response.json()["error"]
        code, message = str(error.get("code")), str(error.get("message"))
    except (ValueError, KeyError, TypeError, AttributeError):
        code, message = "http_error", response.text[:500]
    request = response.request
    kind = GatewayServerError if response.status_code >= 500 else GroveClientError
    raise kind(request.method, request.url.path, response.status_code, code, message)


class GroveClient:
    """Grove's attempt endpoints at ``base_url`` (the gateway's ``…/v1``), with ``api_key`` as
    the bearer token when the gateway requires one."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str = "grove",
        timeout_s: float = 600.0,
        token_for: Callable[[str], str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_for = token_for
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {api_key}"},
            timeout=timeout_s,
        )
        self._tokens: OrderedDict[str, str] = OrderedDict()
        self._tokens_lock = threading.Lock()  # harness threads share one client

    def close(self) -> None:
        """Close the HTTP connections."""
        self.http.close()

    def __enter__(self) -> GroveClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def model(self) -> str:
        """The name of the model the gateway serves (send it as ``model``)."""
        return str(_checked(self.http.get("/models"))["data"][0]["id"])

    def open_attempt(
        self,
        capture_key: str,
        *,
        rollout_id: str,
        prompt_group: str,
        rollout_index: int,
        forest_mode: bool | None = None,
        selection_policy: str | None = None,
        seed: int | None = None,
        policy_version: int = 0,
        fork_from: tuple[str, str] | None = None,
        source_token: str | None = None,
    ) -> Attempt:
        """Open (idempotently) the attempt ``capture_key`` for rollout ``rollout_index`` of
        ``prompt_group``; a training run groups ``grpo.num_generations_per_prompt`` rollouts of
        one prompt group and trains them together. ``seed`` seeds the calls that send none
        (default: derived from ``rollout_id``); ``policy_version`` is the policy the harness
        starts the rollout under (each call also records the version it was sampled with).
        ``forest_mode`` and ``selection_policy`` default to the server's configuration; a policy
        must be a built-in or one the server registered (else 400
        ``unregistered_selection_policy``). The attempt's token is made here and sent with the
        opening (repeated up to ``OPEN_TRIES`` times when the connection fails). ``fork_from``
        ``(capture_key, call_id)`` opens the attempt as a fork of that committed call
        (``docs/fork.md``): ``Attempt.fork`` then holds the source call's conversation to
        continue. A fork needs the source attempt's token: ``source_token``, else the one this
        client opened the source with."""
        body = {
            "capture_key": capture_key,
            "rollout_id": rollout_id,
            "prompt_group": prompt_group,
            "rollout_index": rollout_index,
            "forest_mode": forest_mode,
            "selection_policy": selection_policy,
            "seed": seed,
            "policy_version": policy_version,
        }
        if fork_from is not None:
            body["fork_from"] = {"capture_key": fork_from[0], "call_id": fork_from[1]}
        token = self._proposed_token(capture_key)
        headers = {ATTEMPT_TOKEN_HEADER: token}
        if fork_from is not None:
            source = source_token or self._known_token(fork_from[0])
            if source is None:
                raise ValueError(
                    f"opening a fork of attempt {fork_from[0]!r} needs its attempt token: pass "
                    "source_token (the attempt_token its opening answered)"
                )
            headers[SOURCE_TOKEN_HEADER] = source
        for tries in range(1, OPEN_TRIES + 1):
            try:
                opened = _checked(self.http.post("/attempts", json=body, headers=headers))
                break
            except httpx.TransportError:
                if tries == OPEN_TRIES:
                    raise
        return Attempt(self, capture_key, str(opened["attempt_token"]), opened.get("fork_from"))

    def attempt(self, capture_key: str, attempt_token: str) -> Attempt:
        """The opened attempt ``capture_key`` whose token is ``attempt_token`` (saved by the
        process that opened it: a harness resuming after a crash, ``docs/fork.md``)."""
        return Attempt(self, capture_key, attempt_token)

    def _known_token(self, capture_key: str) -> str | None:
        """The token this client opened ``capture_key`` with, if it knows it."""
        if self.token_for is not None:
            return self.token_for(capture_key)
        with self._tokens_lock:
            return self._tokens.get(capture_key)

    def _proposed_token(self, capture_key: str) -> str:
        """The token to open ``capture_key`` with: ``token_for``'s when given, else the one
        proposed before, else a new one."""
        if self.token_for is not None:
            return self.token_for(capture_key)
        with self._tokens_lock:
            token = self._tokens.pop(capture_key, None) or secrets.token_urlsafe(32)
            self._tokens[capture_key] = token
            while len(self._tokens) > REMEMBERED_TOKENS:
                self._tokens.popitem(last=False)
        return token


@dataclass(frozen=True)
class Attempt:
    """One opened attempt: bound ``openai`` clients, rejection, status and the result.
    ``attempt_token`` is its secret, sent with every request on it (never shown in ``repr``).
    ``fork`` is the call a fork continues, as the opening answered it (``source_capture_key``,
    ``source_call_id``, ``source_cum_len``, ``answer``, and the source call's conversation
    through its answer, to send again with the next observation, in each API's form:
    ``messages``, ``input``, ``messages_api``); None for an attempt that forks nothing."""

    grove: GroveClient
    capture_key: str
    attempt_token: str = field(repr=False)
    fork: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """The headers every request on this attempt carries: its capture key and token."""
        return {CAPTURE_KEY_HEADER: self.capture_key, ATTEMPT_TOKEN_HEADER: self.attempt_token}

    def _bound(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        headers = {**kwargs.pop("default_headers", {}), **self.headers}
        return {
            "base_url": self.grove.base_url,
            "api_key": self.grove.api_key,
            "timeout": self.grove.timeout_s,
            "max_retries": 0,
            **kwargs,
            "default_headers": headers,
        }

    def openai(self, **kwargs: Any) -> openai.OpenAI:
        """An ``openai.OpenAI`` whose every call belongs to this attempt (keyword arguments go to
        the client; ``max_retries`` is 0 unless given: a retried call would be a second call)."""
        return openai.OpenAI(**self._bound(kwargs))

    def async_openai(self, **kwargs: Any) -> AsyncOpenAI:  # openai names the method here
        """The ``openai.AsyncOpenAI`` twin of :meth:`openai`."""
        return openai.AsyncOpenAI(**self._bound(kwargs))

    def _anthropic_bound(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The ``anthropic`` client's options: the gateway's root as ``base_url`` (the client
        adds ``/v1/messages``), the key as a bearer token, this attempt's headers."""
        bound = self._bound(kwargs)
        bound["base_url"] = bound["base_url"].removesuffix("/v1")
        bound["auth_token"] = bound.pop("api_key")
        return bound

    def anthropic(self, **kwargs: Any) -> Any:
        """An ``anthropic.Anthropic`` whose every ``messages`` call belongs to this attempt
        (``POST /v1/messages``, ``docs/gateway.md``, "Messages API"); keyword arguments go to the
        client, ``max_retries`` is 0 unless given. Needs the ``anthropic`` package."""
        import anthropic  # optional: only harnesses on the anthropic client need it

        return anthropic.Anthropic(**self._anthropic_bound(kwargs))

    def async_anthropic(self, **kwargs: Any) -> Any:
        """The ``anthropic.AsyncAnthropic`` twin of :meth:`anthropic`."""
        import anthropic

        return anthropic.AsyncAnthropic(**self._anthropic_bound(kwargs))

    def last_committed_call(self) -> str | None:
        """The id of the attempt's last committed call (None: it committed none): where a
        harness that died in flight resumes, as a fork of it (``docs/fork.md``, "Resume")."""
        calls = self.status()["calls"]
        forkable = [
            c["call_id"]
            for c in calls
            if c["status"] == "committed" and not c["late"] and c["failure_reason"] is None
        ]  # a late or rejected response is never a parent
        return forkable[-1] if forkable else None

    def status(self) -> dict[str, Any]:
        """The attempt as the ledger knows it now (``GET /v1/attempts/{capture_key}``)."""
        path = f"/attempts/{self.capture_key}"
        return dict(_checked(self.grove.http.get(path, headers=self.headers)))

    def reject(self, response_id: str, detail: str = "rejected by the harness") -> None:
        """Record that the harness rejected the completed response ``response_id`` (the
        completion's ``id``); it never trains, and the harness may sample again."""
        call_id = _call_of_response(self.status(), response_id)
        path = f"/attempts/{self.capture_key}/calls/{call_id}/reject"
        _checked(self.grove.http.post(path, json={"detail": detail}, headers=self.headers))

    def post_result(self, result: Mapping[str, Any]) -> dict[str, Any]:
        """The harness returned: ``result`` is its ordinary output (``output``: the returned
        history) and ``reward``. Grove settles the attempt and selects the calls that train.
        ``"environment_masked": True`` (with an optional ``"environment_mask_reason"``) says the
        environment could not score the rollout: it trains nothing, its group does
        (``docs/forest.md``, "Environment masks")."""
        path = f"/attempts/{self.capture_key}/result"
        return dict(_checked(self.grove.http.post(path, json=dict(result), headers=self.headers)))


def _call_of_response(status: Mapping[str, Any], response_id: str) -> str:
    for call in status["calls"]:
        if call.get("response_id") == response_id:
            return str(call["call_id"])
    raise GroveClientError(
        "GET",
        f"/attempts/{status['capture_key']}",
        404,
        "unknown_response",
        f"attempt {status['capture_key']!r} served no response {response_id!r}",
    )


def reject(
    client: openai.OpenAI, response_id: str, detail: str = "rejected by the harness"
) -> None:
    """Reject ``response_id`` through an ``openai.OpenAI`` client bound to an attempt (the one an
    in-process harness receives): the same as :meth:`Attempt.reject`."""
    attempt = _attempt_of(client, timeout_s=60.0)
    try:
        attempt.reject(response_id, detail)
    finally:
        attempt.grove.close()


def anthropic_client(client: openai.OpenAI, **kwargs: Any) -> Any:
    """An ``anthropic.Anthropic`` bound to the same attempt as ``client``, an ``openai.OpenAI``
    bound to one (the client ``grove train`` hands an in-process harness): the same as
    :meth:`Attempt.anthropic`, with ``client``'s timeout unless ``timeout`` is given."""
    timeout = client.timeout if isinstance(client.timeout, int | float) else 600.0
    attempt = _attempt_of(client, timeout_s=float(timeout))
    try:
        return attempt.anthropic(**kwargs)
    finally:
        attempt.grove.close()  # the anthropic client keeps its own connections


def _attempt_of(client: openai.OpenAI, *, timeout_s: float) -> Attempt:
    """The attempt ``client`` is bound to, by its headers; close its ``grove`` when done."""
    capture_key = client.default_headers.get(CAPTURE_KEY_HEADER)
    token = client.default_headers.get(ATTEMPT_TOKEN_HEADER)
    if not isinstance(capture_key, str) or not isinstance(token, str):
        raise ValueError(
            f"this openai client is not bound to an attempt: it sends no {CAPTURE_KEY_HEADER} "
            f"and {ATTEMPT_TOKEN_HEADER} headers (use Attempt.openai() or the client grove train "
            "hands the harness)"
        )
    grove = GroveClient(str(client.base_url), api_key=client.api_key, timeout_s=timeout_s)
    return Attempt(grove, capture_key, token)
