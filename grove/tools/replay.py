"""``grove replay``: step through an attempt's events, and re-run its recorded decisions.

The steps are ``grove.ledger.event_replay.replay_attempt`` (the state after each event).
``--verify`` re-runs every decision the ledger recorded for the attempt with today's code and
reports each difference:

- admission: ``grove.ledger.event_replay.verify_admissions`` (``grove.ledger.admission.decide`` on
  each intent's recorded boundary);
- selection: ``grove.training.selection.select_rollout`` with the recorded policy on the recorded
  harness result, against the calls as they stood when the selection was recorded
  (``grove.training.projector.captured_calls``); call ids, terminal and reward must agree. The
  policy is looked up in a ``PolicyRegistry`` (the built-ins, plus the custom policies the command
  line registers): a ledger's policy name is never imported, and one the registry lacks is
  reported as skipped, naming it;
- finalization: ``grove.training.projector.finalization_forest`` (the projector's own code,
  reading the blobs) on the state the projector saw, under the settings the event recorded
  (forest mode, row limit, media rules), turned into its ``rollout.finalized`` event;
- publication: the step that published the rollout (read with :data:`QUERIES`): its number is its
  training stream's version, each of its rollouts was finalized before it and is published once,
  its groups are complete (every rollout of each group finalized by then, and equal sizes), and its
  row ids are those of the recorded paths.

Decisions after ``--until POSITION`` are not re-run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import Connection, text

from grove.ledger.attempt import fold_attempt
from grove.ledger.catch_up import catch_up
from grove.ledger.event_replay import (
    CheckOutcome,
    DecisionCheck,
    ReplayStep,
    compare_fields,
    replay_attempt,
    state_before,
    verify_admissions,
)
from grove.ledger.events import AttemptOpened, BatchPublished, RolloutFinalized, RolloutSelected
from grove.ledger.schema import JsonType
from grove.ledger.store import EventStore, StoredEvent
from grove.ledger.upcasting import decode_as, upcast
from grove.storage import BlobStore
from grove.tools.lineage import attempt_events
from grove.training.errors import TrainingError
from grove.training.finalization import recorded_media_rules
from grove.training.projector import captured_calls, finalization_event, finalization_forest
from grove.training.selection import PolicyRegistry

__all__ = [
    "QUERIES",
    "AttemptReplay",
    "render_replay",
    "replay",
    "verify_finalization",
    "verify_publication",
    "verify_selection",
]

QUERIES: dict[str, str] = {
    "published": """
SELECT stream_id, stream_version, position, schema_version, payload
FROM grove_events
WHERE event_type = 'batch.published'
ORDER BY position
""",
    "rollout_attempts": """
SELECT capture_key, prompt_group
FROM grove_rollouts
WHERE rollout_id = :rollout_id AND status IN ('trainable', 'masked')
ORDER BY capture_key
""",
    "group_attempts": """
SELECT capture_key, rollout_id
FROM grove_rollouts
WHERE prompt_group = :prompt_group AND status IN ('trainable', 'masked')
ORDER BY capture_key
""",
}
"""The SQL the publication check runs (also in ``docs/sql.md``)."""


@dataclass(frozen=True)
class AttemptReplay:
    """What ``grove replay`` shows: the steps, and the checks when ``--verify`` asked for them."""

    capture_key: str
    steps: tuple[ReplayStep, ...]
    checks: tuple[DecisionCheck, ...] | None

    @property
    def differences(self) -> int:
        """How many re-run decisions differ from the recorded ones."""
        return sum(c.outcome is CheckOutcome.DIFFERS for c in self.checks or ())

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: steps, checks (None without ``--verify``) and the difference count."""
        return {
            "capture_key": self.capture_key,
            "steps": [step.as_dict() for step in self.steps],
            "checks": None if self.checks is None else [c.as_dict() for c in self.checks],
            "differences": self.differences,
        }


def _first(events: Sequence[StoredEvent], event_type: str, until: int | None) -> StoredEvent | None:
    """The first event of ``event_type`` at or before ``until``: the one that stands (a second
    selection or finalization is a contradiction the fold leaves out)."""
    return next(
        (
            s
            for s in events
            if s.event_type == event_type and (until is None or s.position <= until)
        ),
        None,
    )


def verify_selection(
    capture_key: str,
    events: Sequence[StoredEvent],
    until: int | None = None,
    policies: PolicyRegistry | None = None,
) -> list[DecisionCheck]:
    """Re-run the recorded selection policy, looked up in ``policies`` (default: the built-ins),
    on the recorded result (no check before one)."""
    stored = _first(events, RolloutSelected.type, until)
    if stored is None:
        return []
    recorded = stored.decode_as(RolloutSelected)
    subject = capture_key
    policies = policies or PolicyRegistry.of()
    skipped = None
    if recorded.result is None:
        skipped = "the selection carries no harness result, so the policy cannot be re-run"
    elif recorded.policy not in policies.names:
        skipped = (
            f"the selection names policy {recorded.policy!r}, which is neither built in nor "
            "registered here, so it is not re-run (a ledger's policy is never imported): give it "
            "with --selection-policy to re-run it"
        )
    if skipped is not None:
        return [
            DecisionCheck("selection", subject, stored.position, CheckOutcome.SKIPPED, note=skipped)
        ]
    records = captured_calls(state_before(capture_key, events, stored.position))
    assert recorded.result is not None  # skipped above when there is none
    try:
        today = policies.select(recorded.policy, records, recorded.result)
    except TrainingError as error:
        refused = f"recorded {list(recorded.call_ids)}; today the policy refuses: {error}"
        return [
            DecisionCheck("selection", subject, stored.position, CheckOutcome.DIFFERS, (refused,))
        ]
    return [
        DecisionCheck.compared(
            "selection",
            subject,
            stored.position,
            {
                "call_ids": list(recorded.call_ids),
                "terminal_response_id": recorded.terminal_response_id,
                "reward": recorded.reward,
            },
            {
                "call_ids": list(today.call_ids),
                "terminal_response_id": today.terminal_response_id,
                "reward": today.reward,
            },
            note=f"policy {recorded.policy}",
        )
    ]


def verify_finalization(
    capture_key: str,
    events: Sequence[StoredEvent],
    blobs: BlobStore,
    until: int | None = None,
) -> list[DecisionCheck]:
    """Rebuild the forest as the projector does, on the state it saw, and compare decisions."""
    stored = _first(events, RolloutFinalized.type, until)
    if stored is None:
        return []
    recorded = stored.decode_as(RolloutFinalized)
    state = state_before(capture_key, events, stored.position)
    # The decision reads only the selected calls' blobs: cleaning unselected ones changes nothing.
    selection = state.selection.call_ids if state.selection else ()
    read = {c.committed.blob_key for i in selection if (c := state.calls.get(i)) and c.committed}
    cleaned = read & set(fold_attempt(capture_key, (s.decode() for s in events)).cleaned_keys)
    if cleaned:
        return [
            DecisionCheck(
                "finalization",
                recorded.rollout_id,
                stored.position,
                CheckOutcome.SKIPPED,
                note=f"staging was cleaned ({len(cleaned)} selected blobs removed): no tokens",
            )
        ]
    media = recorded_media_rules(recorded)
    try:
        forest, _ = finalization_forest(
            state,
            blobs,
            forest_training=recorded.forest_training,
            max_row_tokens=recorded.max_row_tokens,
            media_rules=media,
        )
    except TrainingError as error:
        refused = f"recorded trainable={recorded.trainable}; today the forest refuses: {error}"
        return [
            DecisionCheck(
                "finalization",
                recorded.rollout_id,
                stored.position,
                CheckOutcome.DIFFERS,
                (refused,),
            )
        ]
    today = finalization_event(
        recorded.rollout_id,
        forest,
        forest_training=recorded.forest_training,
        max_row_tokens=recorded.max_row_tokens,
        media_rules=media,
    )
    return [
        DecisionCheck.compared(
            "finalization",
            recorded.rollout_id,
            stored.position,
            recorded.model_dump(mode="json"),
            today.model_dump(mode="json"),
        )
    ]


@dataclass(frozen=True)
class _Published:
    stream_id: str
    stream_version: int
    position: int
    event: BatchPublished


def _published(conn: Connection, rollout_id: str) -> list[_Published]:
    """The published steps that bear on ``rollout_id``: those that publish it, and those that
    publish any rollout of theirs (the once-only rule). Only these are decoded: a ledger holds
    one step per few hundred calls, and a step's payload lists hundreds of ids (docs/scale.md)."""
    query = text(QUERIES["published"]).columns(payload=JsonType)
    rows = []
    for row in conn.execute(query):
        listed = upcast(BatchPublished.type, row.schema_version, row.payload).get("rollout_ids")
        rows.append((row, set(listed) if isinstance(listed, list) else None))
    mine = set().union(*(ids for _, ids in rows if ids is not None and rollout_id in ids))
    batches = []
    for row, ids in rows:
        if ids is None or ids & mine:  # a payload without a list of ids fails decoding below
            event = decode_as(BatchPublished, BatchPublished.type, row.schema_version, row.payload)
            batches.append(_Published(row.stream_id, row.stream_version, row.position, event))
    return batches


@dataclass(frozen=True)
class _Finalized:
    """The first finalized attempt of a rollout: its group, decision and where it was recorded."""

    prompt_group: str
    event: RolloutFinalized
    position: int


def _finalized_rollouts(
    store: EventStore, attempts: Sequence[tuple[str, str]]
) -> dict[str, _Finalized]:
    """For each rollout id of ``(capture_key, rollout_id)`` pairs, its first finalized attempt
    (the projector's rule: the first ``rollout.finalized`` of a rollout wins)."""
    first: dict[str, _Finalized] = {}
    for capture_key, rollout_id in attempts:
        events = store.read_stream(capture_key)
        stored = _first(events, RolloutFinalized.type, None)
        opened = events[0].decode() if events else None
        if stored is None or not isinstance(opened, AttemptOpened):
            continue
        event = stored.decode_as(RolloutFinalized)
        if rollout_id not in first or stored.position < first[rollout_id].position:
            first[rollout_id] = _Finalized(opened.prompt_group, event, stored.position)
    return first


def _step_differences(
    store: EventStore, conn: Connection, batch: _Published, batches: Sequence[_Published]
) -> list[str]:
    """Every publication rule the step breaks, one line each."""
    event = batch.event
    problems = []
    if event.step != batch.stream_version - 1:
        problems.append(
            f"step: recorded {event.step}, but it is version {batch.stream_version} of "
            f"{batch.stream_id} (step = version - 1)"
        )
    counts = Counter(event.rollout_ids)
    for other in batches:
        if other.stream_id == batch.stream_id and other.position != batch.position:
            counts.update(r for r in other.event.rollout_ids if r in counts)
    problems += [f"rollout {r} is published {n} times" for r, n in counts.items() if n > 1]
    attempts = [
        (row.capture_key, rollout_id)
        for rollout_id in dict.fromkeys(event.rollout_ids)
        for row in conn.execute(text(QUERIES["rollout_attempts"]), {"rollout_id": rollout_id})
    ]
    finalized = {
        rollout_id: first
        for rollout_id, first in _finalized_rollouts(store, attempts).items()
        if first.position < batch.position
    }
    problems += [
        f"rollout {r} was not finalized before step {event.step}"
        for r in dict.fromkeys(event.rollout_ids)
        if r not in finalized
    ]
    groups: dict[str, set[str]] = {}
    for rollout_id, first in finalized.items():
        groups.setdefault(first.prompt_group, set()).add(rollout_id)
    for group, members in groups.items():
        rows = conn.execute(text(QUERIES["group_attempts"]), {"prompt_group": group})
        known = {
            rollout_id
            for rollout_id, first in _finalized_rollouts(
                store, [(r.capture_key, r.rollout_id) for r in rows]
            ).items()
            if first.position < batch.position
        }
        if known != members:
            problems.append(
                f"group {group} is incomplete: the step has {sorted(members)}, the ledger had "
                f"finalized {sorted(known)} before it"
            )
    if len({len(m) for m in groups.values()}) > 1:
        problems.append(
            f"groups of unequal size in one step: { {g: len(m) for g, m in groups.items()} }"
        )
    if len(finalized) == len(counts):
        expected = [
            f"{rollout_id}/{i}"
            for rollout_id in event.rollout_ids
            for i in range(len(finalized[rollout_id].event.paths))
        ]
        problems += [
            f"{line} (from the recorded paths)"
            for line in compare_fields({"row_ids": list(event.row_ids)}, {"row_ids": expected})
        ]
    return problems


def verify_publication(
    store: EventStore, rollout_id: str, finalized_position: int | None, until: int | None = None
) -> list[DecisionCheck]:
    """Check the step(s) that published ``rollout_id`` against the publication rules (the
    projections are brought up to date first: the group queries read ``grove_rollouts``)."""
    catch_up(store)
    with store.engine.connect() as conn:
        batches = [b for b in _published(conn, rollout_id) if until is None or b.position <= until]
        mine = [b for b in batches if rollout_id in b.event.rollout_ids]
        if not mine:
            if finalized_position is None:
                return []
            return [
                DecisionCheck(
                    "publication",
                    rollout_id,
                    finalized_position,
                    CheckOutcome.SKIPPED,
                    note="the rollout is finalized but no step has published it yet",
                )
            ]
        checks = []
        for batch in mine:
            published = batch.event
            problems = _step_differences(store, conn, batch, batches)
            if len(mine) > 1:
                problems.insert(0, f"rollout {rollout_id} is published in {len(mine)} steps")
            checks.append(
                DecisionCheck(
                    "publication",
                    f"step {published.step} of {batch.stream_id}",
                    batch.position,
                    CheckOutcome.DIFFERS if problems else CheckOutcome.SAME,
                    tuple(problems),
                    note=f"{len(published.rollout_ids)} rollouts, {len(published.row_ids)} rows",
                )
            )
    return checks


def replay(
    store: EventStore,
    key: str,
    *,
    until: int | None = None,
    blobs: BlobStore | None = None,
    policies: PolicyRegistry | None = None,
) -> AttemptReplay:
    """The attempt's steps up to ``until``; with ``blobs``, every recorded decision re-run too
    (the selection with the policies of ``policies``, default: the built-ins)."""
    capture_key, events = attempt_events(store, key)
    steps = replay_attempt(capture_key, events, until)
    if blobs is None:
        return AttemptReplay(capture_key, steps, None)
    opened = events[0].decode_as(AttemptOpened)  # attempt_events: the stream opens an attempt
    finalized = _first(events, RolloutFinalized.type, until)
    checks = [
        *verify_admissions(capture_key, events, until),
        *verify_selection(capture_key, events, until, policies),
        *verify_finalization(capture_key, events, blobs, until),
        *verify_publication(
            store, opened.rollout_id, finalized.position if finalized else None, until
        ),
    ]
    return AttemptReplay(capture_key, steps, tuple(checks))


def _state_text(step: ReplayStep) -> Text:
    s = step.summary
    out = Text()

    def line(label: str, ids: Sequence[str], style: str) -> None:
        if ids:
            out.append(f"{label}: ", style="dim")
            out.append(" ".join(ids) + "\n", style=style)

    line("pending", s.pending, "yellow")
    line("committed", s.committed, "green")
    line("late", s.late, "yellow")
    line("failed", [f"{c} ({s.failures[c]})" for c in s.failed], "red")
    rejected = [f"{c} ({r})" for c, r in s.failures.items() if c not in s.failed]
    line("committed, then failed", rejected, "red")
    line("left out", s.contradictions, "bold red")
    flags = []
    if s.admissions_closed:
        flags.append("admissions closed")
    if s.settled:
        flags.append("settled (timed out)" if s.settle_timed_out else "settled")
    if s.selection is not None:
        flags.append(f"selected {len(s.selection)}")
    if s.finalization is not None:
        flags.append(s.finalization)
    if s.cleaned_keys:
        flags.append(f"cleaned {s.cleaned_keys}")
    out.append(" · ".join(flags) if flags else "open", style="bold")
    return out


_OUTCOME_STYLE = {
    CheckOutcome.SAME: "green",
    CheckOutcome.DIFFERS: "bold red",
    CheckOutcome.SKIPPED: "yellow",
}


def render_replay(result: AttemptReplay, console: Console) -> None:
    """Print the steps as a table, then the checks and their tally when there are any."""
    table = Table(title=f"replay of attempt {result.capture_key}", show_lines=True)
    for column in ("pos", "v", "event", "what", "state after"):
        table.add_column(column, justify="right" if column in ("pos", "v") else "left")
    for step in result.steps:
        table.add_row(
            str(step.position),
            str(step.stream_version),
            step.event_type,
            step.detail,
            _state_text(step),
        )
    console.print(table)
    if result.checks is None:
        return
    checks = Table(title="recorded decisions re-run with today's code")
    for column in ("decision", "subject", "pos", "outcome", "differences"):
        checks.add_column(column)
    for check in result.checks:
        detail = "\n".join(check.differences)
        if check.note:
            detail = f"{detail}\n({check.note})" if detail else f"({check.note})"
        checks.add_row(
            check.decision,
            check.subject,
            str(check.position),
            Text(check.outcome.value, style=_OUTCOME_STYLE[check.outcome]),
            detail,
        )
    console.print(checks)
    tally = Counter(c.outcome for c in result.checks)
    console.print(
        f"{len(result.checks)} decisions re-run: {tally[CheckOutcome.SAME]} same, "
        f"{tally[CheckOutcome.DIFFERS]} differ, {tally[CheckOutcome.SKIPPED]} skipped",
        style="bold red" if result.differences else "bold green",
    )
