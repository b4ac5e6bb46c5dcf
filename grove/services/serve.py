"""``grove serve``: the capture gateway wired to a workspace's ledger, blob store and engine.

``build_gateway`` checks the ledger's schema revision (``grove.ledger.migrate.require_current``: it
never changes a PostgreSQL schema; a SQLite ledger is created on first use) and opens it, opens
the blob store, builds the embedded tokenizer and engine unless an engine is given, and hands
``grove.capture.gateway.create_app`` a selector built from ``training/selection.py`` — the
application layer is the one place that may join capture and training. ``run_server`` serves an
application with uvicorn until interrupted; ``ServerThread`` serves one in a background thread
(tests, and the demo's in-process gateway). ``gateway_options`` reads the gateway's keys of a
configuration (``grove serve`` and ``grove train`` both pass it to ``build_gateway``), whose own
defaults are the schema's (``grove.config``), so a gateway configured with nothing serves as a
training run configured with nothing does.

The selector (``LedgerSelector``) reads the attempt's calls as the projector does
(``grove.training.projector.captured_calls``: late commits count as pending, calls the harness
rejected stay committed and are marked rejected; fingerprints are the ones capture recorded,
``ledger/fingerprint.py``), and:

- the result's returned items (``output`` and ``responses[].output``) are normalized the way
  capture normalizes requests (``docs/normalization.md``), so Chat messages and Responses items
  fingerprint alike (a Messages turn is first mapped to the Chat message it stands for,
  ``grove.capture.messages_api.returned_turns``), and an item that echoes a response id of the
  attempt as its ``id`` carries it as ``response_id``;
- the attempt's policy is looked up in the server's ``PolicyRegistry`` (the built-ins and the
  custom policy of its configuration, resolved when the gateway is built), never imported by
  name; the gateway refuses to open an attempt naming another (``AttemptSettings``).
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import uvicorn
from fastapi import FastAPI
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
from uvicorn.config import LOG_LEVELS

from grove.capture.attempt_settings import AttemptSettings
from grove.capture.embedded import EMBEDDED_MODEL_NAME, EmbeddedEngine, build_tokenizer
from grove.capture.embedded_vlm import EmbeddedVLMEngine, build_vlm_renderer
from grove.capture.engine import Engine
from grove.capture.errors import NormalizationError
from grove.capture.gateway import create_app
from grove.capture.lifecycle import CaptureService
from grove.capture.limits import GatewayLimits
from grove.capture.messages_api import returned_turns
from grove.capture.render import Renderer, normalize_messages
from grove.capture.reward_bound import DEFAULT_MAX_ABS_REWARD
from grove.capture.slow_clients import server_options
from grove.capture.vllm import VllmEngine
from grove.config import EngineConfig, GroveConfig, TokenCaptureConfig
from grove.engines.models import context_length
from grove.errors import JobError
from grove.ledger import migrate
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.events import RolloutSelected
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.training.projector import captured_calls
from grove.training.selection import PolicyRegistry
from grove.workspace import Workspace

__all__ = [
    "GatewayStartError",
    "LedgerSelector",
    "ServerThread",
    "build_gateway",
    "gateway_options",
    "run_server",
]

_CAPTURE = TokenCaptureConfig()  # the schema's defaults, the one place they are written
_ENGINE = EngineConfig()


class GatewayStartError(JobError):
    """A gateway served in a thread did not bind its socket in time (its log says why)."""


def gateway_options(config: GroveConfig) -> dict[str, Any]:
    """``build_gateway``'s keyword arguments that ``config`` sets: ``engine.auth_token``,
    ``engine.default_max_tokens``, ``token_capture.pending_call_timeout_s`` (the settle timeout),
    ``token_capture.selection_policy``, ``token_capture.forest_training``,
    ``token_capture.max_model_calls`` and ``token_capture.strict``, the ``gateway.limits`` and
    ``grpo.max_abs_reward``."""
    capture = config.token_capture
    return {
        "auth_token": config.engine.auth_token,
        "default_max_tokens": config.engine.default_max_tokens,
        "settle_timeout_s": capture.pending_call_timeout_s,
        "selection_policy": capture.selection_policy,
        "forest_mode": capture.forest_training,
        "max_model_calls": capture.max_model_calls,
        "strict": capture.strict,
        "limits": config.gateway.limits.capture(),
        "max_abs_reward": config.grpo.max_abs_reward,
    }


class LedgerSelector:
    """A gateway selector: the attempt's calls as ``CapturedCall`` records, the result normalized,
    then ``grove.training.selection.select_rollout`` with the attempt's own selection policy, looked
    up in ``policies`` (default: the built-ins only).

    Raises ``ValueError`` (``SelectionError``, ``SelectionPolicyError``) when the result cannot
    select calls, or the attempt names a policy ``policies`` does not hold; the gateway answers
    422 with the message.
    """

    def __init__(self, policies: PolicyRegistry | None = None) -> None:
        self.policies = policies or PolicyRegistry.of()

    def __call__(self, state: AttemptState, result: dict[str, Any]) -> RolloutSelected:
        """The ``rollout.selected`` event for ``state`` and the harness's ``result``."""
        if state.opened is None:
            raise ValueError(f"attempt {state.capture_key!r} was never opened")
        records = captured_calls(state)
        served = {r.response_id for r in records if r.response_id is not None}
        normalized = normalized_result(result, served)
        selection = self.policies.select(state.opened.selection_policy, records, normalized)
        return RolloutSelected(
            policy=selection.policy,
            call_ids=selection.call_ids,
            terminal_response_id=selection.terminal_response_id,
            reward=selection.reward,
            result=normalized,
        )


def normalized_result(result: Mapping[str, Any], served: set[str]) -> dict[str, Any]:
    """``result`` with its returned items normalized as capture normalizes requests.

    ``served`` holds the attempt's response ids: an item whose echoed ``id`` is one of them (a
    Responses output item sent back as it came) gets it as ``response_id``. Items that
    normalization refuses are left as they are, for the policy to judge.
    """
    normalized = dict(result)
    if isinstance(result.get("output"), list):
        normalized["output"] = _normalized_items(result["output"], served)
    responses = result.get("responses")
    if isinstance(responses, list):
        normalized["responses"] = [
            {**response, "output": _normalized_items(response["output"], served)}
            if isinstance(response, Mapping) and isinstance(response.get("output"), list)
            else response
            for response in responses
        ]
    return normalized


def _normalized_items(items: list[Any], served: set[str]) -> list[Any]:
    try:
        request = normalize_messages(returned_turns(items))
    except NormalizationError:
        return items
    messages = []
    for message, echoed in zip(request.messages, request.echoed_ids, strict=True):
        known = [i for i in echoed if i in served]
        if "response_id" not in message and len(known) == 1:
            message = {**message, "response_id": known[0]}
        messages.append(message)
    return messages


def build_gateway(
    workspace: Workspace,
    *,
    engine: Engine | None = None,
    auth_token: str | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    model_name: str = EMBEDDED_MODEL_NAME,
    max_context: int | None = None,
    default_max_tokens: int = _ENGINE.default_max_tokens,
    settle_timeout_s: float = _CAPTURE.pending_call_timeout_s,
    selection_policy: str = _CAPTURE.selection_policy,
    forest_mode: bool = _CAPTURE.forest_training,
    max_model_calls: int | None = _CAPTURE.max_model_calls,
    strict: bool = _CAPTURE.strict,
    image_processor: Any | None = None,
    limits: GatewayLimits | None = None,
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
) -> FastAPI:
    """The gateway over ``workspace``: ledger checked and opened, blob store, engine, selector.
    Each option a configuration key sets defaults to the schema's default (``gateway_options``
    reads them all from a configuration).

    Defaults: the embedded tokenizer and engine (``capture/embedded.py``). ``max_context``
    defaults to the engine's context (the embedded model's, or the vLLM server's ``max_model_len``,
    read now), so too-long prompts are refused before anything is written. Another engine must
    serve a model whose tokenizer is ``tokenizer`` (default: the embedded one). The ledger is
    closed when the application shuts down.

    ``selection_policy`` (``token_capture.selection_policy``) is the server's policy: attempts
    that name none get it, and a custom ``module:function`` is resolved now
    (``SelectionPolicyError`` before anything is served) and registered, so attempts may name it
    or a built-in, nothing else. ``forest_mode`` (``token_capture.forest_training``) is the
    forest mode of attempts that give none. ``max_model_calls``
    (``token_capture.max_model_calls``) bounds the model calls of one attempt. ``strict``
    (``token_capture.strict``) refuses unexplained roots (``docs/normalization.md``, "Strict mode").

    An embedded vision-language engine (``capture/embedded_vlm.py``) gets a renderer that
    processes images with ``image_processor`` (default: the embedded one) and expands their
    placeholders (``docs/media.md``); any other engine's renderer refuses image parts.

    ``limits`` (``gateway.limits``; default: ``GatewayLimits()``) bound every request
    (``capture/limits.py``); ``run_server`` and ``ServerThread`` serve the application with the
    server settings of its limits (``capture/slow_clients.py``). ``max_abs_reward``
    (``grpo.max_abs_reward``) bounds the reward a result may carry (``capture/reward_bound.py``).
    """
    policies = PolicyRegistry.of(selection_policy)
    migrate.require_current(workspace.database_url, create_embedded=True)
    tokenizer = tokenizer or build_tokenizer()
    # the embedded model is sized for a fast tokenizer (the embedded one, unless one is given)
    engine = engine or EmbeddedEngine.build(cast(PreTrainedTokenizerFast, tokenizer))
    if max_context is None and isinstance(engine, EmbeddedEngine):
        max_context = context_length(engine.model)
    elif max_context is None and isinstance(engine, VllmEngine):
        max_context = engine.context_length()
    store = EventStore.open(workspace.database_url)
    blobs = open_blob_store(workspace.blob_url)
    renderer = (
        build_vlm_renderer(tokenizer, image_processor)  # type: ignore[arg-type]
        if isinstance(engine, EmbeddedVLMEngine)
        else Renderer(tokenizer)
    )
    service = CaptureService(
        AttemptLog(store), blobs, renderer, engine, model_fingerprint=model_name, strict=strict
    )
    return create_app(
        service,
        selector=LedgerSelector(policies),
        model_name=model_name,
        auth_token=auth_token,
        max_context=max_context,
        default_max_tokens=default_max_tokens,
        settle_timeout_s=settle_timeout_s,
        attempts=AttemptSettings(policies.names, policies.default, forest_mode, max_model_calls),
        limits=limits,
        max_abs_reward=max_abs_reward,
        on_shutdown=store.close,
    )


def run_server(
    app: FastAPI,
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    on_listening: Callable[[str], None] | None = None,
) -> None:
    """Serve ``app`` with uvicorn on ``host``:``port`` until interrupted. The socket is bound
    first, so ``on_listening`` gets the real ``http://host:port`` (port 0 picks a free one); a
    port that cannot be bound is a ``GatewayStartError``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as error:
        sock.close()
        raise GatewayStartError(
            f"cannot listen on {host}:{port} ({error.strerror or error}): pick another "
            "engine.port (--port), or 0 for a free one"
        ) from error
    bound = sock.getsockname()[1]
    if on_listening is not None:
        on_listening(
            f"http://[{host}]:{bound}" if family == socket.AF_INET6 else f"http://{host}:{bound}"
        )
    config = uvicorn.Config(app, host=host, port=bound, log_level="info", **_server_options(app))
    uvicorn.Server(config).run(sockets=[sock])


def _server_options(app: FastAPI) -> dict[str, Any]:
    """uvicorn's settings for the limits of a gateway ``app`` (the defaults for another app), on
    uvloop's event loop (a dependency: it takes a fifth of the gateway's CPU per call off,
    ``docs/benchmarks.md``, "The cuts")."""
    return {**server_options(getattr(app.state, "limits", None)), "loop": "uvloop"}


class ServerThread:
    """``app`` served by uvicorn in a daemon thread; ``base_url`` once started.

    Use as a context manager: ``with ServerThread(app) as server: server.base_url``. Port 0
    picks a free port.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, *, log_level: str = "warning"
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="on",
            # Below info level no access line is written: none is formatted either.
            access_log=LOG_LEVELS[log_level] <= logging.INFO,
            **_server_options(app),
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="grove-gateway", daemon=True)

    def start(self, timeout_s: float = 30.0) -> ServerThread:
        """Start serving; returns when the socket is bound (or raises after ``timeout_s``)."""
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise GatewayStartError(
                    f"the gateway did not start within {timeout_s:g} s (see the uvicorn log "
                    "above): is its port taken?"
                )
            time.sleep(0.01)
        return self

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the bound socket."""
        sockets: Sequence[Any] = self.server.servers[0].sockets
        host, port = sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop serving and wait for the thread (running the app's shutdown)."""
        self.server.should_exit = True
        self.thread.join(timeout_s)

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
