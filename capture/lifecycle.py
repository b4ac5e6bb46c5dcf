"""The capture write path: one model call from request to committed delta, or a recorded failure.

A call goes through five stages:

1. *prepare*, writing nothing: normalize the request, admit it against the attempt's committed
   calls (``ledger/admission.py``), plan its prompt (``capture/splice.py``: the parent chain's
   exact tokens plus the rendered suffix, or a root), fit its sampling and let the engine check
   it (``Engine.check``). ``measure`` stops here.
2. *intend*: record ``call.intended``, once per call id; the call is pending from here on.
3. *infer*: generate through the engine and build the delta to store.
4. *store*: write the delta blob (before the commit event: the ledger event is the commit marker).
5. *commit*: build ``call.committed`` (``capture/call_events.py``) and append it.

Stages 2 and 3 overlap: the intent's append (and its durable commit) runs on a thread of the
service's intent pool while the engine generates on the caller's thread, and the call goes on to
stage 4 only once both are done. Nothing is stored or answered before the intent is durable; an
intent that is refused or fails discards the generation and raises its own error (an intent that
may have landed, its append's outcome unknown, is recorded ``call.failed``); an engine failure is
recorded once the intent has landed. A second request for a call id this service is running is
refused at once, before inference (``docs/gateway.md``, "Ordering: intent and generation").

The call fails closed. Any exception after the intent and before the commit is appended (the
point of no return) is recorded, in one place, as ``call.failed`` with its stage's reason
(``capture/failure_reasons.py``: ``engine_error`` for stage 3, ``storage_error`` for 4,
``internal_error`` for 5), then re-raised, so a failed call never waits out the settle timeout.
When recording the failure fails too (the ledger unreachable), the original error still
surfaces, with a note naming the second, and the call stays pending: the attempt's settle waits
for it up to its timeout and records it still pending, which masks the rollout
(``docs/gateway.md``, "Failures after the intent"). A failure after the commit records nothing:
the call is committed, and a harness that never received it does not select it. The intent
records the policy version the engine served at admission (its ``policy_version`` attribute, if
it has one); the commit, the version of the weights that sampled the generation.

The service plans against its view of each attempt (``capture/attempt_views.py``), brought up to
date by reading only the events it has not seen, and folds its own intents and commits into it
as they land, so a gateway's call reads nothing while the view holds all this process appended
(``current_state``): it is planned against the view (``generate(refresh=False)``) and its intent
appended only at the view's version, so a plan that another process's append made stale fails
with ``StaleAttemptState`` before anything is written, and is read and planned again. A call is
planned once (``fit`` adjusts its sampling to the planned prompt before anything is written).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Final

from grove.capture.attempt_settings import DEFAULT_FOREST_MODE
from grove.capture.attempt_views import DEFAULT_CACHED_VIEWS, AttemptView, AttemptViews
from grove.capture.call_events import Answer, CommittedOutput, answer_of, commit_event, intent_event
from grove.capture.calls import CallOutcome, MeasuredCall, ModelCall
from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.failure_reasons import (
    ENGINE_ERROR,
    FAILURE_REASONS,
    INTERNAL_ERROR,
    STORAGE_ERROR,
    failure_detail,
)
from grove.capture.forks import fork_source
from grove.capture.media import MediaPlan, plan_media, request_images
from grove.capture.render import NormalizedRequest, Renderer, normalize_messages
from grove.capture.splice import PromptPlan, RawOutput, plan_call
from grove.ledger.attempt import (
    DEFAULT_SETTLE_TIMEOUT_S,
    AttemptError,
    AttemptLog,
    AttemptState,
)
from grove.ledger.events import AttemptOpened, CallFailed, CallIntended, ForkSource, RolloutSelected
from grove.storage import BlobRef, BlobStore, CallDelta, staging_key

__all__ = ["CallOutcome", "CaptureService", "MeasuredCall", "ModelCall", "derived_seed"]


INTENT_THREADS: Final = 40
"""Threads that append intents while engines generate: as many as the gateway's worker threads
(``grove/services/serve.py``), so no call's intent waits for another call's."""

Fit = Callable[[int], SamplingParams]
"""``prompt tokens -> sampling``: the sampling a call runs with once its prompt is planned (max
tokens fitted to the context), or an error that refuses the call before anything is written."""


def derived_seed(state: AttemptState, ordinal: int) -> int:
    """The sampling seed of a call that names none: a digest of the attempt's seed (or, when it
    was opened without one, its rollout id) and the call's position in the attempt
    (``docs/gateway.md``, "Sampling").

    A rollout played again under a new capture key (a resumed run replays the rollouts of an
    interrupted step) therefore samples the same tokens from the same weights, and the result
    does not depend on how the engine interleaves concurrent attempts.
    """
    opened = state.opened
    if opened is None:
        origin: object = state.capture_key
    else:
        origin = opened.rollout_id if opened.seed is None else opened.seed
    digest = hashlib.sha256(f"grove-seed/{origin}/{ordinal}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1  # a non-negative int64


@dataclass(frozen=True)
class _PreparedCall:
    """A call admitted and planned against ``state`` (the view as it was), with the sampling it
    runs with and the engine's extra arguments (a vision engine's images); nothing written."""

    capture_key: str
    call_id: str
    state: AttemptState
    plan: PromptPlan
    media: MediaPlan
    sampling: SamplingParams
    images: tuple[Any, ...]
    tools: bool
    messages: tuple[dict[str, Any], ...]  # the request's items after the parent's conversation
    source_capture_key: str | None = None  # the owner of the parent when not this attempt


@dataclass(frozen=True)
class _Inference:
    """What the engine generated for a call, its answer, and the delta to store for it."""

    generation: Generation
    answer: Answer
    delta: CallDelta


class CaptureService:
    """Records model calls of attempts into the ledger and the blob store, through one engine."""

    def __init__(
        self,
        log: AttemptLog,
        blobs: BlobStore,
        renderer: Renderer,
        engine: Engine,
        *,
        model_fingerprint: str,
        strict: bool = False,
        cached_views: int = DEFAULT_CACHED_VIEWS,
        overlap_intents: bool = True,
    ) -> None:
        self.log = log
        self.blobs = blobs
        self.renderer = renderer
        self.engine = engine
        self.model_fingerprint = model_fingerprint
        self.strict = strict  # refuse unexplained roots (docs/normalization.md, "Strict mode")
        self.views = AttemptViews(log, blobs, renderer, capacity=cached_views)
        # False: each intent is durable before its generation starts (the order without the
        # overlap, which bench/gateway.py measures beside it)
        self.overlap_intents = overlap_intents
        self._intents = ThreadPoolExecutor(INTENT_THREADS, thread_name_prefix="grove-intent")
        self._running: set[tuple[str, str]] = set()  # (capture key, call id) of calls in flight
        self._running_lock = threading.Lock()

    # -- attempts ----------------------------------------------------------------------------

    def open_attempt(
        self,
        capture_key: str,
        *,
        rollout_id: str,
        prompt_group: str,
        rollout_index: int,
        policy_version: int = 0,
        forest_mode: bool = DEFAULT_FOREST_MODE,
        selection_policy: str = "returned_history",
        template_fingerprint: str | None = None,
        seed: int | None = None,
        attempt_token_digest: str | None = None,
        fork_from: tuple[str, str] | None = None,
    ) -> int | None:
        """Start an attempt (idempotent for the same fields); returns the stream's version after
        this call appended the opening, None when it was already recorded.
        ``attempt_token_digest``: the digest of the attempt's token (``capture/capabilities.py``),
        None for an attempt that is driven in process only. ``fork_from``: (capture key, call
        id) of a committed call of another attempt that this attempt forks (``docs/fork.md``);
        ``AttemptError``, nothing written, when there is no such call."""
        template = (
            template_fingerprint
            or hashlib.sha256(str(self.renderer.tokenizer.chat_template).encode()).hexdigest()
        )
        fork = None if fork_from is None else self.fork_source(capture_key, *fork_from)
        appended = self.log.open(
            AttemptOpened(
                capture_key=capture_key,
                rollout_id=rollout_id,
                prompt_group=prompt_group,
                rollout_index=rollout_index,
                policy_version=policy_version,
                model_fingerprint=self.model_fingerprint,
                template_fingerprint=template,
                forest_mode=forest_mode,
                selection_policy=selection_policy,
                seed=seed,
                attempt_token_digest=attempt_token_digest,
                fork_from=fork,
            )
        )
        self.views.adopt(capture_key)
        return appended

    def fork_source(self, capture_key: str, source_key: str, source_call_id: str) -> ForkSource:
        """The fork source of attempt ``capture_key`` at call ``source_call_id`` of
        ``source_key`` (``grove.capture.forks.fork_source``)."""
        if source_key == capture_key:
            raise AttemptError(
                capture_key,
                "an attempt cannot fork itself: fork_from must name a call of another attempt",
                source_call_id,
            )
        return fork_source(capture_key, self.views.view(source_key).state, source_call_id)

    def close(self, capture_key: str) -> None:
        """The harness returned: refuse later calls of this attempt."""
        self.log.close_admissions(capture_key)
        self.views.adopt(capture_key)

    def settle(self, capture_key: str, timeout_s: float = DEFAULT_SETTLE_TIMEOUT_S) -> AttemptState:
        """Close admissions, wait for pending calls up to ``timeout_s``, record the outcome."""
        settled = self.log.settle(capture_key, timeout_s)
        self.views.adopt(capture_key)
        return settled

    def settle_selecting(
        self, capture_key: str, selected: RolloutSelected, *, at: AttemptState
    ) -> AttemptState | None:
        """Close admissions, settle and record ``selected`` in one append, when ``at`` (the
        state the selection was made from) is still the attempt's latest and has nothing
        pending: the state after them; None, with nothing written, otherwise
        (``AttemptLog.settle_selecting``)."""
        settled = self.log.settle_selecting(capture_key, selected, at=at)
        if settled is not None:
            self.views.adopt(capture_key)
        return settled

    def select(self, capture_key: str, selected: RolloutSelected) -> None:
        """Record the selection policy's result for the attempt."""
        self.log.select(capture_key, selected)
        self.views.adopt(capture_key)

    def state(self, capture_key: str) -> AttemptState:
        """The attempt's state, brought up to date from the ledger (only the events not yet seen);
        ``generate(refresh=False)`` then plans against it without reading again."""
        return self.views.view(capture_key).state

    def current_state(self, capture_key: str) -> AttemptState:
        """The attempt's state as this service last knew it, read from the ledger only when the
        view is behind this process's own appends (or absent). Another process's appends since
        are not seen: ``generate(refresh=False)`` then fails with ``StaleAttemptState`` before
        writing anything, and the caller reads (``state``) and tries again."""
        view = self.views.view(capture_key, read=False)
        if view.state.version != self.log.known_version(capture_key):
            view = self.views.view(capture_key)
        return view.state

    # -- calls -------------------------------------------------------------------------------

    def measure(self, capture_key: str, call: ModelCall) -> MeasuredCall:
        """The prompt length and decision ``call`` would get now; writes nothing."""
        view = self.views.view(capture_key)
        _require_open(view.state, capture_key, call.call_id)
        plan, request = self._plan(view, call)
        self._media(view, request, plan, call.options.model)  # refusals only
        return MeasuredCall(prompt_tokens=plan.prompt_len, decision=plan.decision)

    def generate(
        self,
        capture_key: str,
        call: ModelCall,
        *,
        fit: Fit | None = None,
        refresh: bool = True,
    ) -> CallOutcome:
        """Run one model call: prepare (admit, plan, fit, check), intend, infer, store, commit.

        ``fit`` (given the planned prompt length) decides the sampling the call runs with, or
        refuses it, before the intent. ``refresh=False``: the call is planned against the view
        as the caller last brought it up to date (``state``, ``current_state``), unread, and its
        intent is appended only at that view's version: another writer's append since raises
        ``StaleAttemptState`` with nothing written (read again and retry). Any failure after the
        intent and before the commit is recorded as ``call.failed`` and re-raised.
        """
        view = self.views.view(capture_key, read=refresh)
        prepared = self._prepare(view, call, fit)
        with self._running_call(prepared):
            intending = self._intend(prepared, refresh=refresh)
            try:
                generation = self._infer(prepared)
            except BaseException as error:
                self._intended(view, prepared, intending, refresh=refresh)
                self._record_failure(prepared, ENGINE_ERROR, error)
                raise
            self._intended(view, prepared, intending, refresh=refresh)
            reason = INTERNAL_ERROR
            try:
                answer = answer_of(
                    self.renderer.decode(generation.content_token_ids), tools=prepared.tools
                )
                reason = ENGINE_ERROR  # a delta the engine's output cannot make
                inference = _Inference(
                    generation, answer, self._delta(prepared, generation, answer)
                )
                reason = STORAGE_ERROR
                blob = self._store(prepared, inference.delta)
                reason = INTERNAL_ERROR
                committed = self._commit(view, prepared, inference, blob)
            except BaseException as error:
                self._record_failure(prepared, reason, error)
                raise
        return self._remember(view, prepared, inference, blob, committed)

    def fail(self, capture_key: str, call_id: str, reason: str, detail: str = "") -> None:
        """Record that a call ended without a usable capture (e.g. the harness rejected it)."""
        if reason not in FAILURE_REASONS:
            raise AttemptError(
                capture_key, f"unknown failure reason {reason!r}; use one of {FAILURE_REASONS}"
            )
        self.log.fail(capture_key, CallFailed(call_id=call_id, reason=reason, detail=detail))

    # -- the stages of a call ----------------------------------------------------------------

    def _prepare(self, view: AttemptView, call: ModelCall, fit: Fit | None) -> _PreparedCall:
        """Admit and plan ``call`` against the view, fit its sampling and let the engine check
        it: every refusal before anything is written."""
        state = view.state
        capture_key = state.capture_key
        call_id = call.call_id or f"call-{uuid.uuid4().hex[:16]}"
        _require_open(state, capture_key, call_id)
        plan, request = self._plan(view, call)
        media = self._media(view, request, plan, call.options.model)
        images = (media.inputs,) if media.inputs else ()  # a vision engine's extra argument
        sampling = call.sampling if fit is None else fit(plan.prompt_len)
        if sampling.seed is None:
            sampling = replace(sampling, seed=derived_seed(state, len(state.calls)))
        self.engine.check(plan.prompt_token_ids, sampling, *images)  # refuse before recording
        return _PreparedCall(
            capture_key=capture_key,
            call_id=call_id,
            state=state,
            plan=plan,
            media=media,
            sampling=sampling,
            images=images,
            tools=call.options.tools is not None,
            messages=plan.added_items(request),
            source_capture_key=self.views.source_capture_key(view, plan.decision.parent_call_id),
        )

    @contextlib.contextmanager
    def _running_call(self, prepared: _PreparedCall) -> Iterator[None]:
        """Hold the call's id while it runs: a second request for it in this service is refused
        before inference (the ledger refuses one from another process at its intent)."""
        running = (prepared.capture_key, prepared.call_id)
        with self._running_lock:
            if running in self._running:
                raise _intended_elsewhere(prepared)
            self._running.add(running)
        try:
            yield
        finally:
            with self._running_lock:
                self._running.discard(running)

    def _intend(
        self, prepared: _PreparedCall, *, refresh: bool
    ) -> Future[tuple[bool, CallIntended]]:
        """Start appending the call's intent (at the planned version unless ``refresh``) on
        the intent pool: ``(recorded, event)`` once it is durable (``_intended`` waits)."""
        intended = intent_event(
            prepared.call_id,
            prepared.plan,
            prepared.sampling,
            getattr(self.engine, "policy_version", None),
        )
        if prepared.source_capture_key is not None:
            intended = intended.model_copy(
                update={"source_capture_key": prepared.source_capture_key}
            )
        at = None if refresh else prepared.state

        def append() -> tuple[bool, CallIntended]:
            return self.log.intend(prepared.capture_key, intended, at=at), intended

        if self.overlap_intents:
            return self._intents.submit(contextvars.copy_context().run, append)
        appended: Future[tuple[bool, CallIntended]] = Future()
        try:
            appended.set_result(append())
        except BaseException as error:
            appended.set_exception(error)
        return appended

    def _intended(
        self,
        view: AttemptView,
        prepared: _PreparedCall,
        intending: Future[tuple[bool, CallIntended]],
        *,
        refresh: bool,
    ) -> None:
        """Wait for the call's intent to be durable; the call is pending from here on. A
        refusal (``AttemptError``: nothing written) or a failed append raises, and the caller's
        generation is discarded; an append whose outcome is unknown is recorded failed."""
        try:
            recorded, intended = intending.result()
        except AttemptError:
            raise
        except BaseException as error:
            self._record_unsure_intent(prepared, error)
            raise
        if not recorded:
            # Another request with this call id recorded the intent first (a racing retry
            # through another process): its generation alone is stored and committed.
            raise _intended_elsewhere(prepared)
        if not refresh:
            self.views.fold_own(view, prepared.state.version + 1, intended)

    def _record_unsure_intent(self, prepared: _PreparedCall, error: BaseException) -> None:
        """The intent's append raised without a refusal (the ledger unreachable, its commit's
        acknowledgement lost): record ``call.failed`` if the intent landed nonetheless, so the
        call is not left pending; the ledger refuses a failure of a call never intended, and
        then there is nothing to record."""
        detail = f"the intent's append failed: {failure_detail(error)}"
        failed = CallFailed(call_id=prepared.call_id, reason=INTERNAL_ERROR, detail=detail)
        try:
            self.log.fail(prepared.capture_key, failed)
        except AttemptError:
            pass  # the intent never landed: the call is not recorded at all
        except Exception as unrecorded:
            error.add_note(
                f"Grove could not tell whether the intent of call {prepared.call_id!r} of "
                f"attempt {prepared.capture_key!r} landed ({failure_detail(unrecorded)}); if "
                "it did, the call stays pending until the attempt's settle timeout"
            )

    def _infer(self, prepared: _PreparedCall) -> Generation:
        """Generate the call."""
        plan = prepared.plan
        return self.engine.generate(plan.prompt_token_ids, prepared.sampling, *prepared.images)

    def _delta(self, prepared: _PreparedCall, generation: Generation, answer: Answer) -> CallDelta:
        """The call's delta: the new prompt tokens, the generation and its logprobs, routes
        (``docs/moe.md``), the media the call stores, and the conversation items it adds (its
        request's new items, then its answer: ``docs/fork.md``, "The conversation")."""
        plan = prepared.plan
        return CallDelta.from_lists(
            plan.delta_token_ids,
            generation.token_ids,
            generation.logprobs,
            routes=generation.delta_routes(len(plan.delta_token_ids)),
            media=prepared.media.stored,
            messages=(*prepared.messages, *answer.normalized.messages),
        )

    def _store(self, prepared: _PreparedCall, delta: CallDelta) -> BlobRef:
        """Write the call's delta blob (write-once), before its commit event."""
        return self.blobs.put_delta(staging_key(prepared.capture_key, prepared.call_id), delta)

    def _commit(
        self, view: AttemptView, prepared: _PreparedCall, inference: _Inference, blob: BlobRef
    ) -> CommittedOutput:
        """Parse the output and append ``call.committed``: the point of no return."""
        generation = inference.generation
        output = commit_event(
            prepared.call_id,
            prepared.plan,
            generation,
            inference.delta,
            blob,
            answer=inference.answer,
            parent_chain_digest=self.views.parent_chain_digest(
                view, prepared.plan.decision.parent_call_id
            ),
        )
        if prepared.source_capture_key is not None:
            event = output.event.model_copy(
                update={"source_capture_key": prepared.source_capture_key}
            )
            output = replace(output, event=event)
        version = self.log.commit(prepared.capture_key, output.event)
        if version is not None:
            self.views.fold_own(view, version, output.event)
        return output

    def _remember(
        self,
        view: AttemptView,
        prepared: _PreparedCall,
        inference: _Inference,
        blob: BlobRef,
        output: CommittedOutput,
    ) -> CallOutcome:
        """Cache the committed call's chain in the view, and answer it. (After the commit: a
        failure here records nothing, since the call is committed.)"""
        plan, generation, committed = prepared.plan, inference.generation, output.event
        self.views.remember(
            view,
            prepared.call_id,
            plan.decision.parent_call_id,
            tokens=(*plan.prompt_token_ids, *generation.token_ids),
            output=RawOutput(committed.replay_summary.item_count - 1, output.text),
            media=[item.descriptor for item in prepared.media.stored],
            prev_len=plan.prev_len,
        )
        return CallOutcome(
            capture_key=prepared.capture_key,
            call_id=prepared.call_id,
            response_id=committed.response_id,
            message=output.message,
            generation=generation,
            decision=plan.decision,
            prompt_tokens=plan.prompt_len,
            blob=blob,
            text=output.text,
            finish_reason=committed.finish_reason,
        )

    def _record_failure(self, prepared: _PreparedCall, reason: str, error: BaseException) -> None:
        """Record ``call.failed`` for ``error``, raised after the call's intent. When that
        record fails too, ``error`` carries a note saying so and the call stays pending (its
        attempt's settle timeout resolves it); ``error`` is re-raised by the caller either way."""
        failed = CallFailed(call_id=prepared.call_id, reason=reason, detail=failure_detail(error))
        try:
            self.log.fail(prepared.capture_key, failed)
        except Exception as unrecorded:
            error.add_note(
                f"Grove could not record call.failed ({reason}) for call {prepared.call_id!r} "
                f"of attempt {prepared.capture_key!r}: {failure_detail(unrecorded)}; the call "
                "stays pending until the attempt's settle timeout"
            )

    # -- planning ----------------------------------------------------------------------------

    def _plan(self, view: AttemptView, call: ModelCall) -> tuple[PromptPlan, NormalizedRequest]:
        request = normalize_messages(call.items)
        plan = plan_call(
            self.renderer,
            request,
            call.options,
            view.index,
            lambda call_id: self.views.chain_tokens(view, call_id),
            lambda call_id: self.views.parent_outputs(view, call_id),
            attempt=view.state,
            strict=self.strict,
        )
        return plan, request

    def _media(
        self, view: AttemptView, request: NormalizedRequest, plan: PromptPlan, model: str
    ) -> MediaPlan:
        """The images the call stores and generates from, its retained images verified against
        the chain of the call admission chose (``capture/media.py``); none for text."""
        if not request_images(request.messages):
            return MediaPlan()
        candidate = plan.decision.candidate_call_id
        return plan_media(
            self.renderer,
            request.messages,
            plan,
            None if candidate is None else self.views.chain_media(view, candidate),
            None if candidate is None else self.views.chain_tokens(view, candidate),
            capture_key=view.state.capture_key,
            model=model,
        )


def _intended_elsewhere(prepared: _PreparedCall) -> AttemptError:
    """The refusal of a call whose id another request intended (or is running) first."""
    return AttemptError(
        prepared.capture_key,
        "the call id is already intended by another request; each call is inferred "
        "once: send a new call id",
        prepared.call_id,
    )


def _require_open(state: AttemptState, capture_key: str, call_id: str | None) -> None:
    """Refuse a call of an attempt never opened, or one whose harness already returned."""
    if state.opened is None:
        raise AttemptError(capture_key, "unknown attempt: open it first", call_id)
    if state.admissions_closed:
        raise AttemptError(
            capture_key, "admissions are closed: the harness already returned", call_id
        )
