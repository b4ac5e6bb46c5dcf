"""The event catalog: one frozen pydantic model per event type, with a stable type name and version.

Producers: the capture lifecycle (``attempt.*``, ``call.*``), the harness adapter
(``rollout.selected``) and the projector (``rollout.finalized``, ``batch.published``). Consumers:
projections, replay, training. A payload is stored as JSON exactly as ``model_dump(mode="json")``
returns it; reading an older ``schema_version`` goes through the upcasters (``upcasting.py``), it is
never rewritten in place.
``docs/events.md`` describes every field.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grove.ledger.admission import AdmissionItem, CallStatus, CandidateCall, prefix_digests
from grove.ledger.bounds import Code, Count, Name, Seed, Size
from grove.ledger.errors import InvalidEventPayload, UnknownEventType

__all__ = [
    "CATALOG",
    "MAX_ENVIRONMENT_REASON_CHARS",
    "AdmissionsClosed",
    "AttemptCleaned",
    "AttemptOpened",
    "AttemptSettled",
    "BatchPublished",
    "CallCommitted",
    "CallFailed",
    "CallIntended",
    "Event",
    "ForkSource",
    "LedgerPosition",
    "ReplaySummary",
    "RolloutFinalized",
    "RolloutSelected",
    "SourceCall",
    "event_class",
    "validate_payload",
]

Digest = str  # lowercase hex sha256
MAX_ENVIRONMENT_REASON_CHARS = 500
"""The longest reason a harness may give for an environment mask (``rollout.selected``)."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Event(_Record):
    """Base of every event payload; subclasses set ``type`` and ``schema_version``."""

    type: ClassVar[str]
    schema_version: ClassVar[int] = 1


CATALOG: dict[str, type[Event]] = {}


def _register(cls: type[Event]) -> type[Event]:
    if cls.type in CATALOG:
        raise RuntimeError(f"event type {cls.type!r} registered twice")
    CATALOG[cls.type] = cls
    return cls


def event_class(event_type: str) -> type[Event]:
    """The model for ``event_type``; raises UnknownEventType outside the catalog."""
    try:
        return CATALOG[event_type]
    except KeyError:
        raise UnknownEventType(event_type, list(CATALOG)) from None


def validate_payload(event_type: str, payload: Any) -> Event:
    """Validate a current-version payload into its model, with a ledger error on failure."""
    cls = event_class(event_type)
    try:
        return cls.model_validate(payload)
    except ValidationError as exc:
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or '<payload>'}: {err['msg']}"
            for err in exc.errors()
        )
        raise InvalidEventPayload(event_type, cls.schema_version, detail) from None


class ReplaySummary(_Record):
    """What admission needs to match a later request against this call, without the messages.

    Producer: ``grove.capture.render.replay_summary`` (a request, for ``call.intended``) and
    :meth:`extended` (the request plus the call's normalized output, for ``call.committed``);
    consumer: the admission index (:meth:`candidate`). Both digests are prefix chains
    (``ledger/admission.py``) over ``item_count`` items.
    """

    normalization_version: int = Field(ge=1)
    item_count: int = Field(ge=0, description="items chained: the request (plus output on commit)")
    source_digest: Digest
    canonical_source_digest: Digest = Field(
        description="the same chain with null and empty assistant tool content identified"
    )
    render_options_digest: Digest

    def extended(self, items: Sequence[AdmissionItem]) -> ReplaySummary:
        """This summary with ``items`` chained on (one hash per item, whatever came before)."""
        chained = list(prefix_digests(items, self.source_digest, self.canonical_source_digest))
        strict, canonical = (
            chained[-1] if chained else (self.source_digest, self.canonical_source_digest)
        )
        return self.model_copy(
            update={
                "item_count": self.item_count + len(items),
                "source_digest": strict,
                "canonical_source_digest": canonical,
            }
        )

    def candidate(
        self, call_id: str, status: CallStatus, response_ids: frozenset[str] = frozenset()
    ) -> CandidateCall:
        """The admission index entry of the call this summary describes."""
        return CandidateCall(
            call_id=call_id,
            status=status,
            source_digest=self.source_digest,
            canonical_source_digest=self.canonical_source_digest,
            render_options_digest=self.render_options_digest,
            response_ids=response_ids,
        )


class LedgerPosition(_Record):
    """A gap-free reader's mark: the last (transaction id, position) consumed.

    On SQLite ``transaction_id`` is None and position order is commit order.
    """

    transaction_id: int | None = None
    position: int = Field(ge=0)


class SourceCall(_Record):
    """One committed call of a fork's source chain, with what a reader needs to rebuild and
    verify its tokens without reading its attempt (its blob and recorded chain digest) and to
    match its answer in the fork's returned history (its response id and output fingerprint)."""

    capture_key: Name
    call_id: Name
    blob_key: str = Field(max_length=512)
    blob_sha256: Digest
    blob_bytes: Size
    chain_digest: Digest
    finish_reason: str = Field(max_length=32)
    response_id: Name
    output_fingerprint: Digest


class ForkSource(_Record):
    """The committed call a fork continues: ``source_call_id`` of attempt ``source_capture_key``
    (another attempt), with the chain digest and length its commit recorded, so the fork's first
    continuation is checked against the exact chain it was opened from (``docs/fork.md``).

    Producer: ``CaptureService.open_attempt`` (``attempt.opened.fork_from``); consumers: the
    capture views (the source call as a parent candidate), the ledger's intent check, and the
    projector (the source chain as context of the fork's rows).
    """

    source_capture_key: Name
    source_call_id: Name
    source_chain_digest: Digest
    source_cum_len: Count = Field(description="tokens of the source call's whole chain")
    source_replay_summary: ReplaySummary = Field(
        description="the source call's commit's replay summary: what admission matches"
    )
    chain: tuple[SourceCall, ...] = Field(
        min_length=1,
        description="the source call's chain, root first, ending with the source call; it "
        "crosses into the source's own source when the source is a fork",
    )

    def candidate(self) -> CandidateCall:
        """The source call as a parent candidate of the fork's calls (the capture views and
        replay index it before the fork's own calls)."""
        return self.source_replay_summary.candidate(
            self.source_call_id, CallStatus.COMMITTED, frozenset({self.chain[-1].response_id})
        )


@_register
class AttemptOpened(Event):
    """An attempt (one execution of a harness for one logical rollout) starts.

    Version 2 added ``forest_mode`` and ``selection_policy``; version-1 payloads are upcast
    (``upcasting.py``) to the behaviour they were written under: no forest, returned history.
    ``attempt_token_digest`` is the digest of the attempt's secret (``capture/capabilities.py``),
    never the secret; None: the attempt was opened before attempts had one, and no HTTP request
    can drive it (``docs/security.md``).
    """

    type: ClassVar[str] = "attempt.opened"
    schema_version: ClassVar[int] = 2
    capture_key: Name
    rollout_id: Name
    prompt_group: Name
    rollout_index: Count
    policy_version: Count
    model_fingerprint: str
    template_fingerprint: str
    forest_mode: bool = True
    selection_policy: Name = "returned_history"
    seed: Seed | None = Field(
        default=None, description="seeds the attempt's calls that send none (None: derived)"
    )
    attempt_token_digest: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",  # pydantic: Rust regex, where $ is the end of text
        description="sha256 of the attempt's secret, bound to its capture key (None: it has none)",
    )
    fork_from: ForkSource | None = Field(
        default=None, description="the committed call of another attempt it forks (None: none)"
    )


@_register
class CallIntended(Event):
    """A call was admitted before inference; its id is unique within the attempt.

    ``policy_version`` is the version the engine served at admission (None: the engine does not
    say, or the event predates the field); the commit records the one that actually sampled.
    ``constraint`` is ``grove.capture.engine.OutputConstraint.record()`` of a call decoded under a
    grammar (structured output, a forced tool call; ``docs/gateway.md``), None for free sampling
    or an event that predates the field.
    """

    type: ClassVar[str] = "call.intended"
    call_id: Name
    decision: Literal["root", "continuation"]
    parent_call_id: Name | None = None
    source_capture_key: Name | None = Field(
        default=None,
        description="the attempt that owns parent_call_id when it is not this one: the source "
        "of a fork (None: the parent is this attempt's own call, or there is none)",
    )
    root_reason: Code | None = Field(
        default=None, description="why the call is a root (initial request, rewrite, failed check)"
    )
    replay_summary: ReplaySummary
    equivalences: tuple[str, ...] = ()
    prompt_tokens: Count
    admission: dict[str, Any] = Field(
        default_factory=dict,
        description="the full admission decision record, so replay can re-run the decision",
    )
    policy_version: Count | None = Field(
        default=None, description="optimizer steps in the weights served at admission"
    )
    constraint: dict[str, Any] | None = Field(
        default=None,
        description="the output constraint the call is decoded under (None: sampled freely)",
    )


@_register
class CallCommitted(Event):
    """The call's delta blob is stored and acknowledged; the blob is written before this event.

    ``policy_version`` is the generation's: the optimizer steps in the weights that sampled it
    (None: the engine does not know, or the event predates the field).
    """

    type: ClassVar[str] = "call.committed"
    call_id: Name
    parent_call_id: Name | None = None
    source_capture_key: Name | None = Field(
        default=None, description="the attempt that owns parent_call_id (None: this one)"
    )
    prev_len: Count = Field(description="tokens inherited from the parent chain")
    delta_len: Count = Field(description="new tokens: prompt delta plus generated")
    cum_len: Count
    prompt_delta_len: Count
    generated_len: Count
    blob_key: str = Field(max_length=512)
    blob_sha256: Digest
    blob_bytes: Size
    chain_digest: Digest = Field(
        description="storage.chain_digest over the parent's chain digest and this delta's tokens"
    )
    finish_reason: str = Field(max_length=32)
    response_id: Name
    output_fingerprint: Digest
    replay_summary: ReplaySummary
    policy_version: Count | None = Field(
        default=None, description="optimizer steps in the weights that sampled the call"
    )


@_register
class CallFailed(Event):
    """The call ended without a usable capture."""

    type: ClassVar[str] = "call.failed"
    call_id: Name
    reason: Code = Field(description="a reason code, e.g. engine_error, storage_error")
    detail: str = ""


@_register
class AdmissionsClosed(Event):
    """The harness returned; later intents are refused."""

    type: ClassVar[str] = "attempt.admissions_closed"


@_register
class AttemptSettled(Event):
    """Pending calls resolved, or the wait for them ran out."""

    type: ClassVar[str] = "attempt.settled"
    pending_call_ids: tuple[str, ...] = ()
    timed_out: bool = False


@_register
class RolloutSelected(Event):
    """The selection policy's result for the attempt: the ordered calls that count for training."""

    type: ClassVar[str] = "rollout.selected"
    policy: Name
    call_ids: tuple[str, ...]
    terminal_response_id: Name | None = None
    reward: float = Field(allow_inf_nan=False)
    result: dict[str, Any] | None = Field(
        default=None,
        description="the harness's result as the policy read it, so replay can re-run the policy",
    )
    environment_masked: bool = Field(
        default=False,
        description="the harness's environment could not score the rollout (a sandbox crash): "
        'its group trains, it does not (docs/forest.md, "Environment masks")',
    )
    environment_mask_reason: str | None = Field(
        default=None,
        max_length=MAX_ENVIRONMENT_REASON_CHARS,
        description="why the environment masked it, as the harness said (None: no reason given)",
    )


@_register
class RolloutFinalized(Event):
    """The projector's decision for the attempt's logical rollout, with the settings it was made
    under (``forest_training``, ``max_row_tokens``, and the media rules its images were held to:
    ``media_image_token_id`` and ``media_merge_size``, both or neither) so that replay re-runs it
    alike."""

    type: ClassVar[str] = "rollout.finalized"
    rollout_id: Name
    trainable: bool
    masked_reason: Code | None = None
    paths: tuple[tuple[str, ...], ...] = ()
    owned: tuple[tuple[str, ...], ...] = Field(
        default=(), description="per path, the call ids whose generated span it owns"
    )
    forest_training: bool = Field(
        default=True, description="whether a rollout could train as more than one row"
    )
    max_row_tokens: int | None = Field(
        default=None, ge=1, description="the longest row the decision allowed (None: no limit)"
    )
    media_image_token_id: int | None = Field(
        default=None,
        ge=0,
        description="the image token every placeholder had to be (None: images were not checked)",
    )
    media_merge_size: int | None = Field(
        default=None,
        ge=1,
        description="the patch square one placeholder covers (None: images were not checked)",
    )

    @model_validator(mode="after")
    def _media_rules_together(self) -> RolloutFinalized:
        if (self.media_image_token_id is None) != (self.media_merge_size is None):
            raise ValueError(
                "media_image_token_id and media_merge_size are the media rules together: give "
                f"both or neither, got {self.media_image_token_id} and {self.media_merge_size}"
            )
        return self


@_register
class BatchPublished(Event):
    """Rows handed to training for one optimizer step."""

    type: ClassVar[str] = "batch.published"
    step: Count
    rollout_ids: tuple[str, ...]
    row_ids: tuple[str, ...]
    padding_row_ids: tuple[str, ...] = ()
    ledger_position: LedgerPosition
    dropped_rollout_ids: tuple[str, ...] = ()
    """The rollouts of the complete prompt groups dropped at this step: final, never trained
    (their staging blobs may go; ``training/cleanup.py``). Older events read as none."""


@_register
class AttemptCleaned(Event):
    """Staging blobs removed for the attempt: exactly these keys."""

    type: ClassVar[str] = "attempt.cleaned"
    keys: tuple[str, ...]
