"""Drift between the projection tables and the attempt fold: what ``grove db check`` reports.

The projection tables (``ledger/inline_fold.py`` writes them in SQL, append by append) must show of
every attempt exactly what the pure attempt fold (``grove.ledger.attempt.fold_attempt``) makes of
its stream. ``fold_drift`` reads the whole ledger with the gap-free reader, folds each stream in
Python, reads the tables, and compares per attempt: the attempt's row (rollout identity,
admissions, settling, fork source), each call's row (parent and the attempt that owns it, status,
lateness, failure, selection index, policy version), the rollout's row (status, selected calls,
reward, row count) and the contradictions in stream order. It only reads; events and rows are read
in one snapshot (a repeatable-read transaction on PostgreSQL, a deferred read transaction on
SQLite), so an append running beside it cannot show as drift. A difference means the tables were
changed by hand, folded by an older Grove, or not folded yet (a ledger imported in bulk):
``grove db rebuild-projections`` folds them again from the events (``docs/ledger.md``).

``cleaned`` is left out: the table marks an attempt cleaned by an ``attempt.cleaned`` recorded
after its opening, while the fold keeps the keys of every one, before the opening too.

On PostgreSQL the tables hold U+0000 as U+FFFD (a text column cannot hold it), so the fold's
strings are compared the same way there.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from grove.ledger.attempt import AttemptState, CallState, CallStatus, fold_attempt
from grove.ledger.database import autocommit, translate_errors
from grove.ledger.schema import (
    EVENTS,
    PROJ_ATTEMPTS,
    PROJ_CALLS,
    PROJ_CONTRADICTIONS,
    PROJ_ROLLOUTS,
)
from grove.ledger.store import EventStore
from grove.ledger.upcasting import decode_payload

__all__ = ["FoldDrift", "fold_drift", "folded_rows"]

_READ_BATCH = 5000


@dataclass(frozen=True)
class FoldDrift:
    """One attempt whose rows in ``table`` differ from its fold: ``expected`` is what the fold
    makes of its stream, ``found`` what the table holds (``None``: no row)."""

    capture_key: str
    table: str
    expected: Any
    found: Any

    def describe(self) -> str:
        """One line for an operator: which attempt, which table, expected and found."""
        return (
            f"{self.capture_key}: {self.table} holds {self.found!r}; "
            f"the fold of its events makes {self.expected!r}"
        )


def _text(value: Any, postgres: bool) -> Any:
    if postgres and isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    return value


def _policy_version(call: CallState) -> int | None:
    """The committed call's policy version, else the intended one (``docs/sql.md``)."""
    if call.committed is not None and call.committed.policy_version is not None:
        return call.committed.policy_version
    return call.intended.policy_version


def _nothing() -> dict[str, Any]:
    """The rows of an attempt with none in any table."""
    return {"attempts": None, "calls": set(), "rollouts": None, "contradictions": []}


def folded_rows(state: AttemptState, *, postgres: bool = False) -> dict[str, Any]:
    """What the four tables should hold of one folded attempt, by table name without its
    ``grove_proj_`` prefix: ``attempts`` (a tuple, or None before the opening), ``calls`` (a set
    of tuples), ``rollouts`` (a tuple, or None before the selection) and ``contradictions`` (in
    stream order). ``postgres``: strings as PostgreSQL's text columns hold them."""
    t = lambda value: _text(value, postgres)  # noqa: E731
    contradictions = [t(entry) for entry in state.contradictions]
    if state.opened is None:
        return {**_nothing(), "contradictions": contradictions}
    opened = state.opened
    fork = opened.fork_from
    attempt = (
        t(opened.rollout_id),
        t(opened.prompt_group),
        opened.rollout_index,
        state.admissions_closed,
        state.settled is not None,
        bool(state.settled and state.settled.timed_out),
        t(fork.source_capture_key) if fork else None,
        t(fork.source_call_id) if fork else None,
    )
    selection = state.selection
    indexes = {c: i for i, c in enumerate(selection.call_ids)} if selection else {}
    calls = {
        (
            t(call.call_id),
            t(call.parent_call_id),
            call.status.value,
            call.late if call.status is CallStatus.COMMITTED else False,
            t(call.failure.reason) if call.failure else None,
            indexes.get(call.call_id),
            _policy_version(call),
            t(call.intended.source_capture_key),
        )
        for call in state.calls.values()
    }
    rollout = None
    if selection is not None:
        final = state.finalized
        status = "selected" if final is None else ("trainable" if final.trainable else "masked")
        rows = None if final is None else len(final.paths)
        rollout = (t(opened.rollout_id), status, len(selection.call_ids), selection.reward, rows)
    return {
        "attempts": attempt,
        "calls": calls,
        "rollouts": rollout,
        "contradictions": contradictions,
    }


def _folded(conn: Connection) -> dict[str, AttemptState]:
    """Every stream's attempt fold, from every event visible in ``conn``'s transaction."""
    states: dict[str, AttemptState] = {}
    after = -1
    while True:
        rows = conn.execute(
            select(EVENTS)
            .where(EVENTS.c.position > after)
            .order_by(EVENTS.c.position)
            .limit(_READ_BATCH)
        ).all()
        if not rows:
            return states
        for row in rows:
            event = decode_payload(row.event_type, row.schema_version, row.payload)
            key = row.stream_id
            states[key] = fold_attempt(key, (event,), states.get(key))
        after = rows[-1].position


def _found(conn: Connection) -> dict[str, dict[str, Any]]:
    """What the four tables hold, per capture key."""
    found: dict[str, dict[str, Any]] = {}

    def entry(key: str) -> dict[str, Any]:
        return found.setdefault(key, _nothing())

    for r in conn.execute(select(PROJ_ATTEMPTS)):
        entry(r.capture_key)["attempts"] = (
            r.rollout_id,
            r.prompt_group,
            r.rollout_index,
            bool(r.admissions_closed),
            bool(r.settled),
            bool(r.settle_timed_out),
            r.fork_source_capture_key,
            r.fork_source_call_id,
        )
    for r in conn.execute(select(PROJ_CALLS)):
        entry(r.capture_key)["calls"].add(
            (
                r.call_id,
                r.parent_call_id,
                r.status,
                bool(r.late),
                r.failure_reason,
                r.selection_index,
                r.policy_version,
                r.source_capture_key,
            )
        )
    for r in conn.execute(select(PROJ_ROLLOUTS)):
        entry(r.capture_key)["rollouts"] = (
            r.rollout_id,
            r.status,
            r.selected_calls,
            r.reward,
            r.rows,
        )
    x = PROJ_CONTRADICTIONS.c
    for r in conn.execute(select(PROJ_CONTRADICTIONS).order_by(x.capture_key, x.stream_version)):
        entry(r.capture_key)["contradictions"].append(r.contradiction)
    return found


def _differences(
    states: dict[str, AttemptState], found: dict[str, dict[str, Any]], postgres: bool
) -> Iterator[FoldDrift]:
    empty = _nothing()
    for key in sorted(set(states) | set(found)):
        expected = folded_rows(states[key], postgres=postgres) if key in states else empty
        shown = found.get(key, empty)
        for table in ("attempts", "calls", "rollouts", "contradictions"):
            if expected[table] != shown[table]:
                yield FoldDrift(key, f"grove_proj_{table}", expected[table], shown[table])


def fold_drift(store: EventStore) -> list[FoldDrift]:
    """Every attempt whose projection rows differ from the fold of its events, in capture-key
    order; empty when the tables are exactly the fold's."""
    postgres = store.engine.dialect.name == "postgresql"
    with translate_errors(store.url), store.engine.connect() as conn:
        if postgres:  # one snapshot for the events and the rows
            conn = conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                states, found = _folded(conn), _found(conn)
        else:  # a deferred BEGIN: a read snapshot (WAL) without taking the write lock
            conn = autocommit(conn)
            conn.exec_driver_sql("BEGIN")
            try:
                states, found = _folded(conn), _found(conn)
            finally:
                conn.exec_driver_sql("ROLLBACK")
    return list(_differences(states, found, postgres))
