"""The gateway's behaviour behind its routes (``capture/gateway.py``): the attempt checks and
refusals, opening, closing and rejecting, the harness's result (settled, checked against a second
result, selected through the injected selector), and each model call through
``grove.capture.lifecycle.CaptureService``, its sampling fitted to the context.

The routes translate HTTP into these calls and answers back; nothing here knows HTTP beyond the
``Refused`` errors it raises (``capture/refusals.py``). A call planned against a state another
writer has since moved is planned again, up to ``_STALE_RETRIES`` times.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any, Final

from fastapi import Request, Response
from starlette.concurrency import run_in_threadpool

from grove.capture import errors as capture_errors
from grove.capture.attempt_settings import AttemptSettings
from grove.capture.capabilities import (
    OpenedAttempt,
    open_with_token,
    require_attempt_token,
    require_source_token,
)
from grove.capture.conflicts import selection_differences
from grove.capture.conversion import ConvertedCall, RequestConverter
from grove.capture.delivery import CALLER_GONE, DeliveredStream, caller_disconnected
from grove.capture.engine import SamplingParams
from grove.capture.headers import CALL_ID_HEADER, CAPTURE_KEY_HEADER, decision_headers
from grove.capture.lifecycle import CallOutcome, CaptureService
from grove.capture.refusals import Refused
from grove.capture.reward_bound import check_reward, checked_bound
from grove.capture.wire import (
    AttemptStatus,
    Measurement,
    OpenAttemptRequest,
    TokenLogprob,
    attempt_status,
)
from grove.ledger.attempt import (
    AttemptState,
    CallStatus,
    StaleAttemptState,
)
from grove.ledger.events import RolloutSelected
from grove.ledger.store import validate_stream_id
from grove.storage import staging_key

__all__ = ["GatewayService", "Selector"]

_STALE_RETRIES: Final = 50  # plans met by another writer's append before a call gives up

Selector = Callable[[AttemptState, dict[str, Any]], RolloutSelected]
"""``(settled attempt state, harness result) -> rollout.selected``; raises ``ValueError`` when
the result cannot select calls. Injected by the application (``grove/services/serve.py``)."""


class GatewayService:
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

    async def authorize(self, capture_key: str, token: str | None) -> None:
        """``authorized``, from the event loop: in memory when this process holds the attempt's
        opening (its token digest never changes), else in a worker thread, which may read the
        ledger (the loop never waits on the database)."""
        held = self.service.log.held(validate_stream_id(capture_key))
        if held is not None and held.opened is not None:
            require_attempt_token(held, token)
        else:
            await run_in_threadpool(self.authorized, capture_key, token)

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

    def open(
        self, request: OpenAttemptRequest, proposed: str | None, source_token: str | None = None
    ) -> OpenedAttempt:
        """Open an attempt and answer its token (``capture/capabilities.py``), with the server's
        policy and forest mode where the request gives none; a fork only with its source's
        token (``source_token``)."""
        validate_stream_id(request.capture_key)
        if request.fork_from is not None:
            source = self._read(request.fork_from.capture_key, read=True)
            require_source_token(source, source_token)
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

    async def deliver(
        self,
        connection: Request,
        response: Response,
        outcome: CallOutcome,
        answer: Any,
        events: Iterator[str] | None,
    ) -> Any:
        """The answer of a committed call: ``answer``, or ``events`` as server-sent events.

        Runs on the event loop, after the commit (made in a worker thread): a client that has
        already disconnected is recorded now (``CALLER_GONE``, appended in a worker thread); a
        stream cut before its last event records it when it ends.
        """
        capture_key, call_id = outcome.capture_key, outcome.call_id
        headers = decision_headers(outcome)
        if await caller_disconnected(connection):
            await run_in_threadpool(self.caller_gone, capture_key, call_id)
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

        The state this process holds is tried first, unread: when it selects and is still the
        attempt's latest, the one append lands and nothing was read. Anything else (another
        writer appended since, a call is pending, the selector refuses, a result is recorded)
        is decided on the state read from the ledger, as if the first try had not happened.
        """
        self._selector()  # refused before anything is read
        state = self.opened(capture_key, read=False)
        check_reward(capture_key, result.get("reward"), self.max_abs_reward)
        if self._settled_selecting(state, result, read=False):
            return attempt_status(self.opened(capture_key, read=False))
        state = self.opened(capture_key)
        if state.selection is not None:
            self._refuse_second_result(state, result)
            return attempt_status(state)
        if self._settled_selecting(state, result, read=True):
            return attempt_status(self.opened(capture_key, read=False))
        settled = self.service.settle(capture_key, self.settle_timeout_s)
        self.service.select(capture_key, self._select(settled, result))
        return attempt_status(self.opened(capture_key, read=False))

    def _settled_selecting(
        self, state: AttemptState, result: dict[str, Any], *, read: bool
    ) -> bool:
        """Close, settle and select in one append from ``state`` when it has no selection,
        nothing pending, is unsettled and is the attempt's latest; whether that append landed
        (nothing is written otherwise). A result that cannot select is refused (422) on a state
        ``read`` for this request; on one not read, it is decided again after reading."""
        if state.selection is not None or state.settled is not None or state.pending_call_ids:
            return False
        try:
            selected = self._select(state, result)
        except Refused:
            if read:
                raise
            return False
        return self.service.settle_selecting(state.capture_key, selected, at=state) is not None

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
        """The selector's event, carrying the result's environment mask (``docs/forest.md``,
        "Environment masks") whatever selector made it."""
        try:
            selected = self._selector()(state, result)
        except ValueError as error:
            raise Refused(
                422,
                "selection_refused",
                f"The result of attempt {state.capture_key!r} cannot select its calls: {error}",
            ) from error
        if not result.get("environment_masked"):
            return selected
        return RolloutSelected.model_validate(
            {
                **selected.model_dump(),
                "environment_masked": True,
                "environment_mask_reason": result.get("environment_mask_reason"),
            }
        )

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
            self.attempts.check_budget(state.capture_key, len(state.calls))
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
