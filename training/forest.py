"""Forest reconstruction: selected calls become root-to-endpoint rows with once-only loss ownership.

The pure forest API is a stable contract (``docs/forest.md``); it takes plain records and returns
plain data, with no database, blob store or model. How the data is held lives beside it: a row
builds its token lists on first read (``training/forest_rows.py``), and a record over a decoded
blob's tensors turns them into lists only when read (``training/array_values.py``).

The algorithm:

1. Check the selection. Every selected call must be captured and committed, and every selected
   continuation's parent must be selected too; otherwise the whole logical rollout is masked
   (``Forest.masked_reason``), or, with ``strict=True``, ``ForestError`` names the call and rule.
   Omitted calls are never added back.
2. Endpoints are the selected calls with no selected child, in selection order (a selected call
   whose children were all left out is an endpoint). One row (path) per endpoint, from its root.
3. A root contributes its full prompt, a continuation its new observation tokens; then each call
   its generated tokens. A call's generated span is owned — loss 1 and its generation logprobs —
   by the first row that contains it; every later row carries it as context (loss 0). Prompts,
   observations and rewritten inputs always have loss 0, and unselected calls never appear.

How it departs from the textbook "one row per trajectory": a rollout may have several rows, but
it still has one reward and one advantage, and every selected generated token is trained exactly
once, whatever the number of rows.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from grove.training.array_values import Array1D, ArrayValues, values_total
from grove.training.errors import ForestError
from grove.training.forest_rows import ForestRow, RowSegment, row_of_path

__all__ = [
    "CALL_STATUSES",
    "LENGTH_FINISH_REASONS",
    "MASK_REASONS",
    "CallRecord",
    "Forest",
    "ForestRow",
    "MaskReason",
    "RecordRule",
    "RowSegment",
    "build_forest",
]

CALL_STATUSES: Final = ("committed", "failed", "pending")
"""A call is committed (tensors stored and acknowledged), failed, or pending (neither, yet)."""

LENGTH_FINISH_REASONS: Final = frozenset({"length"})
"""Finish reasons that mean a generation hit a length limit; one marks the rollout truncated."""


class MaskReason(StrEnum):
    """Why a logical rollout is masked (never trains): the closed set, in checking priority.

    ``build_forest`` decides the first six; ``grove.training.selection.completion_mask_reason`` the
    capture-completion ones (``selected_call_incomplete``, ``capture_pending``,
    ``capture_failed``, and the selected-call ones too); the projector ``blob_invalid``,
    ``route_missing``, ``ledger_contradiction`` and ``no_trainable_tokens``, with the model's
    media rules ``media_invalid`` (``grove.training.media_checks``), and, from its settings,
    ``forest_training_disabled`` and ``row_too_long`` (checked last, on a forest that is otherwise
    trainable). Each value is a plain string (``docs/forest.md``, "Failures and drops").
    """

    EMPTY_SELECTION = "empty_selection"
    """The selection names no call."""
    SELECTED_CALL_MISSING = "selected_call_missing"
    """A selected call has no captured record (lost capture evidence)."""
    SELECTED_CALL_PENDING = "selected_call_pending"
    """A selected call never committed nor failed."""
    SELECTED_CALL_FAILED = "selected_call_failed"
    """A selected call failed, or carries a recorded capture failure."""
    SELECTION_NOT_CLOSED = "selection_not_closed"
    """A selected continuation's parent is not selected; counted as
    ``finalize/selection_not_closed_rollouts``."""
    TERMINAL_NOT_SELECTED = "terminal_not_selected"
    """The scored terminal call is not among the selected calls."""
    SELECTED_CALL_INCOMPLETE = "selected_call_incomplete"
    """A selected call stopped for a finish reason other than ``stop``, ``length`` or
    ``tool_calls`` (e.g. ``content_filter``): its generation is incomplete. ``all_captured``
    keeps such a call selected only when it has children or is the scored one."""
    CAPTURE_PENDING = "capture_pending"
    """A call of the attempt is still pending after the attempt settled (a commit recorded after
    settling counts as pending)."""
    CAPTURE_FAILED = "capture_failed"
    """A call outside the selection failed or recorded a failure: a partial history never
    trains. Exempt: ``request_finished_without_staged_coordinates`` on a call that committed, and
    a rejected response (``rejected_by_harness``), which is not a failure."""
    BLOB_INVALID = "blob_invalid"
    """A selected call's blob is missing or corrupt, or its routes or media do not fit its row
    (``grove.training.errors.RowError``)."""
    ROUTE_MISSING = "route_missing"
    """A row of an MoE rollout lacks a captured route before its final token (the engine did not
    observe one inside a segment): the learner could not replay the engine's routing there
    (``grove.training.rows``, ``docs/moe.md``)."""
    MEDIA_INVALID = "media_invalid"
    """An image breaks the trained model's media rules: a token other than its image token at its
    span, or a span its patch grid does not take (``grove.training.media_checks``)."""
    LEDGER_CONTRADICTION = "ledger_contradiction"
    """The attempt's events break the lifecycle rules (``AttemptState.contradictions``: written
    around ``AttemptLog``, e.g. a call committed twice or never intended)."""
    NO_TRAINABLE_TOKENS = "no_trainable_tokens"
    """The forest's rows own no generated token (every selected generation is empty): nothing
    would train, and an empty rollout never takes part as if it had."""
    FOREST_TRAINING_DISABLED = "forest_training_disabled"
    """The selected forest has more than one path (its context was rewritten, or it branched)
    and forest training is off: enable ``token_capture.forest_training`` to train rewritten
    histories."""
    ROW_TOO_LONG = "row_too_long"
    """A row (path) has more tokens than the trainer accepts (``policy.max_total_sequence_length``);
    the whole rollout is masked, never a partial history."""


MASK_REASONS: Final[frozenset[str]] = frozenset(MaskReason)


class RecordRule(StrEnum):
    """Malformed input: raised as ``ForestError`` in every mode, since no rollout rule applies."""

    INVALID_INPUT = "invalid_input"
    INVALID_CALL_ID = "invalid_call_id"
    UNKNOWN_STATUS = "unknown_status"
    LOGPROBS_LENGTH = "logprobs_length"
    NAN_LOGPROB = "nan_logprob"
    DUPLICATE_CALL_ID = "duplicate_call_id"
    DUPLICATE_SELECTION = "duplicate_selection"
    PARENT_CYCLE = "parent_cycle"
    EMPTY_ROOT_PROMPT = "empty_root_prompt"


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One captured model call, as the forest sees it (producer: the projector, from the ledger's
    call events and the call's delta blob; consumer: ``build_forest``).

    For a root (``parent_id is None``) ``prompt_tokens`` is the full prompt; for a continuation,
    only the new observation tokens after its parent's prompt and generation. ``logprobs`` has one
    generation logprob per generated token (``-inf`` allowed, NaN and ``+inf`` not). ``status``
    is one of ``CALL_STATUSES``; a pending or failed call may have no tokens. Lists are read,
    never mutated; ``from_arrays`` builds a record over a decoded blob's tensors instead.
    """

    call_id: str
    parent_id: str | None
    prompt_tokens: Sequence[int]
    generated_tokens: Sequence[int]
    logprobs: Sequence[float]
    status: str = "committed"
    finish_reason: str = "stop"

    def __post_init__(self) -> None:
        if not isinstance(self.call_id, str) or not self.call_id:
            raise ForestError(
                RecordRule.INVALID_CALL_ID,
                None,
                f"call_id must be a non-empty string, got {self.call_id!r}",
            )
        if self.parent_id is not None and (
            not isinstance(self.parent_id, str) or not self.parent_id
        ):
            raise ForestError(
                RecordRule.INVALID_CALL_ID,
                self.call_id,
                f"parent_id must be None or a non-empty string, got {self.parent_id!r}",
            )
        if self.status not in CALL_STATUSES:
            raise ForestError(
                RecordRule.UNKNOWN_STATUS,
                self.call_id,
                f"status must be one of {', '.join(CALL_STATUSES)}, got {self.status!r}",
            )
        if len(self.logprobs) != len(self.generated_tokens):
            raise ForestError(
                RecordRule.LOGPROBS_LENGTH,
                self.call_id,
                f"one logprob per generated token: got {len(self.logprobs)} logprobs for "
                f"{len(self.generated_tokens)} generated tokens",
            )
        total = values_total(self.logprobs)  # NaN or +inf if any logprob is
        if math.isnan(total) or total == math.inf:
            bad = [value for value in self.logprobs if math.isnan(value) or value == math.inf]
            raise ForestError(
                RecordRule.NAN_LOGPROB,
                self.call_id,
                f"generation logprobs must not be NaN or +inf, got {bad[:3]}",
            )

    @classmethod
    def from_arrays(
        cls,
        call_id: str,
        parent_id: str | None,
        prompt_tokens: Array1D,
        generated_tokens: Array1D,
        logprobs: Array1D,
        status: str = "committed",
        finish_reason: str = "stop",
    ) -> CallRecord:
        """A record over 1-D tensors (or numpy arrays), e.g. a decoded blob's: the fields are
        read-only sequences that become Python lists only when their values are read (a forest
        row's ``token_ids``, say; ``training/array_values.py``); ``build_forest`` reads only
        their lengths and sums."""
        try:
            prompt, generated, values = (
                ArrayValues(array) for array in (prompt_tokens, generated_tokens, logprobs)
            )
        except ValueError as error:
            raise ForestError(RecordRule.INVALID_INPUT, call_id, str(error)) from None
        return cls(call_id, parent_id, prompt, generated, values, status, finish_reason)


@dataclass(frozen=True, slots=True)
class Forest:
    """The reconstructed rows of one logical rollout (producer: ``build_forest``).

    ``masked_reason`` is None when the rollout is trainable; when it is set, ``rows`` and
    ``endpoints`` are empty and nothing trains. ``endpoints[i]`` is the last call of ``rows[i]``.
    ``selected`` is the selection as given; ``terminal`` the scored call id or None;
    ``truncated`` is True when any selected generation stopped for a length limit.
    """

    rows: list[ForestRow]
    endpoints: list[str]
    masked_reason: MaskReason | None
    selected: list[str]
    terminal: str | None
    truncated: bool

    @property
    def trainable(self) -> bool:
        """Whether the rollout trains (no mask reason)."""
        return self.masked_reason is None


def build_forest(
    calls: Iterable[CallRecord],
    selected: Sequence[str],
    terminal: str | None = None,
    strict: bool = False,
    context: Collection[str] = (),
) -> Forest:
    """Rows of the selected calls: one per endpoint, each generated span owned by its first row.

    ``calls`` are every captured record of the attempt (in any order; unselected ones are only
    consulted, never trained). ``selected`` is the ordered selection; its order sets the order of
    endpoints, hence rows and ownership. ``terminal`` is the scored call's id, which must be
    selected. A broken rollout rule masks the rollout (``Forest.masked_reason``), or raises
    ``ForestError`` when ``strict``; malformed records (``RecordRule``) raise in every mode.
    ``context`` names selected calls that rows carry as context only, never owned: a fork's
    source chain, whose generated tokens belong to the source attempt (``docs/fork.md``).
    """
    if isinstance(selected, str):
        raise ForestError(
            RecordRule.INVALID_INPUT, None, f"selected is a sequence of call ids, got {selected!r}"
        )
    by_id: dict[str, CallRecord] = {}
    for call in calls:
        if not isinstance(call, CallRecord):
            raise ForestError(
                RecordRule.INVALID_INPUT,
                None,
                f"calls must be CallRecords, got {type(call).__name__}",
            )
        if call.call_id in by_id:
            raise ForestError(
                RecordRule.DUPLICATE_CALL_ID, call.call_id, "two call records share this call_id"
            )
        by_id[call.call_id] = call
    order = list(selected)
    position: dict[str, int] = {}
    for index, call_id in enumerate(order):
        if call_id in position:
            raise ForestError(
                RecordRule.DUPLICATE_SELECTION,
                call_id,
                f"selected twice, at positions {position[call_id]} and {index}",
            )
        position[call_id] = index
    truncated = any(
        by_id[call_id].finish_reason in LENGTH_FINISH_REASONS
        for call_id in order
        if call_id in by_id and by_id[call_id].status == "committed"
    )
    violation = _first_violation(by_id, order, position, terminal)
    if violation is not None:
        reason, offender, detail = violation
        if strict:
            raise ForestError(reason, offender, detail)
        return Forest([], [], reason, order, terminal, truncated)
    _check_acyclic(by_id, order)
    has_selected_child = {by_id[call_id].parent_id for call_id in order}
    endpoints = [call_id for call_id in order if call_id not in has_selected_child]
    owned: set[str] = set(context)  # never owned here: counted as owned already
    rows = [_build_row(_path_to(endpoint, by_id), owned) for endpoint in endpoints]
    return Forest(rows, endpoints, None, order, terminal, truncated)


def _first_violation(
    by_id: dict[str, CallRecord],
    order: list[str],
    position: dict[str, int],
    terminal: str | None,
) -> tuple[MaskReason, str | None, str] | None:
    """The highest-priority broken rule, naming the first offending call in selection order."""
    if not order:
        return MaskReason.EMPTY_SELECTION, None, "no call is selected"
    for call_id in order:
        if call_id not in by_id:
            return MaskReason.SELECTED_CALL_MISSING, call_id, "selected, but no call record exists"
    for status, reason in (
        ("pending", MaskReason.SELECTED_CALL_PENDING),
        ("failed", MaskReason.SELECTED_CALL_FAILED),
    ):
        for call_id in order:
            if by_id[call_id].status == status:
                return reason, call_id, f"selected, but its status is {status!r}, not 'committed'"
    for call_id in order:
        parent_id = by_id[call_id].parent_id
        if parent_id is not None and parent_id not in position:
            return (
                MaskReason.SELECTION_NOT_CLOSED,
                call_id,
                f"selected continuation whose parent {parent_id!r} is not selected",
            )
    if terminal is not None and terminal not in position:
        return (
            MaskReason.TERMINAL_NOT_SELECTED,
            terminal,
            f"the scored terminal is not among the {len(order)} selected calls",
        )
    return None


def _check_acyclic(by_id: dict[str, CallRecord], order: list[str]) -> None:
    """Raise when a selected call's parent chain never reaches a root (closure already holds)."""
    reaches_root: set[str] = set()
    for start in order:
        chain: list[str] = []
        on_chain: set[str] = set()
        call_id: str | None = start
        while call_id is not None and call_id not in reaches_root:
            if call_id in on_chain:
                raise ForestError(
                    RecordRule.PARENT_CYCLE,
                    call_id,
                    f"its parent chain returns to itself ({' -> '.join([*chain, call_id])})",
                )
            chain.append(call_id)
            on_chain.add(call_id)
            call_id = by_id[call_id].parent_id
        reaches_root.update(chain)


def _path_to(endpoint: str, by_id: dict[str, CallRecord]) -> list[CallRecord]:
    """The calls from the endpoint's root down to the endpoint."""
    path: list[CallRecord] = []
    call: CallRecord | None = by_id[endpoint]
    while call is not None:
        path.append(call)
        call = by_id[call.parent_id] if call.parent_id is not None else None
    path.reverse()
    if not path[0].prompt_tokens:
        raise ForestError(
            RecordRule.EMPTY_ROOT_PROMPT,
            path[0].call_id,
            "a root must store its full, non-empty prompt",
        )
    return path


def _build_row(path: list[CallRecord], owned: set[str]) -> ForestRow:
    """The path's segments; own every generated span that no earlier row owns. The token lists
    are built on first read (``ForestRow``)."""
    segments: list[RowSegment] = []
    owned_here: list[str] = []
    end = 0
    for call in path:
        start = end
        generated_start = start + len(call.prompt_tokens)
        end = generated_start + len(call.generated_tokens)
        first = call.call_id not in owned
        if first:
            owned.add(call.call_id)
            owned_here.append(call.call_id)
        segments.append(RowSegment(call.call_id, start, generated_start, end, first))
    return row_of_path(path, owned_here, segments)
