"""The gateway's wire records: OpenAI-compatible requests and responses, and the attempt API.

Producer of the request models: a harness (any OpenAI-compatible client, e.g. the official
``openai`` package); consumer: ``capture/gateway.py``, which turns them into a
``capture.lifecycle.ModelCall`` and answers with the response models built here from the
``CallOutcome``. Every model is explicit (unknown request fields are refused, not ignored) so the
served OpenAPI schema says exactly what Grove accepts.

Errors are answered on the wire as OpenAI does, ``{"error": {"message", "type", "code"}}``;
:data:`ERROR_STATUS` is the one table that gives every Grove error class its HTTP status and
Grove's stable code.

Where Grove departs from OpenAI: ``ChatCompletion.id``, ``ResponseObject.id`` and the id of the
Responses output message are all the call's response id, so a client that echoes an output item
back names the call it came from (admission breaks ties with it, ``docs/normalization.md``);
logprobs are those of the content tokens as sampled (never top alternatives); streaming is
buffered (``response_events``: the whole text arrives in one delta).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from capture import errors as capture_errors
from capture.lifecycle import CallOutcome
from ledger import admission
from ledger import errors as ledger_errors
from ledger.attempt import AttemptError, AttemptState, CallStatus
from storage import errors as storage_errors

__all__ = [
    "ERROR_STATUS",
    "ERROR_TYPES",
    "AttemptCall",
    "AttemptSelection",
    "AttemptStatus",
    "ChatCompletion",
    "ChatCompletionRequest",
    "ChatMessage",
    "ChoiceLogprobs",
    "CompletionChoice",
    "CompletionMessage",
    "CompletionUsage",
    "ErrorBody",
    "ErrorDetail",
    "ErrorStatus",
    "HarnessResult",
    "HealthStatus",
    "Measurement",
    "ModelCard",
    "ModelList",
    "OpenAttemptRequest",
    "OutputMessage",
    "OutputText",
    "RejectRequest",
    "ResponseObject",
    "ResponseUsage",
    "ResponsesRequest",
    "TokenLogprob",
    "attempt_status",
    "chat_completion",
    "error_body",
    "error_status",
    "response_events",
    "response_object",
]

JSONObject = dict[str, Any]


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")


class _Reply(BaseModel):
    model_config = ConfigDict(frozen=True)


# -- errors ----------------------------------------------------------------------------------


class ErrorDetail(_Reply):
    """Why a request was refused: a message that says what to do, OpenAI's ``type``, Grove's
    stable ``code`` (``docs/gateway.md`` lists them) and the offending request field if any."""

    message: str
    type: str
    code: str
    param: str | None = None


class ErrorBody(_Reply):
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
    capture_errors.EngineError: ErrorStatus(502, "engine_failed"),
    capture_errors.InvalidSamplingError: ErrorStatus(400, "invalid_sampling"),
    capture_errors.UnsupportedSamplingError: ErrorStatus(400, "unsupported_sampling"),
    capture_errors.InvalidPromptError: ErrorStatus(400, "invalid_prompt"),
    capture_errors.PromptTooLongError: ErrorStatus(400, "prompt_too_long"),
    capture_errors.InvalidGenerationError: ErrorStatus(502, "invalid_generation"),
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
    ledger_errors.DatabaseUnavailable: ErrorStatus(503, "ledger_unavailable"),
    AttemptError: ErrorStatus(409, "attempt_rule"),
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
    404: "not_found_error",
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


# -- chat completions ------------------------------------------------------------------------


class ChatMessage(BaseModel):
    """One Chat Completions message; fields beyond these pass through to normalization."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[JSONObject] | None = None


class ChatCompletionRequest(_Request):
    """``POST /v1/chat/completions``. ``max_tokens`` and ``max_completion_tokens`` are synonyms.

    Sampling bounds are checked by ``capture.engine.SamplingParams`` (one place); ``stop``
    strings must each be one token of the model's vocabulary; ``n`` must be 1, ``stream`` false
    and ``top_logprobs`` 0 or absent (the engine reports the sampled token's logprob only).
    ``user`` is accepted and ignored.
    """

    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: JSONObject | None = None
    tools: list[JSONObject] | None = None
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    reasoning_effort: str | None = None
    user: str | None = None


class CompletionMessage(_Reply):
    """The assistant message of a completion: the generated text, stop token excluded."""

    role: Literal["assistant"] = "assistant"
    content: str


class TokenLogprob(_Reply):
    """One content token as sampled: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[JSONObject] = Field(default_factory=list)


class ChoiceLogprobs(_Reply):
    """Logprobs of the content tokens, in order (the stop token is not content)."""

    content: list[TokenLogprob]


class CompletionChoice(_Reply):
    """The one choice of a completion (``n`` is always 1)."""

    index: int = 0
    message: CompletionMessage
    finish_reason: Literal["stop", "length"]
    logprobs: ChoiceLogprobs | None = None


class CompletionUsage(_Reply):
    """Token counts: the planned prompt (spliced or rendered) and the generated tokens."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatCompletion(_Reply):
    """``POST /v1/chat/completions`` answer; ``id`` is the call's response id."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: CompletionUsage


# -- responses -------------------------------------------------------------------------------


class ResponsesRequest(_Request):
    """``POST /v1/responses``, the subset Grove serves.

    ``input`` is a string (one user message) or a list of Responses input items or chat
    messages; ``instructions`` becomes a leading system message. ``stream`` true answers with
    buffered server-sent events. Refused: ``previous_response_id`` and ``conversation``
    (provider-managed state: send the whole input), ``background``, and ``truncation="auto"``
    (prompts are never truncated).
    """

    model: str
    input: str | list[JSONObject]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool | None = None
    previous_response_id: str | None = None
    conversation: str | JSONObject | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    tools: list[JSONObject] | None = None
    tool_choice: str | JSONObject | None = None
    parallel_tool_calls: bool | None = None
    reasoning: JSONObject | None = None
    store: bool | None = None


class OutputText(_Reply):
    """The text part of the output message."""

    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[JSONObject] = Field(default_factory=list)


class OutputMessage(_Reply):
    """The one output item: the assistant message, whose ``id`` is the call's response id."""

    type: Literal["message"] = "message"
    id: str
    status: Literal["in_progress", "completed", "incomplete"]
    role: Literal["assistant"] = "assistant"
    content: list[OutputText]


class ResponseUsage(_Reply):
    """Token counts in the Responses API's names."""

    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int] = Field(default_factory=lambda: {"cached_tokens": 0})
    output_tokens_details: dict[str, int] = Field(default_factory=lambda: {"reasoning_tokens": 0})


class ResponseObject(_Reply):
    """``POST /v1/responses`` answer; ``id`` is the call's response id. ``status`` is
    ``incomplete`` (reason ``max_output_tokens``) when the generation hit its token limit."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: Literal["in_progress", "completed", "incomplete"]
    model: str
    output: list[OutputMessage]
    usage: ResponseUsage | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[JSONObject] = Field(default_factory=list)
    tool_choice: str | JSONObject = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: None = None
    error: None = None
    incomplete_details: dict[str, str] | None = None
    metadata: dict[str, str] = Field(default_factory=dict)


# -- attempts --------------------------------------------------------------------------------


class OpenAttemptRequest(_Request):
    """``POST /v1/attempts``: start one execution of the harness for one logical rollout."""

    capture_key: str = Field(description="names the attempt's event stream and blob partition")
    rollout_id: str
    prompt_group: str
    rollout_index: int = Field(ge=0)
    policy_version: int = Field(default=0, ge=0)
    forest_mode: bool = True
    selection_policy: str = Field(
        default="returned_history",
        description="returned_history, all_captured or module:function (training.selection)",
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
    terminal_response_id: str | None = None


class RejectRequest(_Request):
    """``POST /v1/attempts/{capture_key}/calls/{call_id}/reject``: why the harness rejected it."""

    detail: str = ""


class AttemptCall(_Reply):
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


class AttemptSelection(_Reply):
    """The recorded ``rollout.selected``: policy, ordered call ids, scored response, reward."""

    policy: str
    call_ids: list[str]
    terminal_response_id: str | None
    reward: float


class AttemptStatus(_Reply):
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


class Measurement(_Reply):
    """``POST /v1/attempts/{capture_key}/measure``: what the call would get; nothing written.

    ``reason`` is the root reason (None for a continuation), ``parent_call_id`` the parent of a
    continuation (None for a root).
    """

    prompt_tokens: int
    decision: Literal["root", "continuation"]
    parent_call_id: str | None
    reason: str | None


class ModelCard(_Reply):
    """The one model the gateway serves."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "grove"


class ModelList(_Reply):
    """``GET /v1/models``."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


class HealthStatus(_Reply):
    """``GET /health``."""

    status: Literal["ok"] = "ok"
    model: str


# -- builders (pure) -------------------------------------------------------------------------


def chat_completion(
    outcome: CallOutcome, model: str, logprobs: Sequence[TokenLogprob] | None
) -> ChatCompletion:
    """The ChatCompletion answering ``outcome``; ``logprobs`` when the client asked for them."""
    generation = outcome.generation
    completion = len(generation.token_ids)
    return ChatCompletion(
        id=outcome.response_id,
        created=int(time.time()),
        model=model,
        choices=[
            CompletionChoice(
                message=CompletionMessage(content=outcome.message["content"]),
                finish_reason=generation.finish_reason,
                logprobs=None if logprobs is None else ChoiceLogprobs(content=list(logprobs)),
            )
        ],
        usage=CompletionUsage(
            prompt_tokens=outcome.prompt_tokens,
            completion_tokens=completion,
            total_tokens=outcome.prompt_tokens + completion,
        ),
    )


def response_object(outcome: CallOutcome, model: str, request: ResponsesRequest) -> ResponseObject:
    """The Response answering ``outcome``: one output message whose id is the response id."""
    generation = outcome.generation
    complete = generation.finish_reason == "stop"
    status: Literal["completed", "incomplete"] = "completed" if complete else "incomplete"
    completion = len(generation.token_ids)
    return ResponseObject(
        id=outcome.response_id,
        created_at=time.time(),
        status=status,
        model=model,
        output=[
            OutputMessage(
                id=outcome.response_id,
                status=status,
                content=[OutputText(text=outcome.message["content"])],
            )
        ],
        usage=ResponseUsage(
            input_tokens=outcome.prompt_tokens,
            output_tokens=completion,
            total_tokens=outcome.prompt_tokens + completion,
        ),
        instructions=request.instructions,
        max_output_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        tools=request.tools or [],
        tool_choice=request.tool_choice or "auto",
        parallel_tool_calls=request.parallel_tool_calls is not False,
        incomplete_details=None if complete else {"reason": "max_output_tokens"},
    )


def response_events(response: ResponseObject) -> list[JSONObject]:
    """The standard Responses stream events for a finished response, in order, numbered.

    Buffered: generation is over before the first event, so the text arrives as one delta.
    The sequence is what the ``openai`` client's stream iteration and its accumulating
    ``responses.stream`` helper expect: created, in_progress, output_item.added,
    content_part.added, output_text.delta, output_text.done, content_part.done,
    output_item.done, completed. The last event is ``response.completed`` even when the
    response's status is ``incomplete`` (OpenAI sends ``response.incomplete`` there, which the
    client's ``responses.stream`` helper does not accept as an end).
    """
    item = response.output[0]
    part = item.content[0]
    started = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    opened = item.model_copy(update={"status": "in_progress", "content": []})
    empty = part.model_copy(update={"text": ""})
    where = {"item_id": item.id, "output_index": 0}
    at = {**where, "content_index": 0}
    events: list[JSONObject] = [
        {"type": "response.created", "response": started.model_dump()},
        {"type": "response.in_progress", "response": started.model_dump()},
        {"type": "response.output_item.added", "output_index": 0, "item": opened.model_dump()},
        {"type": "response.content_part.added", **at, "part": empty.model_dump()},
        {"type": "response.output_text.delta", **at, "delta": part.text, "logprobs": []},
        {"type": "response.output_text.done", **at, "text": part.text, "logprobs": []},
        {"type": "response.content_part.done", **at, "part": part.model_dump()},
        {"type": "response.output_item.done", "output_index": 0, "item": item.model_dump()},
        {"type": "response.completed", "response": response.model_dump()},
    ]
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def attempt_status(state: AttemptState) -> AttemptStatus:
    """The status answer for a folded attempt (which must have been opened)."""
    opened = state.opened
    assert opened is not None  # the gateway answers 404 for attempts never opened
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
    )
