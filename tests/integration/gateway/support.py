"""A gateway over real HTTP, shared by the gateway and agent-framework suites.

``serve(database_url, blob_url, engine, **create_app_options)`` runs uvicorn on 127.0.0.1 (a free
port) in a thread over a real ledger and blob store, with the application's selector
(``grove.services.serve.LedgerSelector``), and yields a ``Gateway``: its base URL, its capture
service (to read the ledger and blobs) and an HTTP client for the attempt API. ``ScriptedEngine``
answers each call with chosen text, for the flows a random tiny model almost never produces by
itself (tool calls, reasoning, multi-byte text); without a script it samples from the embedded
engine (one per process; its calls are serialized).

Every request on an attempt carries the attempt's token (``capture/capabilities.py``). The
gateway's clients (``Gateway.http`` and ``Gateway.client()``) keep the tokens the gateway answered
when they opened attempts (``AttemptTokens``) and send the one of the attempt a request names (by
``X-Grove-Capture-Key`` or the ``/v1/attempts/{key}`` path) unless the request sends its own, so
the suites exercise capture as a token holder does; ``Gateway.bare`` sends none, for the tests of
the rule itself.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpx
from openai import OpenAI

from grove.capture.capabilities import ATTEMPT_TOKEN_HEADER
from grove.capture.embedded import EmbeddedEngine, build_tokenizer
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.gateway import CAPTURE_KEY_HEADER, create_app
from grove.capture.lifecycle import CaptureService
from grove.capture.render import Renderer
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.store import EventStore
from grove.services.serve import LedgerSelector, ServerThread
from grove.storage import BlobRef, open_blob_store

__all__ = [
    "CONTEXT",
    "MODEL",
    "AttemptTokens",
    "Gateway",
    "HeldEngine",
    "ScriptedEngine",
    "engine",
    "serve",
    "tokenizer",
]

MODEL = "grove/test-tiny"
CONTEXT = 256  # the gateway's max_context: small, so that a too-long prompt is cheap to build


@cache
def tokenizer():
    return build_tokenizer()


@cache
def engine() -> EmbeddedEngine:
    return EmbeddedEngine.build(tokenizer(), seed=11)


class ScriptedEngine:
    """An engine that answers each call with the next scripted text, exactly: the text's tokens
    (the embedded tokenizer) and the end-of-turn token, each with logprob -0.5; cut at
    ``max_tokens`` (finish ``length``) like a real engine. With the script empty it samples from
    the embedded engine. ``prompts`` keeps the exact prompt of every call served."""

    def __init__(self, fallback: EmbeddedEngine) -> None:
        self.fallback = fallback
        self.script: deque[str] = deque()
        self.prompts: list[list[int]] = []

    def say(self, *texts: str) -> None:
        """Queue the texts of the next calls, in order."""
        self.script.extend(texts)

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.fallback.check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        self.prompts.append(list(prompt_token_ids))
        if not self.script:
            return self.fallback.generate(prompt_token_ids, sampling)
        text = self.script.popleft()
        tokens = [*tokenizer().encode(text, add_special_tokens=False), tokenizer().eos_token_id]
        finish = "stop" if len(tokens) <= sampling.max_tokens else "length"
        tokens = tokens[: sampling.max_tokens]
        return Generation(tuple(tokens), (-0.5,) * len(tokens), finish)


class HeldEngine:
    """The embedded engine, holding the calls whose max_tokens is 7 until released (``started``
    is set when one arrives): a call that is still running while the test acts."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def check(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> None:
        engine().check(prompt_token_ids, sampling)

    def generate(self, prompt_token_ids: Sequence[int], sampling: SamplingParams) -> Generation:
        if sampling.max_tokens == 7:
            self.started.set()
            self.release.wait(30)
        return engine().generate(prompt_token_ids, sampling)


class AttemptTokens:
    """The attempt tokens a gateway answered, by capture key, as httpx event hooks: ``remember``
    keeps the token of each attempt opened, ``attach`` sends it with the requests on it."""

    def __init__(self) -> None:
        self.by_key: dict[str, str] = {}

    @property
    def hooks(self) -> dict[str, list[Any]]:
        """``event_hooks`` for an ``httpx.Client``."""
        return {"request": [self.attach], "response": [self.remember]}

    def attach(self, request: httpx.Request) -> None:
        """Send the token of the attempt ``request`` names, unless it carries a token already."""
        if ATTEMPT_TOKEN_HEADER in request.headers:
            return
        parts = request.url.path.split("/")
        key = request.headers.get(CAPTURE_KEY_HEADER)
        if key is None and parts[1:3] == ["v1", "attempts"]:
            key = parts[3] if len(parts) > 3 else _opened_key(request)
        if key in self.by_key:
            request.headers[ATTEMPT_TOKEN_HEADER] = self.by_key[key]

    def remember(self, response: httpx.Response) -> None:
        """Keep the token an opening answered."""
        request = response.request
        opening = request.method == "POST" and request.url.path == "/v1/attempts"
        if opening and response.status_code == 200:
            response.read()
            body = response.json()
            self.by_key[body["capture_key"]] = body["attempt_token"]


def _opened_key(request: httpx.Request) -> str | None:
    """The capture key an opening names (its retry sends the token the first one answered)."""
    try:
        key = json.loads(request.content).get("capture_key")
    except (ValueError, AttributeError):
        return None
    return key if isinstance(key, str) else None


@dataclass
class Gateway:
    """A running gateway, its capture service (to inspect the ledger and blobs) and clients:
    ``http`` and ``client()`` send the tokens of the attempts they opened, ``bare`` none."""

    base_url: str
    service: CaptureService
    http: httpx.Client
    server: ServerThread | None = None
    tokens: AttemptTokens | None = None
    bare: httpx.Client | None = None

    @property
    def engine(self) -> ScriptedEngine:
        """The scripted engine of a scripted gateway."""
        assert isinstance(self.service.engine, ScriptedEngine)
        return self.service.engine

    def client(self, capture_key: str | None = "att-1", **options: Any) -> OpenAI:
        """The official client, naming ``capture_key`` in its default headers (and sending the
        token of the attempt a request names, when this gateway's clients opened it)."""
        headers = {} if capture_key is None else {CAPTURE_KEY_HEADER: capture_key}
        options.setdefault("api_key", "unused")
        if self.tokens is not None:
            options.setdefault("http_client", httpx.Client(event_hooks=self.tokens.hooks))
        return OpenAI(
            base_url=f"{self.base_url}/v1", default_headers=headers, max_retries=0, **options
        )

    def token(self, capture_key: str = "att-1") -> str:
        """The token of attempt ``capture_key``, as opening it answered."""
        assert self.tokens is not None
        return self.tokens.by_key[capture_key]

    def open(self, capture_key: str = "att-1", **fields: Any) -> dict[str, Any]:
        """Open an attempt through the API."""
        body = {
            "capture_key": capture_key,
            "rollout_id": f"r-{capture_key}",
            "prompt_group": "g0",
            "rollout_index": 0,
            **fields,
        }
        answer = self.http.post("/v1/attempts", json=body)
        assert answer.status_code == 200, answer.text
        return answer.json()

    def status(self, capture_key: str = "att-1") -> dict[str, Any]:
        """``GET /v1/attempts/{capture_key}``."""
        answer = self.http.get(f"/v1/attempts/{capture_key}")
        assert answer.status_code == 200, answer.text
        return answer.json()

    def state(self, capture_key: str = "att-1") -> AttemptState:
        """The attempt folded straight from the ledger."""
        return self.service.log.load(capture_key)

    def written(self) -> tuple[int, int]:
        """(events in the ledger, blobs in the store): what a refused request must not change."""
        return self.service.log.store.count(), len(self.service.blobs.list_keys())

    def generated(self, capture_key: str, call_id: str) -> tuple[list[int], list[float]]:
        """The generated tokens and logprobs stored in a committed call's blob."""
        committed = self.state(capture_key).calls[call_id].committed
        assert committed is not None
        delta = self.service.blobs.get_delta(
            BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        )
        return delta.generated.tolist(), delta.logprobs.tolist()


@contextmanager
def serve(
    database_url: str, blob_url: str, serving: Engine | None = None, **options: Any
) -> Iterator[Gateway]:
    """A gateway over ``database_url`` and ``blob_url`` served on 127.0.0.1 in a thread, with
    ``serving`` as its engine (default: the shared embedded engine)."""
    migrate.upgrade(database_url)
    store = EventStore.open(database_url)
    blobs = open_blob_store(blob_url)
    renderer = Renderer(tokenizer())
    service = CaptureService(
        AttemptLog(store), blobs, renderer, serving or engine(), model_fingerprint=MODEL
    )
    options.setdefault("selector", LedgerSelector())
    options.setdefault("max_context", CONTEXT)
    app = create_app(service, model_name=MODEL, on_shutdown=store.close, **options)
    tokens = AttemptTokens()
    with (
        ServerThread(app) as server,
        httpx.Client(base_url=server.base_url, event_hooks=tokens.hooks) as http,
        httpx.Client(base_url=server.base_url) as bare,
    ):
        yield Gateway(server.base_url, service, http, server, tokens, bare)
