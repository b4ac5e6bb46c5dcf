"""``grove lineage``: an attempt's call tree, read with SQL from the lineage views.

The projections are brought up to date first (``grove.ledger.catch_up.catch_up``), then the
queries in :data:`QUERIES` (also in ``docs/sql.md``, where they run verbatim) read the attempt, its
calls with their root and depth (``grove_call_lineage``), its rollout and its recorded finalization.
Each call is marked with its status, decision or root reason, selection index, whether it is an
endpoint (a selected call with no selected child) or the scored terminal, the rows (paths of
``rollout.finalized``) that contain it and the one that owns its generated tokens, and the
rollout's masked reason when a selected call is masked with it. A root the splice's boundary check
made (``template_not_append_compatible``, ``rendered_history_differs``) also shows its divergence
diagnostic (``capture/divergence.py``): the message, the offsets, both token windows and the likely
cause, read from its intent's admission record.

A key is a capture key or a logical rollout id; a rollout id names every attempt of its rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from rich.text import Text
from rich.tree import Tree
from sqlalchemy import Connection, text

from grove.capture.divergence import Divergence
from grove.ledger.catch_up import catch_up
from grove.ledger.errors import LedgerError
from grove.ledger.events import AttemptOpened, CallIntended, RolloutFinalized
from grove.ledger.schema import JsonType
from grove.ledger.store import EventStore, StoredEvent
from grove.ledger.upcasting import decode_as

__all__ = [
    "QUERIES",
    "AttemptLineage",
    "CallLineage",
    "UnknownAttemptError",
    "attempt_events",
    "attempt_lineages",
    "lineage_json",
    "lineage_trees",
    "resolve_capture_key",
]

QUERIES: dict[str, str] = {
    "attempts": """
SELECT capture_key, rollout_id, prompt_group, rollout_index, selection_policy,
       admissions_closed, settled, settle_timed_out, cleaned
FROM grove_proj_attempts
WHERE capture_key = :key OR rollout_id = :key
ORDER BY opened_position
""",
    "calls": """
WITH RECURSIVE chain (call_id, ancestor_call_id, depth) AS (
  SELECT call_id, call_id, 0 FROM grove_proj_calls WHERE capture_key = :key
  UNION ALL
  SELECT l.call_id, p.parent_call_id, l.depth + 1
  FROM chain l
  JOIN grove_proj_calls p ON p.capture_key = :key AND p.call_id = l.ancestor_call_id
  WHERE p.parent_call_id IS NOT NULL
),
deepest (call_id, depth) AS (
  SELECT call_id, MAX(depth) FROM chain GROUP BY call_id
)
SELECT c.call_id, c.parent_call_id, l.ancestor_call_id AS root_call_id, l.depth,
       c.decision, c.root_reason, c.status, c.late, c.failure_reason, c.selection_index,
       c.selected AND NOT EXISTS (
         SELECT 1 FROM grove_calls k
         WHERE k.capture_key = c.capture_key AND k.parent_call_id = c.call_id AND k.selected
       ) AS endpoint,
       c.prompt_tokens, c.prev_len, c.delta_len, c.cum_len, c.generated_len,
       c.finish_reason, c.response_id
FROM grove_calls c
JOIN deepest d ON d.call_id = c.call_id
JOIN chain l ON l.call_id = c.call_id AND l.depth = d.depth
WHERE c.capture_key = :key
ORDER BY c.intended_position
""",
    "rollout": """
SELECT policy, reward, terminal_response_id, selected_calls, status, masked_reason, rows, step
FROM grove_rollouts
WHERE capture_key = :key
""",
    "finalized": """
SELECT position, schema_version, payload
FROM grove_events
WHERE stream_id = :key AND event_type = 'rollout.finalized'
""",
}
"""The SQL ``grove lineage`` runs; ``:key`` is the capture key (or, for attempts, a rollout id).
The columns of ``attempts`` and ``calls`` are fields of :class:`AttemptLineage` and
:class:`CallLineage`, by name."""


class UnknownAttemptError(LedgerError):
    """No attempt of the ledger has this capture key or rollout id (or a rollout id names
    several attempts where one is needed)."""

    def __init__(self, key: str, rule: str) -> None:
        self.key = key
        super().__init__(f"{rule} (key {key!r})")


@dataclass(frozen=True)
class CallLineage:
    """One call of an attempt as ``grove lineage`` marks it (producer: :func:`attempt_lineages`;
    consumers: the tree, ``--json``, ``grove show``).

    ``rows`` are the indexes of the recorded paths that contain the call, ``owner_row`` the one
    that owns its generated tokens (None when no row does); ``masked_reason`` is the rollout's
    when the call is selected and the rollout is masked. Lengths are None until the call commits.
    ``divergence`` is the recorded divergence diagnostic of a root the boundary check made
    (``grove.capture.divergence.Divergence.as_payload``), None for every other call.
    """

    call_id: str
    parent_call_id: str | None
    root_call_id: str
    depth: int
    decision: str
    root_reason: str | None
    status: str
    late: bool
    failure_reason: str | None
    selection_index: int | None
    endpoint: bool
    terminal: bool
    rows: tuple[int, ...]
    owner_row: int | None
    masked_reason: str | None
    prompt_tokens: int
    prev_len: int | None
    delta_len: int | None
    cum_len: int | None
    generated_len: int | None
    finish_reason: str | None
    response_id: str | None
    divergence: dict[str, Any] | None = None

    @property
    def selected(self) -> bool:
        """Whether the selection names this call."""
        return self.selection_index is not None


@dataclass(frozen=True)
class AttemptLineage:
    """An attempt, its rollout decision and its calls in intent order.

    ``rollout`` is the ``grove_rollouts`` row (None before a selection is recorded); ``paths``
    and ``owned`` are those of ``rollout.finalized`` (empty before it, or when masked).
    """

    capture_key: str
    rollout_id: str
    prompt_group: str
    rollout_index: int
    selection_policy: str
    admissions_closed: bool
    settled: bool
    settle_timed_out: bool
    cleaned: bool
    rollout: dict[str, Any] | None
    paths: tuple[tuple[str, ...], ...]
    owned: tuple[tuple[str, ...], ...]
    calls: tuple[CallLineage, ...]

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return asdict(self)


_FLAGS = frozenset(
    {"late", "endpoint", "admissions_closed", "settled", "settle_timed_out", "cleaned"}
)
"""Boolean columns (SQLite returns 0 and 1)."""


def _typed(row: Mapping[Any, Any]) -> dict[str, Any]:  # a row's keys are its column names
    return {k: bool(v) if k in _FLAGS else v for k, v in row.items()}


def _find(conn: Connection, key: str) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(text(QUERIES["attempts"]), {"key": key})]


def resolve_capture_key(store: EventStore, key: str) -> str:
    """The capture key ``key`` names: itself when the ledger has that stream, else the only
    attempt of rollout ``key``."""
    if store.stream_version(key):
        return key
    catch_up(store)
    with store.engine.connect() as conn:
        keys = [row["capture_key"] for row in _find(conn, key)]
    if not keys:
        raise UnknownAttemptError(key, "no attempt has this capture key or rollout id")
    if len(keys) > 1:
        raise UnknownAttemptError(
            key, f"the rollout has {len(keys)} attempts ({', '.join(keys)}); name one"
        )
    return keys[0]


def attempt_events(store: EventStore, key: str) -> tuple[str, list[StoredEvent]]:
    """The capture key ``key`` names and its stream, which must be an attempt's."""
    capture_key = resolve_capture_key(store, key)
    events = store.read_stream(capture_key)
    if not events or events[0].event_type != AttemptOpened.type:
        first = events[0].event_type if events else "nothing"
        raise UnknownAttemptError(
            capture_key, f"the stream is not an attempt: it starts with {first}, not attempt.opened"
        )
    return capture_key, events


def _finalized(conn: Connection, capture_key: str) -> RolloutFinalized | None:
    query = text(QUERIES["finalized"]).columns(payload=JsonType)
    row = conn.execute(query, {"key": capture_key}).first()
    if row is None:
        return None
    return decode_as(RolloutFinalized, RolloutFinalized.type, row.schema_version, row.payload)


def _divergences(store: EventStore, capture_key: str) -> dict[str, dict[str, Any]]:
    """Each call's recorded divergence diagnostic, by call id, from its intent's admission record
    (JSON inside ``call.intended``'s payload, so read from the stream rather than a view)."""
    found: dict[str, dict[str, Any]] = {}
    for stored in store.read_stream(capture_key):
        if stored.event_type != CallIntended.type:
            continue
        event = stored.decode_as(CallIntended)
        divergence = event.admission.get("divergence")
        if isinstance(divergence, dict):
            found[event.call_id] = divergence
    return found


def _calls(
    conn: Connection,
    capture_key: str,
    rollout: dict[str, Any] | None,
    finalized: RolloutFinalized | None,
    divergences: Mapping[str, dict[str, Any]],
) -> tuple[CallLineage, ...]:
    paths = finalized.paths if finalized else ()
    owned = finalized.owned if finalized else ()
    masked = rollout["masked_reason"] if rollout else None
    terminal = rollout["terminal_response_id"] if rollout else None
    calls = []
    for row in conn.execute(text(QUERIES["calls"]), {"key": capture_key}):
        recorded = _typed(row._mapping)
        call_id, selected = recorded["call_id"], recorded["selection_index"] is not None
        calls.append(
            CallLineage(
                **recorded,
                terminal=selected and terminal is not None and recorded["response_id"] == terminal,
                rows=tuple(i for i, path in enumerate(paths) if call_id in path),
                owner_row=next((i for i, ids in enumerate(owned) if call_id in ids), None),
                masked_reason=masked if selected else None,
                divergence=divergences.get(call_id),
            )
        )
    return tuple(calls)


def attempt_lineages(store: EventStore, key: str) -> list[AttemptLineage]:
    """The lineage of every attempt ``key`` names (a capture key or a rollout id), read with
    the lineage views after folding the ledger into the projections."""
    catch_up(store)
    with store.engine.connect() as conn:
        attempts = _find(conn, key)
        if not attempts:
            raise UnknownAttemptError(key, "no attempt has this capture key or rollout id")
        lineages = []
        for attempt in attempts:
            capture_key = attempt["capture_key"]
            rollout_row = conn.execute(text(QUERIES["rollout"]), {"key": capture_key}).first()
            rollout = None if rollout_row is None else dict(rollout_row._mapping)
            finalized = _finalized(conn, capture_key)
            lineages.append(
                AttemptLineage(
                    **_typed(attempt),
                    rollout=rollout,
                    paths=finalized.paths if finalized else (),
                    owned=finalized.owned if finalized else (),
                    calls=_calls(
                        conn, capture_key, rollout, finalized, _divergences(store, capture_key)
                    ),
                )
            )
    return lineages


def lineage_json(key: str, lineages: Sequence[AttemptLineage]) -> dict[str, Any]:
    """The one JSON object ``grove lineage --json`` prints."""
    return {"key": key, "attempts": [lineage.as_dict() for lineage in lineages]}


def _call_label(call: CallLineage) -> Text:
    label = Text(call.call_id, style="bold")
    if call.decision == "root":
        label.append(f"  root ({call.root_reason})", style="cyan")
    else:
        label.append("  continuation", style="cyan")
    status_style = {"committed": "green", "failed": "red", "pending": "yellow"}[call.status]
    label.append(f"  {call.status}", style=status_style)
    if call.late:
        label.append(" late", style="yellow")
    if call.failure_reason:
        label.append(f" ({call.failure_reason})", style="red")
    if call.selected:
        label.append(f"  selected #{call.selection_index}", style="bold magenta")
    else:
        label.append("  not selected", style="dim")
    if call.endpoint:
        label.append("  endpoint", style="bold")
    if call.terminal:
        label.append("  terminal", style="bold")
    if call.rows:
        rows = ",".join(str(r) for r in call.rows)
        owner = "" if call.owner_row is None else f", loss in row {call.owner_row}"
        label.append(f"  rows {rows}{owner}", style="blue")
    if call.masked_reason:
        label.append(f"  masked: {call.masked_reason}", style="bold red")
    if call.cum_len is not None:
        label.append(
            f"  [{call.prev_len}+{call.delta_len}={call.cum_len} tokens, "
            f"{call.generated_len} generated]",
            style="dim",
        )
    if call.divergence is not None:
        label.append("\n" + Divergence.from_payload(call.divergence).describe(), style="yellow")
    return label


def _attempt_label(lineage: AttemptLineage) -> Text:
    label = Text(f"attempt {lineage.capture_key}", style="bold")
    label.append(
        f"  rollout {lineage.rollout_id} (group {lineage.prompt_group}, index "
        f"{lineage.rollout_index})"
    )
    stages = ["admissions closed" if lineage.admissions_closed else "open"]
    if lineage.settled:
        stages.append("settled, timed out" if lineage.settle_timed_out else "settled")
    if lineage.cleaned:
        stages.append("cleaned")
    label.append(f"  [{', '.join(stages)}]", style="dim")
    rollout = lineage.rollout
    if rollout is None:
        label.append("\nno selection recorded", style="yellow")
        return label
    label.append(
        f"\n{rollout['policy']}: reward {rollout['reward']:g}, {rollout['selected_calls']} calls "
        f"selected, {rollout['status']}"
    )
    if rollout["masked_reason"]:
        label.append(f" ({rollout['masked_reason']})", style="bold red")
    if rollout["rows"] is not None:
        label.append(f", {rollout['rows']} rows")
    if rollout["step"] is not None:
        label.append(f", trained at step {rollout['step']}")
    return label


def lineage_trees(lineages: Sequence[AttemptLineage]) -> list[Tree]:
    """One rich tree per attempt: roots under the attempt, continuations under their parent."""
    trees = []
    for lineage in lineages:
        tree = Tree(_attempt_label(lineage))
        nodes: dict[str, Tree] = {}
        for call in lineage.calls:
            parent = nodes.get(call.parent_call_id or "", tree)
            nodes[call.call_id] = parent.add(_call_label(call))
        trees.append(tree)
    return trees
