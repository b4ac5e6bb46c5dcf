"""The HTTP gateway: OpenAI-compatible endpoints that capture every model call of an attempt.

A harness points any OpenAI-compatible client at the gateway and names its attempt with the
``X-Grove-Capture-Key`` header (the official ``openai`` client sets it through
``default_headers``). Each ``/v1/chat/completions`` or ``/v1/responses`` request is one model call
through ``grove.capture.lifecycle.CaptureService``: admitted, planned, intended, generated, stored
and committed before the answer is sent. The attempt endpoints open an attempt, close its
admissions, take the harness's ordinary result (which settles the attempt and records the selection
through the injected selector), reject a completed response, measure a request and report status.

Request bodies are converted by ``capture/conversion.py``, answered by ``capture/chat_api.py``
and ``capture/responses_api.py``, and streamed (buffered) by ``capture/streaming.py``. Refusals
are 4xx answers with an OpenAI-style body ``{"error": {"message", "type", "code", "param"}}``,
all translated in ``capture/refusals.py``: every Grove error class has its status in one table,
``grove.capture.wire.ERROR_STATUS``; refusals that only the HTTP layer knows (``n > 1``,
provider-managed state, an unknown attempt, ...) are raised with their own codes. Everything that
can be refused is checked before the call's intent is recorded, so a refused request writes
nothing. The
exceptions are refusals only the engine can make after the intent (a sampling parameter it
cannot honour exactly; a prompt too long when ``max_context`` is not given): the lifecycle
records those as ``call.failed`` (``engine_error``). ``docs/gateway.md`` documents it all.

``capture`` must not import ``training``: the selection policy arrives as the ``selector``
callable (``grove/services/serve.py`` builds it from ``training/selection.py``). A selector raises
``ValueError`` (``grove.training.errors.SelectionError`` is one) when the result cannot select
calls; the gateway answers 422 with its message. An attempt with no accepted generation (a
first-call failure) selects no call, so its result is always taken and its prompt group completes.

The server, never an HTTP client, decides which selection policies run and the defaults of an
attempt (``capture/attempt_settings.py``). A client that disconnects mid-call does not stop the
call; a committed call whose answer was not delivered records the cancellation
(``capture/delivery.py``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from typing import Annotated, Any, Final, TypeVar

from fastapi import Depends, FastAPI, Header, Request, Response
from fastapi.telemetry import TelemetryConfig
from starlette.concurrency import run_in_threadpool

from grove.capture.attempt_settings import AttemptSettings
from grove.capture.body_limits import BodyLimits, CheckedBodyRoute
from grove.capture.capabilities import (
    AttemptToken,
    OpenedAttempt,
    SourceToken,
    gateway_token_check,
)
from grove.capture.chat_api import ChatCompletion, ChatCompletionRequest, chat_completion
from grove.capture.conversations import (
    chain_conversation,
    chat_messages,
    messages_conversation,
    responses_input,
)
from grove.capture.gateway_service import GatewayService, Selector
from grove.capture.headers import (
    CALL_ID_HEADER,
    CAPTURE_KEY_HEADER,
    DECISION_HEADER,
    PARENT_CALL_ID_HEADER,
    ROOT_REASON_HEADER,
)
from grove.capture.lifecycle import CallOutcome, CaptureService
from grove.capture.limits import GatewayLimits
from grove.capture.media import MediaRenderer
from grove.capture.messages_api import (
    AnthropicMessage,
    MessagesRequest,
    message_object,
    messages_sse,
)
from grove.capture.messages_errors import MessagesConventions
from grove.capture.refusals import install_error_handlers
from grove.capture.responses_api import ResponseObject, ResponsesRequest, response_object
from grove.capture.reward_bound import DEFAULT_MAX_ABS_REWARD
from grove.capture.streaming import chat_sse, responses_sse
from grove.capture.wire import (
    AttemptStatus,
    ErrorBody,
    HarnessResult,
    HealthStatus,
    Measurement,
    ModelCard,
    ModelList,
    OpenAttemptRequest,
    RejectRequest,
    attempt_status,
)
from grove.ledger.attempt import DEFAULT_SETTLE_TIMEOUT_S

__all__ = [
    "CALL_ID_HEADER",
    "CAPTURE_KEY_HEADER",
    "DECISION_HEADER",
    "DEFAULT_MAX_TOKENS",
    "PARENT_CALL_ID_HEADER",
    "ROOT_REASON_HEADER",
    "Selector",
    "create_app",
]

DEFAULT_MAX_TOKENS: Final = 256

_NO_TELEMETRY: Final = TelemetryConfig(tracing=False, metrics=False, logs=False)
"""FastAPI's native OpenTelemetry off (a supported setting): otherwise every request looks up the
global providers and an environment variable to find it has nothing to record."""

_ANSWERS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorBody} for status in (400, 401, 403, 404, 409, 422, 500, 501, 502, 503)
}


_Endpoint = TypeVar("_Endpoint", bound=Callable[..., Any])

_Answered = tuple[CallOutcome, Any, Iterator[str] | None]
"""A model call's outcome, its answer object and, when streamed, its events (to deliver)."""

CaptureKey = Annotated[
    str | None,
    Header(alias=CAPTURE_KEY_HEADER, description="the attempt this model call belongs to"),
]
CallId = Annotated[
    str | None,
    Header(alias=CALL_ID_HEADER, description="the call id to record (default: a fresh one)"),
]


async def _attempt_in_path(
    connection: Request, capture_key: str, token: AttemptToken = None
) -> str:
    """A route on an attempt checks the attempt's token first, before reading its body; the
    route takes the capture key from here (its path and headers are read once)."""
    await connection.app.state.gateway.authorize(capture_key, token)
    return capture_key


async def _attempt_in_header(
    connection: Request,
    capture_key: CaptureKey = None,
    call_id: CallId = None,
    token: AttemptToken = None,
) -> tuple[str | None, str | None]:
    """A model call checks its attempt's token first (naming no attempt: refused later); the
    route takes the capture key and call id its headers name from here."""
    if capture_key:
        await connection.app.state.gateway.authorize(capture_key, token)
    return capture_key, call_id


OnAttempt = Annotated[str, Depends(_attempt_in_path)]
"""The capture key in a route's path, its attempt's token checked."""
NamedCall = Annotated[tuple[str | None, str | None], Depends(_attempt_in_header)]
"""``(capture key, call id)`` a model call names in its headers, its attempt's token checked."""


def create_app(
    service: CaptureService,
    *,
    selector: Selector | None,
    model_name: str,
    auth_token: str | None = None,
    max_context: int | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    settle_timeout_s: float = DEFAULT_SETTLE_TIMEOUT_S,
    attempts: AttemptSettings | None = None,
    max_abs_reward: float = DEFAULT_MAX_ABS_REWARD,
    limits: GatewayLimits | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The gateway as a FastAPI application over ``service``.

    ``selector`` turns a settled attempt and the harness's result into ``rollout.selected``
    (None: ``/result`` answers 501). ``model_name`` is the one model served (requests naming
    another get 404). ``auth_token`` set: every route but ``/health`` and the OpenAPI schema
    needs ``Authorization: Bearer <token>``. ``max_context`` (the model's context length) lets
    the gateway refuse a too-long prompt before anything is written, and cap the default
    ``max_tokens`` (``default_max_tokens``, used when a request gives none) to the room left.
    ``settle_timeout_s`` bounds the wait for pending calls when a result arrives. ``attempts``:
    the selection policies an attempt may name and the defaults of one that names none (default:
    the built-in policies, ``returned_history``, forest mode on). ``max_abs_reward`` bounds a
    result's reward. Every request on an attempt needs its token (``capture/capabilities.py``).
    ``limits`` bound what one request may make the gateway read, hold and store (default:
    ``GatewayLimits()``; ``capture/limits.py``): bodies are checked before the app sees them
    (``capture/body_limits.py``), images by the renderer, heads by the server
    (``app.state.limits``, ``capture/slow_clients.py``).
    ``on_shutdown`` runs when the application stops (e.g. closing the ledger).
    """
    if max_context is not None and max_context < 1:
        raise ValueError(f"max_context must be >= 1 when given, got {max_context}")
    if default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    gateway = GatewayService(
        service,
        selector,
        model_name,
        max_context,
        default_max_tokens,
        settle_timeout_s,
        attempts or AttemptSettings(),
        max_abs_reward,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(
        title="Grove capture gateway",
        version="1",
        summary="OpenAI-compatible endpoints that record every model call of an attempt.",
        lifespan=lifespan,
        telemetry=_NO_TELEMETRY,
    )
    app.state.gateway = gateway
    app.state.limits = limits = limits or GatewayLimits()
    app.add_middleware(BodyLimits, limits=limits)
    app.add_middleware(MessagesConventions)  # outermost: body-limit refusals get its envelope
    if isinstance(service.renderer, MediaRenderer):
        service.renderer.vision.limits = limits
    install_error_handlers(app)

    guard = [] if auth_token is None else [Depends(gateway_token_check(auth_token))]
    api = _Routes(app, "/v1", guard)

    @app.get("/health", response_model=HealthStatus)
    async def health() -> HealthStatus:
        """Liveness; open even when a token is required."""
        return HealthStatus(model=model_name)

    @api.get("/models", response_model=ModelList)
    async def models() -> ModelList:
        """The one model this gateway serves."""
        return ModelList(data=[ModelCard(id=model_name)])

    @api.post(
        "/chat/completions",
        response_model=ChatCompletion,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def chat_completions(
        request: ChatCompletionRequest,
        response: Response,
        connection: Request,
        named: NamedCall,
    ) -> Any:
        """One model call in OpenAI Chat Completions form (``n`` = 1); ``stream=true`` answers
        with buffered chunks."""
        capture_key, call_id = named

        def call() -> _Answered:
            converted = gateway.converter.chat_call(request, call_id)
            outcome = gateway.generate(capture_key, converted)
            logprobs = gateway.token_logprobs(outcome) if converted.logprobs else None
            answer = chat_completion(outcome, model_name, logprobs)
            usage = bool((request.stream_options or {}).get("include_usage"))
            events = chat_sse(answer, include_usage=usage) if request.stream else None
            return outcome, answer, events

        return await gateway.deliver(connection, response, *await run_in_threadpool(call))

    @api.post(
        "/responses",
        response_model=ResponseObject,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def responses(
        request: ResponsesRequest,
        response: Response,
        connection: Request,
        named: NamedCall,
    ) -> Any:
        """One model call in OpenAI Responses form; ``stream=true`` answers with buffered SSE."""
        capture_key, call_id = named

        def call() -> _Answered:
            converted = gateway.converter.responses_call(request, call_id)
            outcome = gateway.generate(capture_key, converted)
            logprobs = gateway.token_logprobs(outcome) if converted.logprobs else None
            answer = response_object(outcome, model_name, request, logprobs)
            events = responses_sse(answer) if request.stream else None
            return outcome, answer, events

        return await gateway.deliver(connection, response, *await run_in_threadpool(call))

    @api.post(
        "/messages",
        response_model=AnthropicMessage,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    async def messages(
        request: MessagesRequest,
        response: Response,
        connection: Request,
        named: NamedCall,
    ) -> Any:
        """One model call in Anthropic Messages form (``capture/messages_api.py``); errors in
        Anthropic's envelope; ``stream=true`` answers with buffered Messages events."""
        capture_key, call_id = named

        def call() -> _Answered:
            converted = gateway.converter.messages_call(request, call_id)
            outcome = gateway.generate(capture_key, converted)
            stops = zip(
                converted.call.sampling.stop_token_ids, request.stop_sequences or (), strict=True
            )
            answer = message_object(outcome, model_name, dict(stops))
            events = messages_sse(answer) if request.stream else None
            return outcome, answer, events

        return await gateway.deliver(connection, response, *await run_in_threadpool(call))

    @api.post("/attempts", response_model=OpenedAttempt)
    async def open_attempt(
        request: OpenAttemptRequest, token: AttemptToken = None, source_token: SourceToken = None
    ) -> OpenedAttempt:
        """Open an attempt: one execution of the harness for one logical rollout. Answers its
        token (``token``: the caller's proposal, or the token of a repeated opening). A fork
        (``fork_from``) needs its source attempt's token (``source_token``)."""

        def opening() -> OpenedAttempt:
            opened = gateway.open(request, token, source_token)
            return _with_source_answer(gateway.service, opened)

        return await run_in_threadpool(opening)

    @api.get("/attempts/{capture_key}", response_model=AttemptStatus)
    async def get_attempt(capture_key: OnAttempt) -> AttemptStatus:
        """The attempt's calls (status, parent, decision), pending calls, and selection; for a
        fork, its source call and that call's answer."""

        def status() -> AttemptStatus:
            return _with_source_answer(gateway.service, attempt_status(gateway.opened(capture_key)))

        return await run_in_threadpool(status)

    @api.post("/attempts/{capture_key}/close", response_model=AttemptStatus)
    async def close_attempt(capture_key: OnAttempt) -> AttemptStatus:
        """The harness returned: the attempt admits no more calls."""
        return await run_in_threadpool(gateway.close, capture_key)

    @api.post("/attempts/{capture_key}/result", response_model=AttemptStatus)
    async def post_result(capture_key: OnAttempt, result: HarnessResult) -> AttemptStatus:
        """The harness's ordinary result: settle, then record the selection and reward."""
        fields = result.model_dump(exclude_unset=True)
        return await run_in_threadpool(gateway.result, capture_key, fields)

    @api.post(
        "/attempts/{capture_key}/calls/{call_id}/reject",
        response_model=AttemptStatus,
        # the check as a dependency: the route's own path parameters keep their schema order
        dependencies=[Depends(_attempt_in_path)],
    )
    async def reject_call(
        capture_key: str, call_id: str, request: RejectRequest | None = None
    ) -> AttemptStatus:
        """The harness rejected this completed response (``rejected_by_harness``)."""
        detail = "" if request is None else request.detail
        return await run_in_threadpool(gateway.reject, capture_key, call_id, detail)

    @api.post("/attempts/{capture_key}/measure", response_model=Measurement)
    async def measure(
        capture_key: OnAttempt, request: ChatCompletionRequest | ResponsesRequest
    ) -> Measurement:
        """Prompt tokens and decision for a chat or responses body; writes nothing."""

        def measured() -> Measurement:
            if isinstance(request, ChatCompletionRequest):
                return gateway.measure(capture_key, gateway.converter.chat_call(request, None))
            return gateway.measure(capture_key, gateway.converter.responses_call(request, None))

        return await run_in_threadpool(measured)

    return app


class _Routes:
    """Routes under ``prefix`` behind ``guard`` (run before a route's own dependencies), with
    Grove's error answers documented, made on the app's own router as an ``APIRouter`` included
    with that prefix would make them (same paths, dependencies and OpenAPI schema): FastAPI
    matches an included router's routes twice per request. Each takes the parsed body from
    ``BodyLimits`` (``CheckedBodyRoute``)."""

    def __init__(self, app: FastAPI, prefix: str, guard: list[Any]) -> None:
        self.app, self.prefix, self.guard = app, prefix, guard

    def get(self, path: str, **options: Any) -> Callable[[_Endpoint], _Endpoint]:
        """``@router.get``."""
        return self._route("GET", path, **options)

    def post(self, path: str, **options: Any) -> Callable[[_Endpoint], _Endpoint]:
        """``@router.post``."""
        return self._route("POST", path, **options)

    def _route(
        self,
        method: str,
        path: str,
        *,
        dependencies: list[Any] | None = None,
        responses: dict[int | str, dict[str, Any]] | None = None,
        **options: Any,
    ) -> Callable[[_Endpoint], _Endpoint]:
        def add(endpoint: _Endpoint) -> _Endpoint:
            self.app.router.add_api_route(
                self.prefix + path,
                endpoint,
                methods=[method],
                dependencies=[*self.guard, *(dependencies or ())],
                responses={**_ANSWERS, **(responses or {})},
                route_class_override=CheckedBodyRoute,
                **options,
            )
            return endpoint

        return add


S = TypeVar("S", bound=AttemptStatus)


def _with_source_answer(service: CaptureService, status: S) -> S:
    """``status`` with its fork source's answer (the source call's exact generated text) and
    conversation, in each API's form (``grove.capture.conversations``)."""
    if status.fork_from is None:
        return status
    view = service.views.view(status.capture_key, read=False)
    fork = view.state.opened.fork_from if view.state.opened is not None else None
    if fork is None:
        return status
    answer = service.views.parent_outputs(view, fork.source_call_id)[-1].text
    items = chain_conversation(service.blobs, fork.chain)
    update: dict[str, Any] = {"answer": answer}
    if items is not None:
        update["messages"] = chat_messages(items)
        update["input"] = responses_input(items)
        update["messages_api"] = messages_conversation(items)
    return status.model_copy(update={"fork_from": status.fork_from.model_copy(update=update)})
