"""Candidate admission: does a new request continue a committed call of the same attempt?

Pure: plain data in, plain data out (no database, no tokenizer, no model). The capture side turns a
request into :class:`AdmissionItem` records (role plus digests, see ``capture/render.py``); the
lifecycle turns the attempt's calls into :class:`CandidateCall` records kept in an
:class:`AdmissionIndex`; :func:`admit` returns an :class:`AdmissionDecision`, or raises an
:class:`AdmissionError` before any generation.

The algorithm (``docs/normalization.md``):

1. One pass over the request chains its item digests, ``p_0 = PREFIX_DIGEST_SEED``,
   ``p_i = sha256(p_{i-1} || d_i)``, twice: over the strict item digests and over the canonical
   ones (null and empty assistant tool-call content identified). A committed call's source digest
   is the same chain over its request plus its own output, so "call C's source is a prefix of this
   request" is "``p_k`` equals C's source digest" for ``k`` = C's item count.
2. A parent's source ends with its own assistant output, and the items after it must be user or
   tool observations. So the only prefix that can be compatible is the one that ends at the
   request's last assistant item (the *boundary*); it is the longest compatible prefix by
   construction. :func:`locate_boundary` records it (:class:`RequestBoundary`).
3. :func:`decide` looks the boundary digest up in the index: O(1), whatever the number of earlier
   calls. Compatible candidates are committed and have the request's render-option digest.
   Pending and failed calls are never parents. Strict matches are preferred; a canonical-only
   match is used only when the caller proved the renderer renders both tool-content forms
   identically, and the decision records that it was used. Several compatible candidates are
   disambiguated by the response ids the request echoes on its boundary item; an unresolved tie
   raises :class:`AmbiguousParentError`.

The total cost is one hash per request item plus a constant number of dictionary look-ups; the
baseline it replaces compares the request with every earlier call's message list
(``bench/admission.py``).

Errors (each also a :class:`grove.ledger.errors.LedgerError`)::

    AdmissionError                 a request that cannot be admitted; nothing is generated
    ├── EmptyRequestError          the request has no items
    ├── AssistantPrefillError      the request ends with an assistant message it wants continued
    ├── EmptySuffixError           the request adds nothing after a committed call's output
    └── AmbiguousParentError       several committed calls qualify and echoed ids do not decide
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from grove.ledger.errors import LedgerError

__all__ = [
    "ASSISTANT_ROLE",
    "OBSERVATION_ROLES",
    "PREFIX_DIGEST_SEED",
    "UNEXPLAINED_ROOT_REASONS",
    "AdmissionDecision",
    "AdmissionError",
    "AdmissionIndex",
    "AdmissionItem",
    "AmbiguousParentError",
    "AssistantPrefillError",
    "CallStatus",
    "CandidateCall",
    "DecisionKind",
    "EmptyRequestError",
    "EmptySuffixError",
    "Equivalence",
    "RequestBoundary",
    "RootReason",
    "admit",
    "decide",
    "extend_prefix_digest",
    "locate_boundary",
    "prefix_digests",
]

ASSISTANT_ROLE: Final = "assistant"
OBSERVATION_ROLES: Final = frozenset({"user", "tool"})
PREFIX_DIGEST_SEED: Final = hashlib.sha256(b"grove.prefix.v1").hexdigest()


def extend_prefix_digest(prefix_digest: str, item_digest: str) -> str:
    """The chain digest of a prefix extended by one item: ``sha256(prefix || item)``."""
    return hashlib.sha256(f"{prefix_digest}{item_digest}".encode("ascii")).hexdigest()


def prefix_digests(
    items: Iterable[AdmissionItem],
    strict: str = PREFIX_DIGEST_SEED,
    canonical: str = PREFIX_DIGEST_SEED,
) -> Iterator[tuple[str, str]]:
    """Extend a strict and a canonical chain by each item in turn, yielding both after each.

    While the two chains agree and an item's two digests agree, the canonical chain is the strict
    one and is not hashed again (the common case: no null-or-empty tool-call content).
    """
    for item in items:
        same = canonical == strict and item.canonical_digest == item.digest
        strict = extend_prefix_digest(strict, item.digest)
        canonical = strict if same else extend_prefix_digest(canonical, item.canonical_digest)
        yield strict, canonical


class CallStatus(StrEnum):
    """Where a call stands in its lifecycle; only committed calls can be parents."""

    PENDING = "pending"
    COMMITTED = "committed"
    FAILED = "failed"


class DecisionKind(StrEnum):
    """What a call is: a root (stores its full prompt) or a continuation of a parent call."""

    ROOT = "root"
    CONTINUATION = "continuation"


class RootReason(StrEnum):
    """Why a call is a root: the recorded reason codes (``docs/normalization.md``).

    The first seven come from admission (:func:`decide`); the last two from the boundary check of
    the splice (``capture/splice.py``), which roots a candidate the template cannot extend exactly.
    ``render_options_changed`` means a committed call matches with other per-call options (tools,
    tool choice, reasoning effort): a call that changes its attempt's model or template options is
    refused before admission (``capture/fixed_options.py``), though ledgers written before that
    rule may hold the reason for such a change too.
    """

    FIRST_CALL = "first_call"
    SUFFIX_NOT_OBSERVATIONS = "suffix_not_observations"
    HISTORY_REWRITTEN = "history_rewritten"
    RENDER_OPTIONS_CHANGED = "render_options_changed"
    PARENT_PENDING = "parent_pending"
    PARENT_FAILED = "parent_failed"
    TOOL_CONTENT_NOT_EQUIVALENT = "tool_content_not_equivalent"
    TEMPLATE_NOT_APPEND_COMPATIBLE = "template_not_append_compatible"
    RENDERED_HISTORY_DIFFERS = "rendered_history_differs"


UNEXPLAINED_ROOT_REASONS: Final = frozenset(
    {RootReason.TEMPLATE_NOT_APPEND_COMPATIBLE, RootReason.RENDERED_HISTORY_DIFFERS}
)
"""The reasons of an *unexplained* root (``docs/metrics.md``): admission found the committed call
the request continues (so never the attempt's first call), and the template could not extend that
call's exact tokens; nothing the harness did explains it."""


class Equivalence(StrEnum):
    """A relaxation of exact source matching that a decision used (recorded on the intent)."""

    TOOL_CONTENT_NULL_EMPTY = "tool_content_null_empty"


class AdmissionError(LedgerError):
    """A request that cannot be admitted; raised before generation, nothing is written."""


class EmptyRequestError(AdmissionError):
    """The request has no items."""

    def __init__(self) -> None:
        super().__init__("A request needs at least one message; got 0 items")


class AssistantPrefillError(AdmissionError):
    """The request ends with an assistant message (assistant prefill is not supported)."""

    def __init__(self, item_count: int) -> None:
        self.item_count = item_count
        super().__init__(
            "Assistant prefill is not supported: the last of the request's "
            f"{item_count} messages is an assistant message; end the request with a user or tool "
            "message and let the model write the assistant turn"
        )


class EmptySuffixError(AdmissionError):
    """The request is exactly a committed call's history plus its output, with nothing new."""

    def __init__(self, call_ids: tuple[str, ...], item_count: int) -> None:
        self.call_ids = call_ids
        self.item_count = item_count
        super().__init__(
            "A request must add at least one user or tool message after the output it continues: "
            f"all {item_count} messages equal the source of committed call(s) "
            f"{', '.join(call_ids)}, so the suffix is empty"
        )


class AmbiguousParentError(AdmissionError):
    """Several committed calls qualify as the parent and the echoed ids do not pick one."""

    def __init__(
        self, call_ids: tuple[str, ...], echoed_ids: tuple[str, ...], prefix_item_count: int
    ) -> None:
        self.call_ids = call_ids
        self.echoed_ids = echoed_ids
        self.prefix_item_count = prefix_item_count
        echoed = ", ".join(echoed_ids) if echoed_ids else "none"
        super().__init__(
            "Ambiguous parent: the request's first "
            f"{prefix_item_count} messages equal the source of committed calls "
            f"{', '.join(call_ids)}, and the response ids it echoes ({echoed}) do not pick "
            "exactly one of them; echo the chosen response's id on its output item"
        )


@dataclass(frozen=True, slots=True)
class AdmissionItem:
    """One normalized request item as admission sees it.

    Producer: ``grove.capture.render.admission_items``; consumer: :func:`locate_boundary`.
    ``digest`` is the sha256 hex of the item's canonical JSON; ``canonical_digest`` is the same
    with null and empty assistant tool-call content identified (equal to ``digest`` for every other
    item); ``echoed_ids`` are the provider ids the client sent on this item (normalization drops
    them from the digest), empty when it sent none.
    """

    role: str
    digest: str
    canonical_digest: str
    echoed_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CandidateCall:
    """A call of the attempt as admission sees it.

    Producer: the capture lifecycle, from ``call.committed`` (or ``call.failed``) events and the
    call's replay summary; consumer: :class:`AdmissionIndex`. ``source_digest`` and
    ``canonical_source_digest`` chain the call's request items plus its own output item;
    ``response_ids`` are the ids the gateway returned for the call (response id and output item
    ids), used to break ties.
    """

    call_id: str
    status: CallStatus
    source_digest: str
    canonical_source_digest: str
    render_options_digest: str
    response_ids: frozenset[str] = frozenset()


class AdmissionIndex:
    """The attempt's calls keyed by source digest, for O(1) look-ups of a request's boundary.

    The lifecycle keeps one per attempt and :meth:`add` s each call when it commits (or fails);
    adding a call id again replaces the earlier record (a status change).
    """

    def __init__(self, calls: Iterable[CandidateCall] = ()) -> None:
        self._calls: dict[str, CandidateCall] = {}
        self._by_source: dict[str, dict[str, CandidateCall]] = {}
        self._by_canonical: dict[str, dict[str, CandidateCall]] = {}
        for call in calls:
            self.add(call)

    def add(self, call: CandidateCall) -> None:
        """Index ``call``, replacing any earlier record of the same call id."""
        earlier = self._calls.get(call.call_id)
        if earlier is not None:
            del self._by_source[earlier.source_digest][earlier.call_id]
            del self._by_canonical[earlier.canonical_source_digest][earlier.call_id]
        self._calls[call.call_id] = call
        self._by_source.setdefault(call.source_digest, {})[call.call_id] = call
        self._by_canonical.setdefault(call.canonical_source_digest, {})[call.call_id] = call

    def by_source_digest(self, digest: str) -> tuple[CandidateCall, ...]:
        """Calls whose source digest is ``digest``, in the order they were first added."""
        return tuple(self._by_source.get(digest, {}).values())

    def by_canonical_source_digest(self, digest: str) -> tuple[CandidateCall, ...]:
        """Calls whose canonical source digest is ``digest``, in the order first added."""
        return tuple(self._by_canonical.get(digest, {}).values())

    def __len__(self) -> int:
        return len(self._calls)


@dataclass(frozen=True, slots=True)
class RequestBoundary:
    """Where a request could continue an earlier call: right after its last assistant item.

    Producer: :func:`locate_boundary`; consumers: :func:`decide`, and the ``call.intended`` event
    (so replay can re-run :func:`decide` without the messages). ``prefix_item_count`` is 0 and the
    digests are None when the request has no assistant item; ``prefix_item_count == item_count``
    means the request ends with an assistant item. ``echoed_ids`` are those of the boundary item.
    """

    item_count: int
    prefix_item_count: int
    prefix_digest: str | None
    canonical_prefix_digest: str | None
    echoed_ids: tuple[str, ...]
    suffix_only_observations: bool


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """Root or continuation for one request, and why; recorded on ``call.intended``.

    Producer: :func:`decide`, then possibly ``grove.capture.splice.plan_call`` (which roots a
    candidate whose boundary check fails, keeping ``candidate_call_id``). ``parent_call_id`` is set
    exactly when ``kind`` is continuation; ``reason`` exactly when it is root. ``candidate_call_id``
    is the parent admission chose, kept when the splice roots it. ``matched_call_ids`` are every
    call whose source matched the boundary (compatible or not), for diagnosis.
    """

    kind: DecisionKind
    parent_call_id: str | None
    candidate_call_id: str | None
    reason: RootReason | None
    boundary: RequestBoundary
    render_options_digest: str
    matched_call_ids: tuple[str, ...] = ()
    equivalences: tuple[Equivalence, ...] = ()
    tie_broken_by_echoed_id: bool = False

    def rooted(self, reason: RootReason) -> AdmissionDecision:
        """This decision turned into a root for ``reason``; the candidate stays recorded."""
        return replace(self, kind=DecisionKind.ROOT, parent_call_id=None, reason=reason)

    def as_payload(self) -> dict[str, Any]:
        """A JSON-ready dict of every field (the ``call.intended`` admission record)."""
        b = self.boundary
        return {
            "kind": self.kind.value,
            "parent_call_id": self.parent_call_id,
            "candidate_call_id": self.candidate_call_id,
            "reason": None if self.reason is None else self.reason.value,
            "item_count": b.item_count,
            "prefix_item_count": b.prefix_item_count,
            "prefix_digest": b.prefix_digest,
            "canonical_prefix_digest": b.canonical_prefix_digest,
            "echoed_ids": list(b.echoed_ids),
            "suffix_only_observations": b.suffix_only_observations,
            "render_options_digest": self.render_options_digest,
            "matched_call_ids": list(self.matched_call_ids),
            "equivalences": [e.value for e in self.equivalences],
            "tie_broken_by_echoed_id": self.tie_broken_by_echoed_id,
        }

    @classmethod
    def from_payload(cls, payload: Mapping[str, Any]) -> AdmissionDecision:
        """The decision :meth:`as_payload` wrote (for replay)."""
        reason = payload["reason"]
        return cls(
            kind=DecisionKind(payload["kind"]),
            parent_call_id=payload["parent_call_id"],
            candidate_call_id=payload["candidate_call_id"],
            reason=None if reason is None else RootReason(reason),
            boundary=RequestBoundary(
                item_count=payload["item_count"],
                prefix_item_count=payload["prefix_item_count"],
                prefix_digest=payload["prefix_digest"],
                canonical_prefix_digest=payload["canonical_prefix_digest"],
                echoed_ids=tuple(payload["echoed_ids"]),
                suffix_only_observations=payload["suffix_only_observations"],
            ),
            render_options_digest=payload["render_options_digest"],
            matched_call_ids=tuple(payload["matched_call_ids"]),
            equivalences=tuple(Equivalence(e) for e in payload["equivalences"]),
            tie_broken_by_echoed_id=payload["tie_broken_by_echoed_id"],
        )


def locate_boundary(
    items: Sequence[AdmissionItem], chains: Iterable[tuple[str, str]] | None = None
) -> RequestBoundary:
    """Chain the request's item digests in one pass and record its last-assistant boundary;
    ``chains``: the request's :func:`prefix_digests`, where the caller has them already."""
    if not items:
        raise EmptyRequestError()
    boundary = 0
    boundary_strict: str | None = None
    boundary_canonical: str | None = None
    only_observations = True
    if chains is None:
        chains = prefix_digests(items)
    for position, (item, (strict, canonical)) in enumerate(
        zip(items, chains, strict=True), start=1
    ):
        if item.role == ASSISTANT_ROLE:
            boundary, boundary_strict, boundary_canonical = position, strict, canonical
            only_observations = True
        elif item.role not in OBSERVATION_ROLES:
            only_observations = False
    return RequestBoundary(
        item_count=len(items),
        prefix_item_count=boundary,
        prefix_digest=boundary_strict,
        canonical_prefix_digest=boundary_canonical,
        echoed_ids=items[boundary - 1].echoed_ids if boundary else (),
        suffix_only_observations=only_observations,
    )


def admit(
    items: Sequence[AdmissionItem],
    *,
    render_options_digest: str,
    index: AdmissionIndex,
    tool_content_equivalence_proven: bool = False,
) -> AdmissionDecision:
    """Decide root or continuation for a request: :func:`locate_boundary`, then :func:`decide`."""
    return decide(
        locate_boundary(items),
        render_options_digest=render_options_digest,
        index=index,
        tool_content_equivalence_proven=tool_content_equivalence_proven,
    )


def decide(
    boundary: RequestBoundary,
    *,
    render_options_digest: str,
    index: AdmissionIndex,
    tool_content_equivalence_proven: bool = False,
) -> AdmissionDecision:
    """Decide root or continuation from a located boundary, with O(1) index look-ups.

    ``tool_content_equivalence_proven`` is the capture side's proof that the renderer renders null
    and empty assistant tool-call content identically for this request; without it a match that
    needs that equivalence roots the call (``tool_content_not_equivalent``).
    """

    def root(reason: RootReason, matched: Sequence[CandidateCall] = ()) -> AdmissionDecision:
        return AdmissionDecision(
            kind=DecisionKind.ROOT,
            parent_call_id=None,
            candidate_call_id=None,
            reason=reason,
            boundary=boundary,
            render_options_digest=render_options_digest,
            matched_call_ids=tuple(c.call_id for c in matched),
        )

    strict: tuple[CandidateCall, ...] = ()
    canonical: tuple[CandidateCall, ...] = ()
    if boundary.prefix_digest is not None and boundary.canonical_prefix_digest is not None:
        strict = index.by_source_digest(boundary.prefix_digest)
        strict_ids = {c.call_id for c in strict}
        canonical = tuple(
            c
            for c in index.by_canonical_source_digest(boundary.canonical_prefix_digest)
            if c.call_id not in strict_ids
        )
    matched = strict + canonical
    if boundary.prefix_item_count == boundary.item_count:
        committed = tuple(c.call_id for c in matched if c.status is CallStatus.COMMITTED)
        if committed:
            raise EmptySuffixError(committed, boundary.item_count)
        raise AssistantPrefillError(boundary.item_count)
    if len(index) == 0:
        return root(RootReason.FIRST_CALL)
    if boundary.prefix_item_count == 0:
        return root(RootReason.HISTORY_REWRITTEN)  # e.g. a summary replaced every turn
    if not boundary.suffix_only_observations:
        return root(RootReason.SUFFIX_NOT_OBSERVATIONS, matched)
    equivalences: tuple[Equivalence, ...] = ()
    compatible = _compatible(strict, render_options_digest)
    if not compatible:
        compatible = _compatible(canonical, render_options_digest)
        if compatible and not tool_content_equivalence_proven:
            return root(RootReason.TOOL_CONTENT_NOT_EQUIVALENT, matched)
        equivalences = (Equivalence.TOOL_CONTENT_NULL_EMPTY,)
    if not compatible:
        return root(_incompatibility(matched), matched)
    parent, tie_broken = _pick_parent(compatible, boundary)
    return AdmissionDecision(
        kind=DecisionKind.CONTINUATION,
        parent_call_id=parent.call_id,
        candidate_call_id=parent.call_id,
        reason=None,
        boundary=boundary,
        render_options_digest=render_options_digest,
        matched_call_ids=tuple(c.call_id for c in matched),
        equivalences=equivalences,
        tie_broken_by_echoed_id=tie_broken,
    )


def _compatible(
    calls: Sequence[CandidateCall], render_options_digest: str
) -> tuple[CandidateCall, ...]:
    return tuple(
        c
        for c in calls
        if c.status is CallStatus.COMMITTED and c.render_options_digest == render_options_digest
    )


def _incompatibility(matched: Sequence[CandidateCall]) -> RootReason:
    """Why none of the matched calls can be a parent (the most telling reason first): a committed
    match has other render options (per-call ones, once the fixed ones were checked)."""
    statuses = {c.status for c in matched}
    if CallStatus.COMMITTED in statuses:
        return RootReason.RENDER_OPTIONS_CHANGED
    if CallStatus.FAILED in statuses:
        return RootReason.PARENT_FAILED
    if CallStatus.PENDING in statuses:
        return RootReason.PARENT_PENDING
    return RootReason.HISTORY_REWRITTEN


def _pick_parent(
    compatible: Sequence[CandidateCall], boundary: RequestBoundary
) -> tuple[CandidateCall, bool]:
    """The single compatible call, or the single one whose response ids the request echoes."""
    if len(compatible) == 1:
        return compatible[0], False
    echoed = set(boundary.echoed_ids)
    echoing = [c for c in compatible if c.response_ids & echoed]
    if len(echoing) == 1:
        return echoing[0], True
    raise AmbiguousParentError(
        tuple(c.call_id for c in compatible), boundary.echoed_ids, boundary.prefix_item_count
    )
