"""The HTTP gateway: OpenAI-compatible endpoints that capture every model call of an attempt.

A harness points any OpenAI-compatible client at the gateway and names its attempt with the
``X-Grove-Capture-Key`` header (the official ``openai`` client sets it through
``default_headers``). Each ``/v1/chat/completions`` or ``/v1/responses`` request is one model call
through ``capture.lifecycle.CaptureService``: admitted, planned, intended, generated, stored and
committed before the answer is sent. The attempt endpoints open an attempt, close its admissions,
take the harness's ordinary result (which settles the attempt and records the selection through
the injected selector), reject a completed response, measure a request and report status.

Refusals are 4xx answers with an OpenAI-style body ``{"error": {"message", "type", "code"}}``.
Every Grove error class has its status in one table, ``capture.wire.ERROR_STATUS``; refusals
that only the HTTP layer knows (streaming from the engine, ``n > 1``, provider-managed state,
an unknown attempt, ...) are raised here with their own codes. Everything that can be refused
is checked before the call's intent is recorded, so a refused request writes nothing. The
exceptions are refusals only the engine can make after the intent (a sampling parameter it
cannot honour exactly; a prompt too long when ``max_context`` is not given): the lifecycle
records those as ``call.failed`` (``engine_error``). ``docs/gateway.md`` documents it all.

``capture`` must not import ``training``: the selection policy arrives as the ``selector``
callable (``grove/jobs/serve.py`` builds it from ``training/selection.py``). A selector raises
``ValueError`` (``training.errors.SelectionError`` is one) when the result cannot select calls;
the gateway answers 422 with its message.
"""

from __future__ import annotations

import hmac
import json
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, FastAPI, Header, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from capture import errors as capture_errors
from capture.engine import SamplingParams
from capture.lifecycle import CallOutcome, CaptureService, ModelCall
from capture.render import RenderOptions
from capture.wire import (
    AttemptStatus,
    ChatCompletion,
    ChatCompletionRequest,
    ErrorBody,
    HarnessResult,
    HealthStatus,
    Measurement,
    ModelCard,
    ModelList,
    OpenAttemptRequest,
    RejectRequest,
    ResponseObject,
    ResponsesRequest,
    TokenLogprob,
    attempt_status,
    chat_completion,
    error_body,
    error_status,
    response_events,
    response_object,
)
from ledger import errors as ledger_errors
from ledger.attempt import AttemptState, CallStatus
from ledger.events import RolloutSelected
from ledger.store import validate_stream_id
from storage import errors as storage_errors
from storage import staging_key

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

CAPTURE_KEY_HEADER: Final = "X-Grove-Capture-Key"
"""Request header naming the attempt (its capture key) a model call belongs to; required."""
CALL_ID_HEADER: Final = "X-Grove-Call-Id"
"""Request header naming the call id to record (optional; a fresh id otherwise). Answered on
every generation with the id the call was recorded under."""
DECISION_HEADER: Final = "X-Grove-Decision"
"""Answer header: ``root`` or ``continuation``."""
PARENT_CALL_ID_HEADER: Final = "X-Grove-Parent-Call-Id"
"""Answer header: the parent call of a continuation."""
ROOT_REASON_HEADER: Final = "X-Grove-Root-Reason"
"""Answer header: why the call is a root (``docs/normalization.md``)."""
DEFAULT_MAX_TOKENS: Final = 256
DEFAULT_SETTLE_TIMEOUT_S: Final = 300.0
_STATE_CACHE_SIZE: Final = 4096

Selector = Callable[[AttemptState, dict[str, Any]], RolloutSelected]
"""``(settled attempt state, harness result) -> rollout.selected``; raises ``ValueError`` when
the result cannot select calls. Injected by the application (``grove/jobs/serve.py``)."""


_ANSWERS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorBody} for status in (400, 401, 404, 409, 422, 500, 502, 503)
}


class _Refused(Exception):
    """A refusal only the HTTP layer knows; answered as an OpenAI error body, never raised out."""

    def __init__(self, status: int, code: str, message: str, param: str | None = None) -> None:
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        super().__init__(message)


def _error_response(status: int, code: str, message: str, param: str | None = None) -> JSONResponse:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    body = error_body(status, code, message, param)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


def _validation_message(error: RequestValidationError) -> tuple[str, str | None]:
    problems = []
    params = []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"] if part != "body") or "body"
        params.append(where)
        if item["type"] == "extra_forbidden":
            problems.append(f"{where}: Grove does not accept this field (see docs/gateway.md)")
        else:
            problems.append(f"{where}: {item['msg']}")
    return "Invalid request: " + "; ".join(problems), (params[0] if params else None)


@dataclass(frozen=True)
class _Call:
    """A request converted for the lifecycle: the model call, and whether max tokens was given."""

    call: ModelCall
    explicit_max_tokens: bool


class _Gateway:
    """The gateway's behaviour behind the routes: conversion, refusals, attempt bookkeeping."""

    def __init__(
        self,
        service: CaptureService,
        selector: Selector | None,
        model_name: str,
        max_context: int | None,
        default_max_tokens: int,
        settle_timeout_s: float,
    ) -> None:
        self.service = service
        self.selector = selector
        self.model_name = model_name
        self.max_context = max_context
        self.default_max_tokens = default_max_tokens
        self.settle_timeout_s = settle_timeout_s
        self._states: OrderedDict[str, AttemptState] = OrderedDict()
        self._lock = threading.Lock()

    # -- attempts ----------------------------------------------------------------------------

    def state(self, capture_key: str) -> AttemptState:
        """The attempt's state, read incrementally from the ledger (only events not yet seen)."""
        validate_stream_id(capture_key)
        with self._lock:
            cached = self._states.get(capture_key) or AttemptState(capture_key)
        state = self.service.log.refresh(cached)
        with self._lock:
            latest = self._states.get(capture_key)
            if latest is None or latest.version <= state.version:
                self._states[capture_key] = state
            self._states.move_to_end(capture_key)
            while len(self._states) > _STATE_CACHE_SIZE:
                self._states.popitem(last=False)
        return state

    def opened(self, capture_key: str) -> AttemptState:
        """The state of an attempt that was opened; 404 otherwise."""
        state = self.state(capture_key)
        if state.opened is None:
            raise _Refused(
                404,
                "unknown_attempt",
                f"Unknown attempt {capture_key!r}: open it with POST /v1/attempts first (the "
                f"{CAPTURE_KEY_HEADER} header names an attempt that was opened)",
            )
        return state

    def admitting(self, capture_key: str | None, call_id: str | None) -> AttemptState:
        """The state of an attempt that admits a new call ``call_id``; refused otherwise."""
        if not capture_key:
            raise _Refused(
                400,
                "missing_capture_key",
                f"Every model call names its attempt: send the {CAPTURE_KEY_HEADER} header "
                "(with the openai client: default_headers={'" + CAPTURE_KEY_HEADER + "': KEY})",
            )
        state = self.opened(capture_key)
        if state.admissions_closed:
            raise _Refused(
                409,
                "attempt_closed",
                f"Attempt {capture_key!r} admits no more calls: the harness already returned "
                "(admissions are closed); open a new attempt",
            )
        if call_id is not None:
            staging_key(capture_key, call_id)  # the call id names a blob: check it now
            if call_id in state.calls:
                raise _Refused(
                    409,
                    "call_id_reused",
                    f"Call id {call_id!r} is already recorded in attempt {capture_key!r}; "
                    f"send a new {CALL_ID_HEADER} for every call (or none)",
                )
        return state

    def open(self, request: OpenAttemptRequest) -> AttemptStatus:
        """Open an attempt (idempotent for the same fields; 409 for different ones)."""
        validate_stream_id(request.capture_key)
        self.service.open_attempt(
            request.capture_key,
            rollout_id=request.rollout_id,
            prompt_group=request.prompt_group,
            rollout_index=request.rollout_index,
            policy_version=request.policy_version,
            forest_mode=request.forest_mode,
            selection_policy=request.selection_policy,
        )
        return attempt_status(self.opened(request.capture_key))

    def close(self, capture_key: str) -> AttemptStatus:
        """Close admissions: the harness returned."""
        self.opened(capture_key)
        self.service.close(capture_key)
        return attempt_status(self.opened(capture_key))

    def reject(self, capture_key: str, call_id: str, detail: str) -> AttemptStatus:
        """Record that the harness rejected a committed call's response (it will resample)."""
        call = self.opened(capture_key).calls.get(call_id)
        if call is None:
            raise _Refused(
                404, "unknown_call", f"Attempt {capture_key!r} has no call {call_id!r} to reject"
            )
        if call.status is not CallStatus.COMMITTED:
            raise _Refused(
                409,
                "call_not_committed",
                f"Only a completed response can be rejected: call {call_id!r} of attempt "
                f"{capture_key!r} is {call.status.value}",
            )
        self.service.fail(capture_key, call_id, "rejected_by_harness", detail)
        return attempt_status(self.opened(capture_key))

    def result(self, capture_key: str, result: dict[str, Any]) -> AttemptStatus:
        """Settle the attempt (the harness returned) and record the selection of its result.

        When nothing is pending the selector first runs on the current state, so a result
        whose evidence cannot select calls is refused before anything is written.
        """
        if self.selector is None:
            raise _Refused(
                501,
                "selection_not_configured",
                "This gateway records capture only: it was started without a selection policy, "
                "so it cannot record a result (serve it through grove serve)",
            )
        state = self.opened(capture_key)
        if state.settled is None and not state.pending_call_ids and state.selection is None:
            self._select(state, result)
        settled = self.service.settle(capture_key, self.settle_timeout_s)
        self.service.select(capture_key, self._select(settled, result))
        return attempt_status(self.opened(capture_key))

    def _select(self, state: AttemptState, result: dict[str, Any]) -> RolloutSelected:
        assert self.selector is not None
        try:
            return self.selector(state, result)
        except ValueError as error:
            raise _Refused(
                422,
                "selection_refused",
                f"The result of attempt {state.capture_key!r} cannot select its calls: {error}",
            ) from error

    # -- model calls -------------------------------------------------------------------------

    def chat_call(self, request: ChatCompletionRequest, call_id: str | None) -> _Call:
        """The model call a Chat Completions request asks for; refusals raised here."""
        self._check_model(request.model)
        if request.n is not None and request.n != 1:
            raise _Refused(
                400,
                "unsupported_n",
                f"n must be 1, got {request.n}: each choice is its own model call; send "
                "separate requests",
                "n",
            )
        if request.top_logprobs:
            raise _Refused(
                400,
                "unsupported_top_logprobs",
                f"top_logprobs must be 0 or absent, got {request.top_logprobs}: the engine "
                "reports the sampled token's logprob only (logprobs=true)",
                "top_logprobs",
            )
        max_tokens = request.max_tokens
        if request.max_completion_tokens is not None:
            if max_tokens is not None and max_tokens != request.max_completion_tokens:
                raise _Refused(
                    400,
                    "conflicting_max_tokens",
                    f"max_tokens ({max_tokens}) and max_completion_tokens "
                    f"({request.max_completion_tokens}) disagree; send one of them",
                    "max_completion_tokens",
                )
            max_tokens = request.max_completion_tokens
        options = RenderOptions(
            model=self.model_name,
            tools=None if request.tools is None else tuple(request.tools),
            tool_choice=request.tool_choice,
            reasoning_effort=request.reasoning_effort,
        )
        items = [message.model_dump(exclude_unset=True) for message in request.messages]
        sampling = self._sampling(
            max_tokens, request.temperature, request.top_p, request.seed, request.stop
        )
        return _Call(ModelCall(items, options, sampling, call_id), max_tokens is not None)

    def responses_call(self, request: ResponsesRequest, call_id: str | None) -> _Call:
        """The model call a Responses request asks for; refusals raised here."""
        self._check_model(request.model)
        if request.previous_response_id is not None or request.conversation is not None:
            param = "previous_response_id" if request.previous_response_id else "conversation"
            raise _Refused(
                400,
                "unsupported_provider_state",
                f"{param} is not supported: Grove keeps no provider-managed conversation state; "
                "send the whole input (earlier output items included) with every request",
                param,
            )
        if request.background:
            raise _Refused(
                400,
                "unsupported_background",
                "background responses are not supported: each call is answered when captured",
                "background",
            )
        if request.truncation == "auto":
            raise _Refused(
                400,
                "unsupported_truncation",
                "truncation='auto' is not supported: prompts are never truncated; shorten the "
                "input yourself (measure it with POST /v1/attempts/{capture_key}/measure)",
                "truncation",
            )
        items: list[dict[str, Any]] = []
        if request.instructions is not None:
            items.append({"role": "system", "content": request.instructions})
        if isinstance(request.input, str):
            items.append({"role": "user", "content": request.input})
        else:
            items.extend(request.input)
        effort = (request.reasoning or {}).get("effort")
        options = RenderOptions(
            model=self.model_name,
            tools=None if request.tools is None else tuple(request.tools),
            tool_choice=request.tool_choice,
            reasoning_effort=effort if isinstance(effort, str) else None,
        )
        sampling = self._sampling(
            request.max_output_tokens, request.temperature, request.top_p, None, None
        )
        return _Call(
            ModelCall(items, options, sampling, call_id), request.max_output_tokens is not None
        )

    def generate(self, capture_key: str | None, converted: _Call) -> CallOutcome:
        """Capture one model call: checks that write nothing first, then the lifecycle."""
        self.admitting(capture_key, converted.call.call_id)
        assert capture_key is not None
        call = self._fit(capture_key, converted)
        return self.service.generate(capture_key, call)

    def measure(self, capture_key: str, converted: _Call) -> Measurement:
        """The prompt length and decision the call would get now; writes nothing."""
        self.admitting(capture_key, None)
        measured = self.service.measure(capture_key, converted.call)
        decision = measured.decision
        return Measurement(
            prompt_tokens=measured.prompt_tokens,
            decision=decision.kind.value,
            parent_call_id=decision.parent_call_id,
            reason=None if decision.reason is None else decision.reason.value,
        )

    def token_logprobs(self, outcome: CallOutcome) -> list[TokenLogprob]:
        """The content tokens of ``outcome`` in OpenAI's logprob format."""
        generation = outcome.generation
        decode = self.service.renderer.decode
        count = len(generation.content_token_ids)
        entries = []
        for token, logprob in zip(
            generation.token_ids[:count], generation.logprobs[:count], strict=True
        ):
            text = decode([token])
            entries.append(TokenLogprob(token=text, logprob=logprob, bytes=list(text.encode())))
        return entries

    def _check_model(self, model: str) -> None:
        if model != self.model_name:
            raise _Refused(
                404,
                "model_not_found",
                f"The model {model!r} is not served here; this gateway serves {self.model_name!r}",
                "model",
            )

    def _sampling(
        self,
        max_tokens: int | None,
        temperature: float | None,
        top_p: float | None,
        seed: int | None,
        stop: str | list[str] | None,
    ) -> SamplingParams:
        return SamplingParams(
            max_tokens=self.default_max_tokens if max_tokens is None else max_tokens,
            temperature=1.0 if temperature is None else temperature,
            top_p=1.0 if top_p is None else top_p,
            seed=seed,
            stop_token_ids=self._stop_token_ids(stop),
        )

    def _stop_token_ids(self, stop: str | list[str] | None) -> tuple[int, ...]:
        """Stop strings as token ids: each must be exactly one token of the vocabulary."""
        texts = [stop] if isinstance(stop, str) else (stop or [])
        ids = []
        for text in texts:
            tokens = self.service.renderer.encode(text)
            if len(tokens) != 1:
                raise _Refused(
                    400,
                    "unsupported_stop",
                    f"Each stop string must be one token of the model's vocabulary (Grove stops "
                    f"on token ids, never on text): {text!r} is {len(tokens)} tokens",
                    "stop",
                )
            ids.append(tokens[0])
        return tuple(ids)

    def _fit(self, capture_key: str, converted: _Call) -> ModelCall:
        """The call with max tokens fitted to the context, or ``PromptTooLongError`` before
        anything is written. Without ``max_context`` the engine checks (after the intent)."""
        call = converted.call
        if self.max_context is None:
            return call
        prompt = self.service.measure(capture_key, call).prompt_tokens
        room = self.max_context - prompt
        wanted = call.sampling.max_tokens
        if wanted <= room:
            return call
        if converted.explicit_max_tokens or room < 1:
            raise capture_errors.PromptTooLongError(prompt, wanted, self.max_context)
        return replace(call, sampling=replace(call.sampling, max_tokens=room))


def _decision_headers(outcome: CallOutcome) -> dict[str, str]:
    decision = outcome.decision
    headers = {CALL_ID_HEADER: outcome.call_id, DECISION_HEADER: decision.kind.value}
    if decision.parent_call_id is not None:
        headers[PARENT_CALL_ID_HEADER] = decision.parent_call_id
    if decision.reason is not None:
        headers[ROOT_REASON_HEADER] = decision.reason.value
    return headers


def _sse(events: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    for event in events:
        yield f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n"


CaptureKey = Annotated[
    str | None,
    Header(alias=CAPTURE_KEY_HEADER, description="the attempt this model call belongs to"),
]
BearerCredentials = Annotated[
    HTTPAuthorizationCredentials | None,
    Depends(HTTPBearer(auto_error=False, description="the gateway's auth token")),
]
CallId = Annotated[
    str | None,
    Header(alias=CALL_ID_HEADER, description="the call id to record (default: a fresh one)"),
]


def create_app(
    service: CaptureService,
    *,
    selector: Selector | None,
    model_name: str,
    auth_token: str | None = None,
    max_context: int | None = None,
    default_max_tokens: int = DEFAULT_MAX_TOKENS,
    settle_timeout_s: float = DEFAULT_SETTLE_TIMEOUT_S,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The gateway as a FastAPI application over ``service``.

    ``selector`` turns a settled attempt and the harness's result into ``rollout.selected``
    (None: ``/result`` answers 501). ``model_name`` is the one model served (requests naming
    another get 404). ``auth_token`` set: every route but ``/health`` and the OpenAPI schema
    needs ``Authorization: Bearer <token>``. ``max_context`` (the model's context length) lets
    the gateway refuse a too-long prompt before anything is written, and cap the default
    ``max_tokens`` (``default_max_tokens``, used when a request gives none) to the room left.
    ``settle_timeout_s`` bounds the wait for pending calls when a result arrives.
    ``on_shutdown`` runs when the application stops (e.g. closing the ledger).
    """
    if max_context is not None and max_context < 1:
        raise ValueError(f"max_context must be >= 1 when given, got {max_context}")
    if default_max_tokens < 1:
        raise ValueError(f"default_max_tokens must be >= 1, got {default_max_tokens}")
    gateway = _Gateway(
        service, selector, model_name, max_context, default_max_tokens, settle_timeout_s
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
    )
    app.state.gateway = gateway
    _install_error_handlers(app)

    dependencies = [] if auth_token is None else [Depends(_bearer(auth_token))]
    api = APIRouter(prefix="/v1", dependencies=dependencies, responses=_ANSWERS)

    @app.get("/health", response_model=HealthStatus)
    def health() -> HealthStatus:
        """Liveness; open even when a token is required."""
        return HealthStatus(model=model_name)

    @api.get("/models", response_model=ModelList)
    def models() -> ModelList:
        """The one model this gateway serves."""
        return ModelList(data=[ModelCard(id=model_name)])

    @api.post("/chat/completions", response_model=ChatCompletion)
    def chat_completions(
        request: ChatCompletionRequest,
        response: Response,
        capture_key: CaptureKey = None,
        call_id: CallId = None,
    ) -> ChatCompletion:
        """One model call in OpenAI Chat Completions form (no streaming, ``n`` = 1)."""
        if request.stream:
            raise _Refused(
                400,
                "unsupported_stream",
                "stream=true is not supported on /v1/chat/completions: Grove captures each "
                "call whole before answering (no incremental streaming from the engine); send "
                "stream=false, or use /v1/responses, which answers stream=true with buffered SSE",
                "stream",
            )
        outcome = gateway.generate(capture_key, gateway.chat_call(request, call_id))
        response.headers.update(_decision_headers(outcome))
        logprobs = gateway.token_logprobs(outcome) if request.logprobs else None
        return chat_completion(outcome, model_name, logprobs)

    @api.post(
        "/responses",
        response_model=ResponseObject,
        responses={200: {"content": {"text/event-stream": {}}}},
    )
    def responses(
        request: ResponsesRequest,
        response: Response,
        capture_key: CaptureKey = None,
        call_id: CallId = None,
    ) -> Any:
        """One model call in OpenAI Responses form; ``stream=true`` answers with buffered SSE."""
        outcome = gateway.generate(capture_key, gateway.responses_call(request, call_id))
        answer = response_object(outcome, model_name, request)
        headers = _decision_headers(outcome)
        if request.stream:
            return StreamingResponse(
                _sse(response_events(answer)), media_type="text/event-stream", headers=headers
            )
        response.headers.update(headers)
        return answer

    @api.post("/attempts", response_model=AttemptStatus)
    def open_attempt(request: OpenAttemptRequest) -> AttemptStatus:
        """Open an attempt: one execution of the harness for one logical rollout."""
        return gateway.open(request)

    @api.get("/attempts/{capture_key}", response_model=AttemptStatus)
    def get_attempt(capture_key: str) -> AttemptStatus:
        """The attempt's calls (status, parent, decision), pending calls, and selection."""
        return attempt_status(gateway.opened(capture_key))

    @api.post("/attempts/{capture_key}/close", response_model=AttemptStatus)
    def close_attempt(capture_key: str) -> AttemptStatus:
        """The harness returned: the attempt admits no more calls."""
        return gateway.close(capture_key)

    @api.post("/attempts/{capture_key}/result", response_model=AttemptStatus)
    def post_result(capture_key: str, result: HarnessResult) -> AttemptStatus:
        """The harness's ordinary result: settle, then record the selection and reward."""
        return gateway.result(capture_key, result.model_dump(exclude_unset=True))

    @api.post("/attempts/{capture_key}/calls/{call_id}/reject", response_model=AttemptStatus)
    def reject_call(
        capture_key: str, call_id: str, request: RejectRequest | None = None
    ) -> AttemptStatus:
        """The harness rejected this completed response (``rejected_by_harness``)."""
        return gateway.reject(capture_key, call_id, "" if request is None else request.detail)

    @api.post("/attempts/{capture_key}/measure", response_model=Measurement)
    def measure(capture_key: str, request: ChatCompletionRequest | ResponsesRequest) -> Measurement:
        """Prompt tokens and decision for a chat or responses body; writes nothing."""
        if isinstance(request, ChatCompletionRequest):
            return gateway.measure(capture_key, gateway.chat_call(request, None))
        return gateway.measure(capture_key, gateway.responses_call(request, None))

    app.include_router(api)
    return app


def _bearer(token: str) -> Callable[..., None]:
    expected = token.encode()

    def authorize(credentials: BearerCredentials) -> None:
        if credentials is None or not hmac.compare_digest(
            credentials.credentials.encode(), expected
        ):
            raise _Refused(
                401,
                "invalid_api_key",
                "This gateway needs 'Authorization: Bearer <token>' with its auth token (the "
                "openai client sends its api_key so)",
            )

    return authorize


def _install_error_handlers(app: FastAPI) -> None:
    async def refused(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, _Refused)
        return _error_response(error.status, error.code, error.message, error.param)

    async def invalid(request: Request, error: Exception) -> JSONResponse:
        assert isinstance(error, RequestValidationError)
        message, param = _validation_message(error)
        return _error_response(400, "invalid_request", message, param)

    async def grove(request: Request, error: Exception) -> JSONResponse:
        answer = error_status(error)
        return _error_response(answer.status, answer.code, str(error))

    async def unexpected(request: Request, error: Exception) -> JSONResponse:
        return _error_response(
            500, "internal_error", f"Internal error: {type(error).__name__}: {error}"
        )

    app.add_exception_handler(_Refused, refused)
    app.add_exception_handler(RequestValidationError, invalid)
    for root in (
        capture_errors.CaptureError,
        ledger_errors.LedgerError,
        storage_errors.StorageError,
    ):
        app.add_exception_handler(root, grove)
    app.add_exception_handler(Exception, unexpected)
