"""The gateway's shared wire records: errors, the attempt API, and the token logprob.

The model-call bodies live with their API: ``capture/chat_api.py`` (Chat Completions) and
``capture/responses_api.py`` (Responses); ``capture/streaming.py`` sends their answers as
server-sent events. Producer of the request models: a harness (any OpenAI-compatible client);
consumer: ``capture/gateway.py``. Every request model is explicit (unknown fields are refused,
not ignored), so the served OpenAPI schema says exactly what Grove accepts.

Errors are answered on the wire as OpenAI does, ``{"error": {"message", "type", "code",
"param"}}``; :data:`ERROR_STATUS` is the one table that gives every Grove error class its HTTP
status and Grove's stable code (``capture/refusals.py`` answers with it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grove.capture import errors as capture_errors
from grove.capture import vllm
from grove.capture.surrogates import lone_surrogate_at
from grove.ledger import admission
from grove.ledger import errors as ledger_errors
from grove.ledger.attempt import AttemptError, AttemptState, CallStatus, StaleAttemptState
from grove.ledger.bounds import MAX_NAME_CHARS, Count, Name, Seed
from grove.ledger.events import MAX_ENVIRONMENT_REASON_CHARS
from grove.storage import errors as storage_errors

__all__ = [
    "ERROR_STATUS",
    "ERROR_TYPES",
    "AttemptCall",
    "AttemptFork",
    "AttemptSelection",
    "AttemptStatus",
    "ErrorBody",
    "ErrorDetail",
    "ErrorStatus",
    "ForkFrom",
    "HarnessResult",
    "HealthStatus",
    "JSONObject",
    "Measurement",
    "ModelCard",
    "ModelList",
    "OpenAttemptRequest",
    "RejectRequest",
    "TokenLogprob",
    "WireReply",
    "WireRequest",
    "attempt_status",
    "error_body",
    "error_status",
    "refuse_lone_surrogates",
]

JSONObject = dict[str, Any]


def refuse_lone_surrogates(body: Any) -> Any:
    """``body`` (parsed JSON) unchanged; ``ValueError`` naming where it holds a lone surrogate,
    which no store can hold (``capture/surrogates.py``). Every request model runs it first."""
    where = lone_surrogate_at(body)
    if where is not None:
        raise ValueError(
            f"{where or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff "
            "escape), which is not text; send valid Unicode (pair the surrogates, or escape the "
            "character's code point)"
        )
    return body


class WireRequest(BaseModel):
    """A request body: unknown fields are refused, never silently ignored; a lone surrogate
    anywhere in it is refused before any field is read."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, body: Any) -> Any:
        return refuse_lone_surrogates(body)


class WireReply(BaseModel):
    """An answer body: frozen once built."""

    model_config = ConfigDict(frozen=True)


# -- errors ----------------------------------------------------------------------------------


class ErrorDetail(WireReply):
    """Why a request was refused: a message that says what to do, OpenAI's ``type``, Grove's
    stable ``code`` (``docs/gateway.md`` lists them) and the offending request field if any."""

    message: str
    type: str
    code: str
    param: str | None = None


class ErrorBody(WireReply):
    """Every 4xx and 5xx answer of the gateway: ``{"error": {...}}``, as OpenAI sends it."""

    error: ErrorDetail


# -- errors on the wire ----------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorStatus:
    """How an error is answered: its HTTP status and Grove's stable error ``code``."""

    status: int
    code: str


ERROR_STATUS: Final[Mapping[type[Exception], ErrorStatus]] = {
    # capture: a request that cannot be normalized, rendered or generated as asked is 400;
    # an engine or splice that fails on good input is the server's problem.
    capture_errors.CaptureError: ErrorStatus(500, "capture_error"),
    capture_errors.NormalizationError: ErrorStatus(400, "invalid_messages"),
    capture_errors.RenderError: ErrorStatus(400, "render_failed"),
    capture_errors.SpliceError: ErrorStatus(500, "splice_failed"),
    capture_errors.AttemptOptionsChangedError: ErrorStatus(409, "attempt_options_changed"),
    capture_errors.UnexplainedRootError: ErrorStatus(409, "unexplained_root"),
    capture_errors.MediaError: ErrorStatus(400, "invalid_media"),
    capture_errors.InvalidImageError: ErrorStatus(400, "invalid_image"),
    capture_errors.ImagesNotSupportedError: ErrorStatus(400, "images_not_supported"),
    capture_errors.RetainedMediaMismatchError: ErrorStatus(409, "retained_media_mismatch"),
    capture_errors.EngineError: ErrorStatus(502, "engine_failed"),
    capture_errors.InvalidSamplingError: ErrorStatus(400, "invalid_sampling"),
    capture_errors.UnsupportedSamplingError: ErrorStatus(400, "unsupported_sampling"),
    capture_errors.InvalidPromptError: ErrorStatus(400, "invalid_prompt"),
    capture_errors.PromptTooLongError: ErrorStatus(400, "prompt_too_long"),
    capture_errors.InvalidGenerationError: ErrorStatus(502, "invalid_generation"),
    # the vLLM server behind the gateway: unreachable is 503 (retry later), any other failure 502
    vllm.EngineUnavailableError: ErrorStatus(503, "engine_unavailable"),
    vllm.EngineRejectedError: ErrorStatus(502, "engine_rejected"),
    vllm.WeightUpdateUnavailableError: ErrorStatus(502, "weight_reload_unavailable"),
    vllm.ModelNotServedError: ErrorStatus(502, "model_not_served"),
    vllm.EngineResponseError: ErrorStatus(502, "engine_bad_response"),
    # ledger
    ledger_errors.LedgerError: ErrorStatus(500, "ledger_error"),
    ledger_errors.EventValidationError: ErrorStatus(400, "invalid_event"),
    ledger_errors.UnknownEventType: ErrorStatus(500, "unknown_event_type"),
    ledger_errors.InvalidEventPayload: ErrorStatus(400, "invalid_event"),
    ledger_errors.StreamIdError: ErrorStatus(400, "invalid_capture_key"),
    ledger_errors.WrongExpectedVersion: ErrorStatus(409, "concurrent_write"),
    ledger_errors.EventIdConflict: ErrorStatus(409, "conflicting_event"),
    ledger_errors.ImportConflict: ErrorStatus(409, "import_conflict"),
    ledger_errors.AppendOnlyViolation: ErrorStatus(500, "append_only_violation"),
    ledger_errors.SchemaNotReady: ErrorStatus(503, "ledger_schema_not_ready"),
    ledger_errors.SchemaOutOfDate: ErrorStatus(503, "ledger_schema_out_of_date"),
    ledger_errors.DatabaseUnavailable: ErrorStatus(503, "ledger_unavailable"),
    ledger_errors.PrivilegeRefused: ErrorStatus(500, "ledger_privilege_refused"),
    AttemptError: ErrorStatus(409, "attempt_rule"),
    StaleAttemptState: ErrorStatus(409, "concurrent_write"),  # every plan met another append
    admission.AdmissionError: ErrorStatus(400, "not_admissible"),
    admission.EmptyRequestError: ErrorStatus(400, "empty_request"),
    admission.AssistantPrefillError: ErrorStatus(400, "assistant_prefill"),
    admission.EmptySuffixError: ErrorStatus(400, "empty_suffix"),
    admission.AmbiguousParentError: ErrorStatus(409, "ambiguous_parent"),
    # storage: keys come from the request (400); unusable or unreachable blobs are not its fault.
    storage_errors.StorageError: ErrorStatus(500, "storage_error"),
    storage_errors.InvalidKeyError: ErrorStatus(400, "invalid_key"),
    storage_errors.InvalidBlobUrlError: ErrorStatus(500, "invalid_blob_url"),
    storage_errors.InvalidBlobRefError: ErrorStatus(500, "invalid_blob_ref"),
    storage_errors.InvalidDeltaError: ErrorStatus(500, "invalid_delta"),
    storage_errors.BlobConflictError: ErrorStatus(409, "blob_conflict"),
    storage_errors.PendingBlobError: ErrorStatus(409, "blob_pending"),
    storage_errors.UnusableBlobError: ErrorStatus(500, "blob_unusable"),
    storage_errors.MissingBlobError: ErrorStatus(500, "blob_missing"),
    storage_errors.BlobIntegrityError: ErrorStatus(500, "blob_integrity"),
    storage_errors.BlobFormatError: ErrorStatus(500, "blob_format"),
    storage_errors.StorageUnavailableError: ErrorStatus(503, "storage_unavailable"),
}
"""Every Grove error class the gateway can meet, with its answer (a test pins completeness)."""

ERROR_TYPES: Final = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "conflict_error",
    422: "invalid_request_error",
    501: "not_implemented_error",
}
"""OpenAI's error ``type`` per status; other statuses are ``server_error``."""


def error_status(error: Exception) -> ErrorStatus:
    """The answer for ``error``: its closest class in :data:`ERROR_STATUS`, else 500."""
    for cls in type(error).__mro__:
        found = ERROR_STATUS.get(cls)
        if found is not None:
            return found
    return ErrorStatus(500, "internal_error")


def error_body(status: int, code: str, message: str, param: str | None = None) -> ErrorBody:
    """The OpenAI-style body answering an error with ``status`` and Grove's ``code``."""
    kind = ERROR_TYPES.get(status, "server_error")
    return ErrorBody(error=ErrorDetail(message=message, type=kind, code=code, param=param))


# -- shared by the model-call answers -----------------------------------------------------


class TokenLogprob(WireReply):
    """One generated token as sampled: its text, log-probability and exact bytes.

    ``bytes`` are the token's own bytes (byte-level BPE: the token's symbols through the byte
    decoder), so joining them in order gives the UTF-8 of the generated text even where a token
    ends inside a multi-byte character (its ``token`` text then holds U+FFFD).
    """

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[JSONObject] = Field(default_factory=list)


# -- attempts --------------------------------------------------------------------------------


class ForkFrom(WireRequest):
    """``fork_from`` of ``POST /v1/attempts``: the committed call of another attempt to fork."""

    capture_key: Name
    call_id: Name


class OpenAttemptRequest(WireRequest):
    """``POST /v1/attempts``: start one execution of the harness for one logical rollout."""

    capture_key: str = Field(
        description="names the attempt's event stream and blob partition: 1-200 of "
        "'A-Z a-z 0-9 . _ : @ -', a letter or digit first, no '..'"
    )
    rollout_id: Name
    prompt_group: Name
    rollout_index: Count
    policy_version: Count = 0
    forest_mode: bool | None = Field(
        default=None, description="None: the server's setting (token_capture.forest_training)"
    )
    selection_policy: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_NAME_CHARS,
        description="a built-in (returned_history, all_captured) or a policy registered in the "
        "server's configuration; None: the server's own (capture/attempt_settings.py)",
    )
    seed: Seed | None = Field(
        default=None,
        description="seeds the calls that send no seed (default: derived from the rollout id)",
    )
    fork_from: ForkFrom | None = Field(
        default=None,
        description="the committed call of another attempt this attempt continues "
        "(docs/fork.md); None: a fresh rollout",
    )


class HarnessResult(BaseModel):
    """``POST /v1/attempts/{capture_key}/result``: the harness's ordinary result dictionary.

    Only ``reward`` is required; the evidence keys are read by the selection policy
    (``training/selection.py``): ``output`` (the returned history), ``responses``,
    ``model_calls``, ``trajectory.turns[].model_calls`` and ``terminal_response_id``. Other keys
    are kept and passed on unchanged.
    """

    model_config = ConfigDict(extra="allow")

    reward: float = Field(strict=True, allow_inf_nan=False)
    output: list[JSONObject] | None = None
    responses: list[JSONObject] | None = None
    model_calls: list[str | JSONObject] | None = None
    trajectory: JSONObject | None = None
    terminal_response_id: Name | None = None
    environment_masked: bool = Field(
        default=False,
        strict=True,
        description="true: the environment could not score this rollout (a sandbox crash); it "
        'trains nothing while its group trains (docs/forest.md, "Environment masks")',
    )
    environment_mask_reason: str | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_ENVIRONMENT_REASON_CHARS,
        description="why the environment masked it; only with environment_masked true",
    )

    @model_validator(mode="before")
    @classmethod
    def _text_is_unicode(cls, body: Any) -> Any:
        return refuse_lone_surrogates(body)

    @model_validator(mode="after")
    def _reason_needs_the_mask(self) -> HarnessResult:
        if self.environment_mask_reason is not None and not self.environment_masked:
            raise ValueError(
                "environment_mask_reason is given but environment_masked is not true; send "
                "environment_masked: true with its reason, or neither"
            )
        return self


class RejectRequest(WireRequest):
    """``POST /v1/attempts/{capture_key}/calls/{call_id}/reject``: why the harness rejected it."""

    detail: str = ""


class AttemptCall(WireReply):
    """One call of an attempt: where it stands, its parent and the admission decision."""

    call_id: str
    status: Literal["pending", "committed", "failed"]
    decision: Literal["root", "continuation"]
    parent_call_id: str | None
    root_reason: str | None
    prompt_tokens: int
    response_id: str | None = None
    finish_reason: str | None = None
    generated_tokens: int | None = None
    failure_reason: str | None = None
    late: bool = False
    source_capture_key: str | None = None  # the parent's attempt when not this one (a fork)


class AttemptFork(WireReply):
    """The call an attempt forks: its attempt and id, the length of its chain, its answer (the
    exact generated text) and its conversation through that answer, to send again with the
    fork's next observation, in each API's form (``grove.capture.conversations``): ``messages``
    (Chat Completions messages), ``input`` (Responses input items) and ``messages_api`` (the
    Messages API's ``system`` and ``messages``). A form is None where the conversation has no
    exact such form, and all are None where the source chain was recorded before Grove recorded
    conversations. All but the first three are filled where the gateway reads the blobs."""

    source_capture_key: str
    source_call_id: str
    source_cum_len: int
    answer: str | None = None
    messages: list[dict[str, Any]] | None = None
    input: list[dict[str, Any]] | None = None
    messages_api: dict[str, Any] | None = None


class AttemptSelection(WireReply):
    """The recorded ``rollout.selected``: policy, ordered call ids, scored response, reward."""

    policy: str
    call_ids: list[str]
    terminal_response_id: str | None
    reward: float


class AttemptStatus(WireReply):
    """``GET /v1/attempts/{capture_key}``: the attempt as the ledger knows it now."""

    capture_key: str
    rollout_id: str
    prompt_group: str
    rollout_index: int
    policy_version: int
    forest_mode: bool
    selection_policy: str
    calls: list[AttemptCall]
    pending: list[str]
    closed: bool
    settled: bool
    timed_out: bool
    selection: AttemptSelection | None
    fork_from: AttemptFork | None = None


class Measurement(WireReply):
    """``POST /v1/attempts/{capture_key}/measure``: what the call would get; nothing written.

    ``reason`` is the root reason (None for a continuation), ``parent_call_id`` the parent of a
    continuation (None for a root).
    """

    prompt_tokens: int
    decision: Literal["root", "continuation"]
    parent_call_id: str | None
    reason: str | None


class ModelCard(WireReply):
    """The one model the gateway serves."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "grove"


class ModelList(WireReply):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthStatus(WireReply):
    """``GET /health``."""

    status: Literal["ok"] = "ok"
    model: str


# -- builders (pure) -------------------------------------------------------------------------


def attempt_status(state: AttemptState) -> AttemptStatus:
    """The status answer for a folded attempt (which must have been opened)."""
    opened = state.opened
    if opened is None:  # the gateway answers 404 before asking for a status
        raise AttemptError(state.capture_key, "an attempt that was never opened has no status")
    calls = []
    for call in state.calls.values():
        committed, failure = call.committed, call.failure
        calls.append(
            AttemptCall(
                call_id=call.call_id,
                status=CallStatus(call.status).value,
                decision=call.intended.decision,
                parent_call_id=call.parent_call_id,
                root_reason=call.intended.root_reason,
                prompt_tokens=call.intended.prompt_tokens,
                response_id=None if committed is None else committed.response_id,
                finish_reason=None if committed is None else committed.finish_reason,
                generated_tokens=None if committed is None else committed.generated_len,
                failure_reason=None if failure is None else failure.reason,
                late=call.late,
                source_capture_key=call.intended.source_capture_key,
            )
        )
    selection = state.selection
    return AttemptStatus(
        capture_key=state.capture_key,
        rollout_id=opened.rollout_id,
        prompt_group=opened.prompt_group,
        rollout_index=opened.rollout_index,
        policy_version=opened.policy_version,
        forest_mode=opened.forest_mode,
        selection_policy=opened.selection_policy,
        calls=calls,
        pending=list(state.pending_call_ids),
        closed=state.admissions_closed,
        settled=state.settled is not None,
        timed_out=state.settled is not None and state.settled.timed_out,
        selection=None
        if selection is None
        else AttemptSelection(
            policy=selection.policy,
            call_ids=list(selection.call_ids),
            terminal_response_id=selection.terminal_response_id,
            reward=selection.reward,
        ),
        fork_from=None
        if opened.fork_from is None
        else AttemptFork(
            source_capture_key=opened.fork_from.source_capture_key,
            source_call_id=opened.fork_from.source_call_id,
            source_cum_len=opened.fork_from.source_cum_len,
        ),
    )
