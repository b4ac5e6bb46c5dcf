"""Projection tables rebuilt from events: attempts, calls and rollouts.

Each projection folds events, read with the gap-free reader, into its table and advances its own
checkpoint in the same transaction as its rows, so a crash never leaves rows without their mark
(or a mark without its rows). The checkpoint is advanced by compare-and-set: two runners catching
up at once cannot apply the same events twice. ``rebuild`` empties the tables and replays from
position 0, which gives the same rows as following the ledger incrementally.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Connection, Table, delete, insert, select, update
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from ledger.database import translate_errors
from ledger.events import (
    AdmissionsClosed,
    AttemptCleaned,
    AttemptOpened,
    AttemptSettled,
    BatchPublished,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    LedgerPosition,
    RolloutFinalized,
    RolloutSelected,
)
from ledger.schema import EVENTS, PROJ_ATTEMPTS, PROJ_CALLS, PROJ_CHECKPOINTS, PROJ_ROLLOUTS
from ledger.store import EventStore, StoredEvent
from ledger.upcasting import decode_payload

__all__ = ["PROJECTIONS", "Projection", "catch_up", "projection_marks", "rebuild"]

Handler = Callable[[Connection, StoredEvent, Event], None]


@dataclass(frozen=True)
class Projection:
    """A table kept by folding events of the types it handles."""

    name: str
    table: Table
    handlers: Mapping[str, Handler]


# -- attempts ------------------------------------------------------------------------------------


def _attempt_opened(conn: Connection, stored: StoredEvent, event: AttemptOpened) -> None:
    conn.execute(
        insert(PROJ_ATTEMPTS).values(
            capture_key=stored.stream_id,
            rollout_id=event.rollout_id,
            prompt_group=event.prompt_group,
            rollout_index=event.rollout_index,
            policy_version=event.policy_version,
            forest_mode=event.forest_mode,
            selection_policy=event.selection_policy,
            admissions_closed=False,
            settled=False,
            settle_timed_out=False,
            cleaned=False,
            opened_position=stored.position,
        )
    )


def _attempt_update(**values: object) -> Handler:
    def handler(conn: Connection, stored: StoredEvent, event: Event) -> None:
        resolved = {k: (v(event) if callable(v) else v) for k, v in values.items()}
        conn.execute(
            update(PROJ_ATTEMPTS)
            .where(PROJ_ATTEMPTS.c.capture_key == stored.stream_id)
            .values(**resolved)
        )

    return handler


# -- calls ---------------------------------------------------------------------------------------


def _call_key(stored: StoredEvent, call_id: str) -> ColumnElement[bool]:
    return (PROJ_CALLS.c.capture_key == stored.stream_id) & (PROJ_CALLS.c.call_id == call_id)


def _call_intended(conn: Connection, stored: StoredEvent, event: CallIntended) -> None:
    conn.execute(
        insert(PROJ_CALLS).values(
            capture_key=stored.stream_id,
            call_id=event.call_id,
            parent_call_id=event.parent_call_id,
            decision=event.decision,
            root_reason=event.root_reason,
            status="pending",
            late=False,
            prompt_tokens=event.prompt_tokens,
            intended_position=stored.position,
            policy_version=event.policy_version,
        )
    )


def _settled_before(conn: Connection, stored: StoredEvent) -> bool:
    query = select(EVENTS.c.position).where(
        EVENTS.c.stream_id == stored.stream_id,
        EVENTS.c.event_type == AttemptSettled.type,
        EVENTS.c.stream_version < stored.stream_version,
    )
    return conn.execute(query.limit(1)).first() is not None


def _call_committed(conn: Connection, stored: StoredEvent, event: CallCommitted) -> None:
    # The generation's policy version replaces the one intended; a commit that does not say
    # (an engine that does not know, an older event) keeps the intended one.
    version = {} if event.policy_version is None else {"policy_version": event.policy_version}
    conn.execute(
        update(PROJ_CALLS)
        .where(_call_key(stored, event.call_id))
        .values(
            **version,
            status="committed",
            late=_settled_before(conn, stored),
            prev_len=event.prev_len,
            delta_len=event.delta_len,
            cum_len=event.cum_len,
            generated_len=event.generated_len,
            blob_key=event.blob_key,
            blob_sha256=event.blob_sha256,
            blob_bytes=event.blob_bytes,
            finish_reason=event.finish_reason,
            response_id=event.response_id,
            resolved_position=stored.position,
        )
    )


def _call_failed(conn: Connection, stored: StoredEvent, event: CallFailed) -> None:
    # A failure recorded after a commit (e.g. the request ended after the blob was acknowledged)
    # keeps the call committed; the reason is still shown.
    key = _call_key(stored, event.call_id)
    conn.execute(
        update(PROJ_CALLS)
        .where(key)
        .values(failure_reason=event.reason, failure_detail=event.detail)
    )
    conn.execute(
        update(PROJ_CALLS)
        .where(key, PROJ_CALLS.c.status == "pending")
        .values(status="failed", resolved_position=stored.position)
    )


def _calls_selected(conn: Connection, stored: StoredEvent, event: RolloutSelected) -> None:
    conn.execute(
        update(PROJ_CALLS)
        .where(PROJ_CALLS.c.capture_key == stored.stream_id)
        .values(selection_index=None)
    )
    for index, call_id in enumerate(event.call_ids):
        conn.execute(
            update(PROJ_CALLS).where(_call_key(stored, call_id)).values(selection_index=index)
        )


# -- rollouts ------------------------------------------------------------------------------------


def _rollout_selected(conn: Connection, stored: StoredEvent, event: RolloutSelected) -> None:
    opened = conn.execute(
        select(EVENTS.c.payload, EVENTS.c.schema_version).where(
            EVENTS.c.stream_id == stored.stream_id, EVENTS.c.event_type == AttemptOpened.type
        )
    ).first()
    if opened is None:
        return  # a selection without an attempt is refused upstream; nothing to project
    attempt = decode_payload(AttemptOpened.type, opened.schema_version, opened.payload)
    assert isinstance(attempt, AttemptOpened)
    conn.execute(delete(PROJ_ROLLOUTS).where(PROJ_ROLLOUTS.c.capture_key == stored.stream_id))
    conn.execute(
        insert(PROJ_ROLLOUTS).values(
            capture_key=stored.stream_id,
            rollout_id=attempt.rollout_id,
            prompt_group=attempt.prompt_group,
            policy=event.policy,
            reward=event.reward,
            terminal_response_id=event.terminal_response_id,
            selected_calls=len(event.call_ids),
            status="selected",
            selected_position=stored.position,
        )
    )


def _rollout_finalized(conn: Connection, stored: StoredEvent, event: RolloutFinalized) -> None:
    conn.execute(
        update(PROJ_ROLLOUTS)
        .where(PROJ_ROLLOUTS.c.capture_key == stored.stream_id)
        .values(
            status="trainable" if event.trainable else "masked",
            masked_reason=event.masked_reason,
            rows=len(event.paths),
        )
    )


def _batch_published(conn: Connection, stored: StoredEvent, event: BatchPublished) -> None:
    conn.execute(
        update(PROJ_ROLLOUTS)
        .where(
            PROJ_ROLLOUTS.c.rollout_id.in_(event.rollout_ids),
            PROJ_ROLLOUTS.c.status == "trainable",
        )
        .values(step=event.step)
    )


PROJECTIONS: tuple[Projection, ...] = (
    Projection(
        "attempts",
        PROJ_ATTEMPTS,
        {
            AttemptOpened.type: _attempt_opened,
            AdmissionsClosed.type: _attempt_update(admissions_closed=True),
            AttemptSettled.type: _attempt_update(
                settled=True, settle_timed_out=lambda e: e.timed_out
            ),
            AttemptCleaned.type: _attempt_update(cleaned=True),
        },
    ),
    Projection(
        "calls",
        PROJ_CALLS,
        {
            CallIntended.type: _call_intended,
            CallCommitted.type: _call_committed,
            CallFailed.type: _call_failed,
            RolloutSelected.type: _calls_selected,
        },
    ),
    Projection(
        "rollouts",
        PROJ_ROLLOUTS,
        {
            RolloutSelected.type: _rollout_selected,
            RolloutFinalized.type: _rollout_finalized,
            BatchPublished.type: _batch_published,
        },
    ),
)

# -- running -------------------------------------------------------------------------------------


def _mark_row(conn: Connection, name: str) -> LedgerPosition:
    row = conn.execute(
        select(PROJ_CHECKPOINTS).where(PROJ_CHECKPOINTS.c.projection == name)
    ).first()
    if row is None:
        return LedgerPosition(position=0)
    return LedgerPosition(transaction_id=row.transaction_id, position=row.position)


def projection_marks(store: EventStore) -> dict[str, LedgerPosition]:
    """Each projection's checkpoint: the last event it has folded."""
    with translate_errors(store.url), store.engine.connect() as conn:
        return {p.name: _mark_row(conn, p.name) for p in PROJECTIONS}


def _ensure_checkpoints(conn: Connection) -> None:
    dialect_insert = postgres_insert if conn.dialect.name == "postgresql" else sqlite_insert
    rows = [{"projection": p.name, "transaction_id": None, "position": 0} for p in PROJECTIONS]
    conn.execute(dialect_insert(PROJ_CHECKPOINTS).on_conflict_do_nothing(), rows)


def _claim(conn: Connection, name: str, old: LedgerPosition, new: LedgerPosition) -> bool:
    """Move the checkpoint from ``old`` to ``new`` first thing in the fold transaction.

    The UPDATE row-locks the checkpoint on PostgreSQL (SQLite's write lock does the same), so a
    concurrent runner waits, then finds the checkpoint moved and folds nothing.
    """
    result = conn.execute(
        update(PROJ_CHECKPOINTS)
        .where(
            PROJ_CHECKPOINTS.c.projection == name,
            PROJ_CHECKPOINTS.c.position == old.position,
            PROJ_CHECKPOINTS.c.transaction_id.is_not_distinct_from(old.transaction_id),
        )
        .values(transaction_id=new.transaction_id, position=new.position)
    )
    return result.rowcount == 1


class _CheckpointMoved(Exception):
    """Raised inside a fold transaction to roll it back when another runner got there first."""


def catch_up(
    store: EventStore, batch_size: int = 1000, wait_s: float = 5.0
) -> dict[str, LedgerPosition]:
    """Fold every committed event not yet folded into each projection; returns the new marks.

    Waits up to ``wait_s`` for events held behind the reader's horizon (``wait_for_horizon``),
    so the projections reflect everything committed before the call.
    """
    store.wait_for_horizon(wait_s)
    marks = {}
    with translate_errors(store.url):
        with store.engine.begin() as conn:
            _ensure_checkpoints(conn)
        for projection in PROJECTIONS:
            while True:
                with store.engine.connect() as conn:
                    mark = _mark_row(conn, projection.name)
                batch = store.read_after(mark, batch_size)
                if not batch.events:
                    break
                try:
                    with store.engine.begin() as conn:
                        if not _claim(conn, projection.name, mark, batch.mark):
                            raise _CheckpointMoved
                        for stored in batch.events:
                            handler = projection.handlers.get(stored.event_type)
                            if handler is not None:
                                handler(conn, stored, stored.decode())
                except _CheckpointMoved:
                    continue  # another runner folded these events first; nothing is kept
            marks[projection.name] = mark
    return marks


def rebuild(
    store: EventStore, batch_size: int = 1000, wait_s: float = 5.0
) -> dict[str, LedgerPosition]:
    """Empty every projection and fold the whole ledger again from position 0."""
    with translate_errors(store.url), store.engine.begin() as conn:
        for projection in PROJECTIONS:
            conn.execute(delete(projection.table))
        conn.execute(delete(PROJ_CHECKPOINTS))
    return catch_up(store, batch_size, wait_s)
