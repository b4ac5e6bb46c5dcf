"""The capture write path: one model call from request to committed delta, or a recorded failure.

For each call: normalize the request, admit it against the attempt's committed calls
(``ledger/admission.py``), plan its prompt (``capture/splice.py``: the parent chain's exact tokens
plus the rendered suffix, or a root), record the intent (before inference), generate through the
engine, store the delta blob (before the commit event: the ledger event is the commit marker),
then commit. An engine or storage failure is recorded as ``call.failed`` with its reason code and
re-raised. ``measure`` runs the same normalization, admission and planning and writes nothing.
The intent records the policy version the engine served at admission (its ``policy_version``
attribute, if it has one); the commit, the version of the weights that sampled the generation.

The committed output is the generated text parsed into an assistant message (reasoning, and tool
calls when the request offers tools: ``capture/toolcalls.py``); its fingerprint and the replay
summary describe that message, so a client that echoes it back continues the call. The splice
still resumes from the exact generated tokens (``capture/splice.py``, ``RawOutput``).

The service keeps, per attempt, the folded state and the admission index in memory and brings them
up to date by reading only the events after the version it has, so admitting a call costs the
same at call 1,000 as at call 10. Parent chains are read from their blobs (digests verified)
once and cached. The ledger is read outside any lock, and the view is brought up to date under a
lock of its own attempt, so calls of different attempts never wait for each other. The service
folds its own intents and commits into the view as they land, so a gateway's call reads nothing
while the view holds all this process appended (``current_state``): it is planned against the
view (``generate(refresh=False)``) and its intent appended only at the view's version, so a plan
that another process's append made stale fails with ``StaleAttemptState`` before anything is
written, and is read and planned again. A call is planned once (``fit`` adjusts its sampling to
the planned prompt before anything is written).
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from grove.capture.engine import Engine, Generation, SamplingParams
from grove.capture.media import MediaPlan, chain_media, plan_media, request_images
from grove.capture.render import (
    NormalizedRequest,
    Renderer,
    RenderOptions,
    admission_items,
    normalize_messages,
)
from grove.capture.splice import PromptPlan, RawOutput, plan_call
from grove.capture.toolcalls import assistant_message, parse_output
from grove.ledger.admission import AdmissionDecision, AdmissionIndex
from grove.ledger.attempt import (
    AttemptError,
    AttemptLog,
    AttemptState,
    fold_attempt,
    index_call_event,
)
from grove.ledger.attempt import CallStatus as LedgerCallStatus
from grove.ledger.events import (
    AttemptOpened,
    CallCommitted,
    CallFailed,
    CallIntended,
    RolloutSelected,
)
from grove.ledger.fingerprint import fingerprint_output
from grove.storage import (
    BlobRef,
    BlobStore,
    CallDelta,
    MediaDescriptor,
    StorageError,
    chain_digest,
    staging_key,
)

__all__ = [
    "FAILURE_REASONS",
    "CallOutcome",
    "CaptureService",
    "MeasuredCall",
    "ModelCall",
    "derived_seed",
    "output_message",
]

FAILURE_REASONS = (
    "engine_error",
    "storage_error",
    "request_finished_without_staged_coordinates",
    "rejected_by_harness",
)


@dataclass(frozen=True)
class ModelCall:
    """One model call as a harness asks for it: its items (Chat messages or Responses input
    items), the render options, sampling, and optionally the call id to record it under."""

    items: Sequence[Mapping[str, Any]]
    options: RenderOptions
    sampling: SamplingParams
    call_id: str | None = None


@dataclass(frozen=True)
class MeasuredCall:
    """What ``measure`` found: the prompt length the call would have, and the decision."""

    prompt_tokens: int
    decision: AdmissionDecision


@dataclass(frozen=True)
class CallOutcome:
    """A committed call, as the gateway answers the harness.

    ``message`` is the Chat Completions assistant message (``grove.capture.toolcalls``); ``text``
    the exact generated text it was parsed from (stop token excluded); ``finish_reason`` the one
    recorded and answered: ``tool_calls`` when the generation stopped after tool calls, else the
    engine's ``stop`` or ``length``.
    """

    capture_key: str
    call_id: str
    response_id: str
    message: dict[str, Any]
    generation: Generation
    decision: AdmissionDecision
    prompt_tokens: int
    blob: BlobRef
    text: str = ""
    finish_reason: str = "stop"


def output_message(text: str, *, tools: bool = False) -> dict[str, Any]:
    """The assistant message a harness sends back for a generation with this text: reasoning and,
    when the request offered ``tools``, tool calls parsed (each given a fresh ``call_…`` id)."""
    parsed = parse_output(text, tool_calls=tools)
    return assistant_message(parsed, [f"call_{uuid.uuid4().hex[:24]}" for _ in parsed.tool_calls])


Fit = Callable[[int], SamplingParams]
"""``prompt tokens -> sampling``: the sampling a call runs with once its prompt is planned (max
tokens fitted to the context), or an error that refuses the call before anything is written."""

DEFAULT_CACHED_VIEWS = 4096


def _committed_parent(state: AttemptState, call_id: str) -> CallCommitted:
    """The commit of ``call_id``, a parent admission picked (it picks committed calls only)."""
    call = state.calls[call_id]
    if call.committed is None or call.status is not LedgerCallStatus.COMMITTED:
        raise AttemptError(
            state.capture_key, f"a parent must be committed, but is {call.status.value}", call_id
        )
    return call.committed


@dataclass
class _AttemptView:
    state: AttemptState
    index: AdmissionIndex
    chains: dict[str, tuple[int, ...]]
    outputs: dict[str, tuple[RawOutput, ...]]
    lock: threading.Lock = field(default_factory=threading.Lock)
    media: dict[str, tuple[MediaDescriptor, ...]] = field(default_factory=dict)


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
    ) -> None:
        self.log = log
        self.blobs = blobs
        self.renderer = renderer
        self.engine = engine
        self.model_fingerprint = model_fingerprint
        self.strict = strict  # refuse unexplained roots (docs/normalization.md, "Strict mode")
        self.cached_views = cached_views
        self._views: OrderedDict[str, _AttemptView] = OrderedDict()
        self._lock = threading.Lock()  # guards _views only; each view has its own lock

    # -- attempts ----------------------------------------------------------------------------

    def open_attempt(
        self,
        capture_key: str,
        *,
        rollout_id: str,
        prompt_group: str,
        rollout_index: int,
        policy_version: int = 0,
        forest_mode: bool = True,
        selection_policy: str = "returned_history",
        template_fingerprint: str | None = None,
        seed: int | None = None,
    ) -> None:
        """Start an attempt (idempotent for the same fields)."""
        template = (
            template_fingerprint
            or hashlib.sha256(str(self.renderer.tokenizer.chat_template).encode()).hexdigest()
        )
        self.log.open(
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
            )
        )
        self._adopt(capture_key)

    def close(self, capture_key: str) -> None:
        """The harness returned: refuse later calls of this attempt."""
        self.log.close_admissions(capture_key)
        self._adopt(capture_key)

    def settle(self, capture_key: str, timeout_s: float = 300.0) -> AttemptState:
        """Close admissions, wait for pending calls up to ``timeout_s``, record the outcome."""
        settled = self.log.settle(capture_key, timeout_s)
        self._adopt(capture_key)
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
            self._adopt(capture_key)
        return settled

    def select(self, capture_key: str, selected: RolloutSelected) -> None:
        """Record the selection policy's result for the attempt."""
        self.log.select(capture_key, selected)
        self._adopt(capture_key)

    def state(self, capture_key: str) -> AttemptState:
        """The attempt's state, brought up to date from the ledger (only the events not yet seen);
        ``generate(refresh=False)`` then plans against it without reading again."""
        return self._view(capture_key).state

    def current_state(self, capture_key: str) -> AttemptState:
        """The attempt's state as this service last knew it, read from the ledger only when the
        view is behind this process's own appends (or absent). Another process's appends since
        are not seen: ``generate(refresh=False)`` then fails with ``StaleAttemptState`` before
        writing anything, and the caller reads (``state``) and tries again."""
        view = self._view(capture_key, read=False)
        if view.state.version != self.log.known_version(capture_key):
            view = self._view(capture_key)
        return view.state

    # -- calls -------------------------------------------------------------------------------

    def measure(self, capture_key: str, call: ModelCall) -> MeasuredCall:
        """The prompt length and decision ``call`` would get now; writes nothing."""
        view = self._view(capture_key)
        self._require_open(view.state, capture_key, call.call_id)
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
        """Run one model call: admit, plan, intend, generate, store, commit.

        ``fit`` (given the planned prompt length) decides the sampling the call runs with, or
        refuses it, before the intent. ``refresh=False``: the call is planned against the view
        as the caller last brought it up to date (``state``, ``current_state``), unread, and its
        intent is appended only at that view's version: another writer's append since raises
        ``StaleAttemptState`` with nothing written (read again and retry).
        """
        call_id = call.call_id or f"call-{uuid.uuid4().hex[:16]}"
        view = self._view(capture_key, read=refresh)
        planned = view.state
        self._require_open(planned, capture_key, call_id)
        plan, request = self._plan(view, call)
        media = self._media(view, request, plan, call.options.model)
        images = (media.inputs,) if media.inputs else ()  # a vision engine's extra argument
        decision, summary = plan.decision, plan.request_summary
        sampling = call.sampling if fit is None else fit(plan.prompt_len)
        if sampling.seed is None:
            sampling = replace(sampling, seed=derived_seed(planned, len(planned.calls)))
        self.engine.check(plan.prompt_token_ids, sampling, *images)  # refuse before recording
        intended = CallIntended(
            call_id=call_id,
            decision=decision.kind.value,
            parent_call_id=decision.parent_call_id,
            root_reason=None if decision.reason is None else decision.reason.value,
            replay_summary=summary,
            equivalences=tuple(e.value for e in decision.equivalences),
            prompt_tokens=plan.prompt_len,
            admission=plan.admission_record(),
            policy_version=getattr(self.engine, "policy_version", None),
            constraint=None if sampling.constraint is None else sampling.constraint.record(),
        )
        recorded = self.log.intend(capture_key, intended, at=None if refresh else planned)
        if recorded and not refresh:
            self._fold_own(view, planned.version + 1, intended)
        if not recorded:
            # Another request with this call id recorded the intent first (a racing retry):
            # it alone infers, stores and commits the call.
            raise AttemptError(
                capture_key,
                "the call id is already intended by another request; each call is inferred "
                "once: send a new call id",
                call_id,
            )
        try:
            generation = self.engine.generate(plan.prompt_token_ids, sampling, *images)
            routes = generation.delta_routes(len(plan.delta_token_ids))  # docs/moe.md
        except Exception as error:
            self._fail(capture_key, call_id, "engine_error", error)
            raise
        delta = CallDelta.from_lists(
            plan.delta_token_ids,
            generation.token_ids,
            generation.logprobs,
            routes=routes,
            media=media.stored,
        )
        try:
            blob = self.blobs.put_delta(staging_key(capture_key, call_id), delta)
        except StorageError as error:
            self._fail(capture_key, call_id, "storage_error", error)
            raise
        text = self._text(generation)
        message = output_message(text, tools=call.options.tools is not None)
        normalized = normalize_messages([message])
        output_items = admission_items(normalized)
        response_id = f"resp-{uuid.uuid4().hex}"
        finish_reason = (
            "tool_calls"
            if generation.finish_reason == "stop" and message.get("tool_calls")
            else generation.finish_reason
        )
        committed_summary = summary.extended(output_items)
        committed = CallCommitted(
            call_id=call_id,
            parent_call_id=decision.parent_call_id,
            prev_len=plan.prev_len,
            delta_len=delta.delta_len,
            cum_len=plan.prev_len + delta.delta_len,
            prompt_delta_len=len(plan.delta_token_ids),
            generated_len=len(generation.token_ids),
            blob_key=blob.key,
            blob_sha256=blob.sha256,
            blob_bytes=blob.size,
            chain_digest=chain_digest(
                self._parent_chain_digest(view, decision.parent_call_id),
                delta.prompt_delta,
                delta.generated,
            ),
            finish_reason=finish_reason,
            response_id=response_id,
            output_fingerprint=fingerprint_output(normalized.messages),
            replay_summary=committed_summary,
            policy_version=generation.policy_version,
        )
        version = self.log.commit(capture_key, committed)
        if version is not None:
            self._fold_own(view, version, committed)
        own = RawOutput(committed_summary.item_count - 1, text)
        with view.lock:
            view.chains[call_id] = (*plan.prompt_token_ids, *generation.token_ids)
            view.outputs[call_id] = (*self._parent_outputs(view, decision.parent_call_id), own)
            if media.stored or decision.parent_call_id in view.media:
                view.media[call_id] = chain_media(
                    self._chain_media(view, decision.parent_call_id),
                    [item.descriptor for item in media.stored],
                    plan.prev_len,
                )
        return CallOutcome(
            capture_key=capture_key,
            call_id=call_id,
            response_id=response_id,
            message=message,
            generation=generation,
            decision=decision,
            prompt_tokens=plan.prompt_len,
            blob=blob,
            text=text,
            finish_reason=finish_reason,
        )

    def fail(self, capture_key: str, call_id: str, reason: str, detail: str = "") -> None:
        """Record that a call ended without a usable capture (e.g. the harness rejected it)."""
        if reason not in FAILURE_REASONS:
            raise AttemptError(
                capture_key, f"unknown failure reason {reason!r}; use one of {FAILURE_REASONS}"
            )
        self.log.fail(capture_key, CallFailed(call_id=call_id, reason=reason, detail=detail))

    # -- internals ---------------------------------------------------------------------------

    def _fail(self, capture_key: str, call_id: str, reason: str, error: Exception) -> None:
        detail = f"{type(error).__name__}: {error}"[:2000]
        self.log.fail(capture_key, CallFailed(call_id=call_id, reason=reason, detail=detail))

    def _text(self, generation: Generation) -> str:
        return self.renderer.decode(generation.content_token_ids)

    @staticmethod
    def _require_open(state: AttemptState, capture_key: str, call_id: str | None) -> None:
        if state.opened is None:
            raise AttemptError(capture_key, "unknown attempt: open it first", call_id)
        if state.admissions_closed:
            raise AttemptError(
                capture_key, "admissions are closed: the harness already returned", call_id
            )

    def _view(self, capture_key: str, *, read: bool = True) -> _AttemptView:
        """The attempt's state and admission index, updated from the events not yet seen
        (``read=False``: as last read, unless the service holds no view of it yet)."""
        with self._lock:
            view = self._views.get(capture_key)
            if view is None:
                view = _AttemptView(AttemptState(capture_key), AdmissionIndex(), {}, {})
                self._views[capture_key] = view
                read = True
            self._views.move_to_end(capture_key)
            while len(self._views) > self.cached_views:
                self._views.popitem(last=False)
        if not read:
            return view
        # Read outside every lock; concurrent readers of one attempt may read overlapping
        # events, and each folds only those after the version the view has reached.
        stored = self.log.store.read_stream(capture_key, after_version=view.state.version)
        with view.lock:
            fresh = [s.decode() for s in stored if s.stream_version > view.state.version]
            view.state = fold_attempt(capture_key, fresh, view.state)
            for event in fresh:
                index_call_event(view.index, view.state, event)
            self.log.keep(view.state)  # the log's next append expects this version, unread
        return view

    def _adopt(self, capture_key: str) -> None:
        """Take the log's state after this service's own attempt-level append (opened, closed,
        settled, selected) into the attempt's view when the two differ by no call: the view's
        admission index, built from call events alone, then stays exact, and the next request
        finds the view current (``current_state``) without reading. Otherwise the view stays
        as it is, and is read when next needed."""
        held = self.log.held(capture_key)
        with self._lock:
            view = self._views.get(capture_key)
        if held is None or view is None:
            return
        with view.lock:
            if held.version > view.state.version and held.calls == view.state.calls:
                view.state = held

    @staticmethod
    def _fold_own(view: _AttemptView, version: int, event: CallIntended | CallCommitted) -> None:
        """Fold this service's own append, landed at ``version``, into the view when the view
        is at the version just before it (otherwise the next call reads what it missed)."""
        with view.lock:
            if view.state.version == version - 1:
                view.state = fold_attempt(view.state.capture_key, [event], view.state)
                index_call_event(view.index, view.state, event)

    def _plan(self, view: _AttemptView, call: ModelCall) -> tuple[PromptPlan, NormalizedRequest]:
        request = normalize_messages(call.items)
        plan = plan_call(
            self.renderer,
            request,
            call.options,
            view.index,
            lambda call_id: self._chain_tokens(view, call_id),
            lambda call_id: self._parent_outputs(view, call_id),
            attempt=view.state,
            strict=self.strict,
        )
        return plan, request

    def _media(
        self, view: _AttemptView, request: NormalizedRequest, plan: PromptPlan, model: str
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
            None if candidate is None else self._chain_media(view, candidate),
            None if candidate is None else self._chain_tokens(view, candidate),
            capture_key=view.state.capture_key,
            model=model,
        )

    def _chain_media(self, view: _AttemptView, call_id: str | None) -> tuple[MediaDescriptor, ...]:
        """The media of ``call_id``'s chain in chain coordinates, root first (none for none)."""
        if call_id is None:
            return ()
        if call_id not in view.chains:
            self._load_chain(view, call_id)
        return view.media.get(call_id, ())

    @staticmethod
    def _parent_chain_digest(view: _AttemptView, parent_call_id: str | None) -> str | None:
        if parent_call_id is None:
            return None
        return _committed_parent(view.state, parent_call_id).chain_digest

    def _chain_tokens(self, view: _AttemptView, call_id: str) -> tuple[int, ...]:
        """The exact tokens of ``call_id``'s chain: every ancestor's delta and generation."""
        cached = view.chains.get(call_id)
        if cached is None:
            self._load_chain(view, call_id)
            cached = view.chains[call_id]
        return cached

    def _parent_outputs(self, view: _AttemptView, call_id: str | None) -> tuple[RawOutput, ...]:
        """The exact output texts of ``call_id``'s chain, root first (none for no call)."""
        if call_id is None:
            return ()
        cached = view.outputs.get(call_id)
        if cached is None:
            self._load_chain(view, call_id)
            cached = view.outputs[call_id]
        return cached

    def _load_chain(self, view: _AttemptView, call_id: str) -> None:
        """Read ``call_id``'s chain from its blobs (digests verified) into the view's caches."""
        committed = _committed_parent(view.state, call_id)
        parent = view.state.calls[call_id].parent_call_id
        delta = self.blobs.get_delta(
            BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        )
        generated = delta.generated.tolist()
        content = generated if committed.finish_reason == "length" else generated[:-1]
        output = RawOutput(committed.replay_summary.item_count - 1, self.renderer.decode(content))
        parent_tokens = () if parent is None else self._chain_tokens(view, parent)
        view.chains[call_id] = (*parent_tokens, *delta.prompt_delta.tolist(), *generated)
        view.outputs[call_id] = (*self._parent_outputs(view, parent), output)
        own_media = [item.descriptor for item in delta.media]
        if own_media or parent in view.media:
            view.media[call_id] = chain_media(
                self._chain_media(view, parent), own_media, committed.prev_len
            )
