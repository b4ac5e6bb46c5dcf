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
callable (``grove/jobs/serve.py`` builds it from ``training/selection.py``). A selector raises
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
from dataclasses import replace
from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, FastAPI, Header, Request, Response

from grove.capture import errors as capture_errors
from grove.capture.attempt_settings import AttemptSettings
from grove.capture.body_limits import BodyLimits
from grove.capture.capabilities import (
    AttemptToken,
    OpenedAttempt,
    gateway_token_check,
    open_with_token,
    require_attempt_token,
)
from grove.capture.chat_api import ChatCompletion, ChatCompletionRequest, chat_completion
from grove.capture.conflicts import selection_differences
from grove.capture.conversion import ConvertedCall, RequestConverter
from grove.capture.delivery import CALLER_GONE, DeliveredStream, caller_disconnected
from grove.capture.engine import SamplingParams
from grove.capture.lifecycle import CallOutcome, CaptureService
from grove.capture.limits import GatewayLimits
from grove.capture.media import MediaRenderer
from grove.capture.refusals import Refused, install_error_handlers
from grove.capture.responses_api import ResponseObject, ResponsesRequest, response_object
from grove.capture.reward_bound import DEFAULT_MAX_ABS_REWARD, check_reward, checked_bound
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
    TokenLogprob,
    attempt_status,
)
from grove.ledger.attempt import (
    DEFAULT_SETTLE_TIMEOUT_S,
    AttemptState,
    CallStatus,
    StaleAttemptState,
)
from grove.ledger.events import RolloutSelected
from grove.ledger.store import validate_stream_id
from grove.storage import staging_key

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
_STALE_RETRIES: Final = 50  # plans met by another writer's append before a call gives up

Selector = Callable[[AttemptState, dict[str, Any]], RolloutSelected]
"""``(settled attempt state, harness result) -> rollout.selected``; raises ``ValueError`` when
the result cannot select calls. Injected by the application (``grove/jobs/serve.py``)."""


_ANSWERS: Final[dict[int | str, dict[str, Any]]] = {
    status: {"model": ErrorBody} for status in (400, 401, 403, 404, 409, 422, 500, 501, 502, 503)
}


class _Gateway:
    """The gateway's behaviour behind the routes: refusals, attempt bookkeeping, capture."""

    def __init__(
        self,
        service: CaptureService,
        selector: Selector | None,
        model_name: str,
        max_context: int | None,
        default_max_tokens: int,
        settle_timeout_s: float,
        attempts: AttemptSettings,
        max_abs_reward: float,
    ) -> None:
        self.service = service
        self.selector = selector
        self.attempts = attempts
        self.max_abs_reward = checked_bound(max_abs_reward)
        self.model_name = model_name
        self.max_context = max_context
        self.default_max_tokens = default_max_tokens
        self.settle_timeout_s = settle_timeout_s
        self.converter = RequestConverter(model_name, default_max_tokens, service.renderer)

    # -- attempts ----------------------------------------------------------------------------

    def state(self, capture_key: str) -> AttemptState:
        """The attempt's state, read incrementally from the ledger (only events not yet seen):
        the capture service's view of it, which a model call then plans against unread."""
        return self.service.state(validate_stream_id(capture_key))

    def opened(self, capture_key: str, *, read: bool = True) -> AttemptState:
        """The state of an attempt that was opened; 404 otherwise. ``read=False``: the state as
        this process last knew it, read only when it is behind its own appends or unknown."""
        state = self._read(capture_key, read)
        if state.opened is None:
            raise Refused(
                404,
                "unknown_attempt",
                f"Unknown attempt {capture_key!r}: open it with POST /v1/attempts first (the "
                f"{CAPTURE_KEY_HEADER} header names an attempt that was opened)",
            )
        return state

    def authorized(self, capture_key: str, token: str | None) -> None:
        """Refuse (401, 403) a request on attempt ``capture_key`` without its ``token``, alike
        whether or not the attempt exists (``capture/capabilities.py``)."""
        require_attempt_token(self._read(capture_key, read=False), token)

    def _read(self, capture_key: str, read: bool) -> AttemptState:
        key = validate_stream_id(capture_key)
        state = self.service.state(key) if read else self.service.current_state(key)
        if state.opened is None and not read:
            state = self.service.state(key)  # never refuse from a view that was not read
        return state

    def admitting(
        self, capture_key: str | None, call_id: str | None, *, read: bool = True
    ) -> AttemptState:
        """The state of an attempt that admits a new call ``call_id``; refused otherwise
        (``read``: as in ``opened``)."""
        if not capture_key:
            raise Refused(
                400,
                "missing_capture_key",
                f"Every model call names its attempt: send the {CAPTURE_KEY_HEADER} header "
                "(with the openai client: default_headers={'" + CAPTURE_KEY_HEADER + "': KEY})",
            )
        state = self.opened(capture_key, read=read)
        if state.admissions_closed:
            raise Refused(
                409,
                "attempt_closed",
                f"Attempt {capture_key!r} admits no more calls: the harness already returned "
                "(admissions are closed); open a new attempt",
            )
        if call_id is not None:
            staging_key(capture_key, call_id)  # the call id names a blob: check it now
            if call_id in state.calls:
                raise Refused(
                    409,
                    "call_id_reused",
                    f"Call id {call_id!r} is already recorded in attempt {capture_key!r}; "
                    f"send a new {CALL_ID_HEADER} for every call (or none)",
                )
        return state

    def open(self, request: OpenAttemptRequest, proposed: str | None) -> OpenedAttempt:
        """Open an attempt and answer its token (``capture/capabilities.py``), with the server's
        policy and forest mode where the request gives none."""
        validate_stream_id(request.capture_key)
        return open_with_token(self.service, self.attempts.resolve(request), proposed)

    def close(self, capture_key: str) -> AttemptStatus:
        """Close admissions: the harness returned."""
        self.opened(capture_key)
        self.service.close(capture_key)
        return attempt_status(self.opened(capture_key, read=False))

    def reject(self, capture_key: str, call_id: str, detail: str) -> AttemptStatus:
        """Record that the harness rejected a committed call's response (it will resample)."""
        call = self.opened(capture_key).calls.get(call_id)
        if call is None:
            raise Refused(
                404, "unknown_call", f"Attempt {capture_key!r} has no call {call_id!r} to reject"
            )
        if call.status is not CallStatus.COMMITTED:
            raise Refused(
                409,
                "call_not_committed",
                f"Only a completed response can be rejected: call {call_id!r} of attempt "
                f"{capture_key!r} is {call.status.value}",
            )
        self.service.fail(capture_key, call_id, "rejected_by_harness", detail)
        return attempt_status(self.opened(capture_key))

    def caller_gone(self, capture_key: str, call_id: str) -> None:
        """Record that the client of committed call ``call_id`` went away before its answer was
        delivered (``CALLER_GONE``); the call stays committed."""
        self.service.fail(
            capture_key,
            call_id,
            CALLER_GONE,
            "the client disconnected before the answer was delivered",
        )

    def deliver(
        self,
        connection: Request,
        response: Response,
        outcome: CallOutcome,
        answer: Any,
        events: Iterator[str] | None,
    ) -> Any:
        """The answer of a committed call: ``answer``, or ``events`` as server-sent events.

        Runs in the endpoint's worker thread, after the commit: a client that has already
        disconnected is recorded now (``CALLER_GONE``); a stream cut before its last event
        records it when it ends.
        """
        capture_key, call_id = outcome.capture_key, outcome.call_id
        headers = _decision_headers(outcome)
        if caller_disconnected(connection):
            self.caller_gone(capture_key, call_id)
        if events is not None:
            return DeliveredStream(events, headers, lambda: self.caller_gone(capture_key, call_id))
        response.headers.update(headers)
        return answer

    def result(self, capture_key: str, result: dict[str, Any]) -> AttemptStatus:
        """Settle the attempt (the harness returned) and record the selection of its result.

        When nothing is pending the selector first runs on the current state, so a result
        whose evidence cannot select calls is refused before anything is written; closing,
        settling and the selection are then one append, unless another writer appended since
        (then step by step, selecting again on the settled state). An attempt with no accepted
        generation selects no call: its result is recorded whatever its evidence, so its
        rollout is finalized (masked) and its prompt group completes. A reward that is not
        finite or beyond the bound is refused first (``capture/reward_bound.py``).
        """
        self._selector()  # refused before anything is read
        state = self.opened(capture_key)
        check_reward(capture_key, result.get("reward"), self.max_abs_reward)
        if state.selection is not None:
            self._refuse_second_result(state, result)
            return attempt_status(state)
        if state.settled is None and not state.pending_call_ids:
            selected = self._select(state, result)
            if self.service.settle_selecting(capture_key, selected, at=state) is not None:
                return attempt_status(self.opened(capture_key, read=False))
        settled = self.service.settle(capture_key, self.settle_timeout_s)
        self.service.select(capture_key, self._select(settled, result))
        return attempt_status(self.opened(capture_key, read=False))

    def _selector(self) -> Selector:
        """The selection policy; a gateway started without one records capture only (501)."""
        if self.selector is None:
            raise Refused(
                501,
                "selection_not_configured",
                "This gateway records capture only: it was started without a selection policy, "
                "so it cannot record a result (serve it through grove serve)",
            )
        return self.selector

    def _refuse_second_result(self, state: AttemptState, result: dict[str, Any]) -> None:
        """Posting the recorded result again is idempotent; any other result is a 409."""
        recorded = state.selection
        if recorded is None:
            return
        try:
            differences = selection_differences(recorded, self._selector()(state, result))
        except ValueError as error:
            differences = f"this result cannot select calls ({error})"
        if differences:
            raise Refused(
                409,
                "conflicting_event",
                f"A result was already recorded for attempt {state.capture_key!r}: "
                f"{differences}. Posting the same result again is idempotent; a different one "
                "is refused (the attempt's selection is recorded once)",
            )

    def _select(self, state: AttemptState, result: dict[str, Any]) -> RolloutSelected:
        try:
            return self._selector()(state, result)
        except ValueError as error:
            raise Refused(
                422,
                "selection_refused",
                f"The result of attempt {state.capture_key!r} cannot select its calls: {error}",
            ) from error

    # -- model calls -------------------------------------------------------------------------

    def generate(self, capture_key: str | None, converted: ConvertedCall) -> CallOutcome:
        """Capture one model call: checks that write nothing first, then the lifecycle, which
        plans the call against the state these checks saw (one plan per call). That state is
        the service's view, read from the ledger only when it is behind this process's own
        appends; when another process appended since, the intent fails before anything is
        written (``StaleAttemptState``), and the call is checked and planned again on a fresh
        read."""
        limit = self.max_context
        fit = None if limit is None else lambda prompt: self._fit(converted, prompt, limit)
        for attempt in range(_STALE_RETRIES):
            state = self.admitting(capture_key, converted.call.call_id, read=attempt > 0)
            try:
                return self.service.generate(
                    state.capture_key, converted.call, fit=fit, refresh=False
                )
            except StaleAttemptState:
                if attempt == _STALE_RETRIES - 1:
                    raise  # every try met another writer's append
        raise AssertionError("unreachable")

    def measure(self, capture_key: str, converted: ConvertedCall) -> Measurement:
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
        """The generated tokens of ``outcome`` before its stop token, in OpenAI's logprob format:
        text, the logprob recorded in the blob, and the token's exact bytes."""
        generation = outcome.generation
        renderer = self.service.renderer
        count = len(generation.content_token_ids)
        return [
            TokenLogprob(
                token=renderer.decode([token]),
                logprob=logprob,
                bytes=list(renderer.token_bytes(token)),
            )
            for token, logprob in zip(
                generation.token_ids[:count], generation.logprobs[:count], strict=True
            )
        ]

    def _fit(self, converted: ConvertedCall, prompt: int, max_context: int) -> SamplingParams:
        """The call's sampling with max tokens fitted to the context left after its planned
        ``prompt``, or ``PromptTooLongError`` before anything is written (called only with a
        ``max_context``; without one the engine checks, after the intent)."""
        sampling = converted.call.sampling
        room = max_context - prompt
        wanted = sampling.max_tokens
        if wanted <= room:
            return sampling
        if converted.explicit_max_tokens or room < 1:
            raise capture_errors.PromptTooLongError(prompt, wanted, max_context)
        return replace(sampling, max_tokens=room)


def _decision_headers(outcome: CallOutcome) -> dict[str, str]:
    decision = outcome.decision
    headers = {CALL_ID_HEADER: outcome.call_id, DECISION_HEADER: decision.kind.value}
    if decision.parent_call_id is not None:
        headers[PARENT_CALL_ID_HEADER] = decision.parent_call_id
    if decision.reason is not None:
        headers[ROOT_REASON_HEADER] = decision.reason.value
    return headers


CaptureKey = Annotated[
    str | None,
    Header(alias=CAPTURE_KEY_HEADER, description="the attempt this model call belongs to"),
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
    gateway = _Gateway(
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
    )
    app.state.gateway = gateway
    app.state.limits = limits = limits or GatewayLimits()
    app.add_middleware(BodyLimits, limits=limits)
    if isinstance(service.renderer, MediaRenderer):
        service.renderer.vision.limits = limits
    install_error_handlers(app)

    dependencies = [] if auth_token is None else [Depends(gateway_token_check(auth_token))]
    api = APIRouter(prefix="/v1", dependencies=dependencies, responses=_ANSWERS)

    @app.get("/health", response_model=HealthStatus)
    def health() -> HealthStatus:
        """Liveness; open even when a token is required."""
        return HealthStatus(model=model_name)

    @api.get("/models", response_model=ModelList)
    def models() -> ModelList:
        """The one model this gateway serves."""
        return ModelList(data=[ModelCard(id=model_name)])

    def attempt_in_path(capture_key: str, token: AttemptToken = None) -> None:
        """A route on an attempt checks the attempt's token first, before reading its body."""
        gateway.authorized(capture_key, token)

    def attempt_in_header(capture_key: CaptureKey = None, token: AttemptToken = None) -> None:
        """A model call checks its attempt's token first (naming no attempt: refused later)."""
        if capture_key:
            gateway.authorized(capture_key, token)

    on_attempt, on_named_attempt = [Depends(attempt_in_path)], [Depends(attempt_in_header)]

    @api.post(
        "/chat/completions",
        response_model=ChatCompletion,
        responses={200: {"content": {"text/event-stream": {}}}},
        dependencies=on_named_attempt,
    )
    def chat_completions(
        request: ChatCompletionRequest,
        response: Response,
        connection: Request,
        capture_key: CaptureKey = None,
        call_id: CallId = None,
    ) -> Any:
        """One model call in OpenAI Chat Completions form (``n`` = 1); ``stream=true`` answers
        with buffered chunks."""
        converted = gateway.converter.chat_call(request, call_id)
        outcome = gateway.generate(capture_key, converted)
        logprobs = gateway.token_logprobs(outcome) if converted.logprobs else None
        answer = chat_completion(outcome, model_name, logprobs)
        usage = bool((request.stream_options or {}).get("include_usage"))
        events = chat_sse(answer, include_usage=usage) if request.stream else None
        return gateway.deliver(connection, response, outcome, answer, events)

    @api.post(
        "/responses",
        response_model=ResponseObject,
        responses={200: {"content": {"text/event-stream": {}}}},
        dependencies=on_named_attempt,
    )
    def responses(
        request: ResponsesRequest,
        response: Response,
        connection: Request,
        capture_key: CaptureKey = None,
        call_id: CallId = None,
    ) -> Any:
        """One model call in OpenAI Responses form; ``stream=true`` answers with buffered SSE."""
        converted = gateway.converter.responses_call(request, call_id)
        outcome = gateway.generate(capture_key, converted)
        logprobs = gateway.token_logprobs(outcome) if converted.logprobs else None
        answer = response_object(outcome, model_name, request, logprobs)
        events = responses_sse(answer) if request.stream else None
        return gateway.deliver(connection, response, outcome, answer, events)

    @api.post("/attempts", response_model=OpenedAttempt)
    def open_attempt(request: OpenAttemptRequest, token: AttemptToken = None) -> OpenedAttempt:
        """Open an attempt: one execution of the harness for one logical rollout. Answers its
        token (``token``: the caller's proposal, or the token of a repeated opening)."""
        return gateway.open(request, token)

    @api.get("/attempts/{capture_key}", response_model=AttemptStatus, dependencies=on_attempt)
    def get_attempt(capture_key: str) -> AttemptStatus:
        """The attempt's calls (status, parent, decision), pending calls, and selection."""
        return attempt_status(gateway.opened(capture_key))

    @api.post(
        "/attempts/{capture_key}/close", response_model=AttemptStatus, dependencies=on_attempt
    )
    def close_attempt(capture_key: str) -> AttemptStatus:
        """The harness returned: the attempt admits no more calls."""
        return gateway.close(capture_key)

    @api.post(
        "/attempts/{capture_key}/result", response_model=AttemptStatus, dependencies=on_attempt
    )
    def post_result(capture_key: str, result: HarnessResult) -> AttemptStatus:
        """The harness's ordinary result: settle, then record the selection and reward."""
        return gateway.result(capture_key, result.model_dump(exclude_unset=True))

    @api.post(
        "/attempts/{capture_key}/calls/{call_id}/reject",
        response_model=AttemptStatus,
        dependencies=on_attempt,
    )
    def reject_call(
        capture_key: str, call_id: str, request: RejectRequest | None = None
    ) -> AttemptStatus:
        """The harness rejected this completed response (``rejected_by_harness``)."""
        return gateway.reject(capture_key, call_id, "" if request is None else request.detail)

    @api.post(
        "/attempts/{capture_key}/measure", response_model=Measurement, dependencies=on_attempt
    )
    def measure(capture_key: str, request: ChatCompletionRequest | ResponsesRequest) -> Measurement:
        """Prompt tokens and decision for a chat or responses body; writes nothing."""
        if isinstance(request, ChatCompletionRequest):
            return gateway.measure(capture_key, gateway.converter.chat_call(request, None))
        return gateway.measure(capture_key, gateway.converter.responses_call(request, None))

    app.include_router(api)
    return app
