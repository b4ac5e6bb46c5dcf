"""One statement per event type that applies the event to the projection tables.

An ``Applier`` takes one event (``Folded``: the event and where it landed) and applies it to
``grove_proj_attempts``, ``grove_proj_calls`` or ``grove_proj_rollouts`` with one small indexed
statement, only when the rows allow it under the attempt's lifecycle rules
(``grove.ledger.lifecycle``): an opening inserts the attempt's row unless it exists, an intent
inserts the call's row from the attempt's (no attempt, no call), a commit moves a pending call
with the same parent to committed (``late`` when the attempt had settled), a failure records its
reason once and fails a call still pending, a selection inserts the rollout's row only when every
call it names is intended, a finalization resolves a selected rollout, a publication names the
step of its trainable rollouts. The applier answers whether the rows allowed the event: False
means nothing changed, and the inline fold (``ledger/inline_fold.py``) then records the
contradiction in the fold's own words.

The statements run on every call of the capture path, so those of intents and commits are built
once per dialect, with bound parameters, rather than per event.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    String,
    Table,
    bindparam,
    case,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import ColumnElement

from grove.ledger.errors import InvalidEventPayload
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptCleaned,
    AttemptOpened,
    AttemptSettled,
    BatchPublished,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)
from grove.ledger.schema import PROJ_ATTEMPTS, PROJ_CALLS, PROJ_ROLLOUTS

__all__ = ["APPLIERS", "Applier", "DialectInsert", "Folded", "dialect_insert"]

DialectInsert = Callable[[Table], postgresql.Insert | sqlite.Insert]
"""A dialect's ``insert``: both take ``on_conflict_do_nothing``."""


class Folded(NamedTuple):
    """One event to fold, with where it landed; ``nul_free`` when its strings are known to hold
    no U+0000 (the appending store checked its JSON), which spares the fold looking. (A tuple:
    a batched append builds one per event.)"""

    stream_id: str
    stream_version: int
    position: int
    event: Event
    nul_free: bool = False


Applier = Callable[[Connection, Folded], bool]
"""Applies an event to the rows; False when the rows did not allow it (nothing changed)."""

E = TypeVar("E", bound=Event)


def _typed(kind: type[E], apply: Callable[[Connection, Folded, E], bool]) -> Applier:
    """``apply`` as an ``Applier`` for events of ``kind``; any other event is refused."""

    def checked(conn: Connection, item: Folded) -> bool:
        event = item.event
        if not isinstance(event, kind):
            raise InvalidEventPayload(
                event.type, event.schema_version, f"folded as {kind.type}, which it is not"
            )
        return apply(conn, item, event)

    return checked


def dialect_insert(conn: Connection) -> DialectInsert:
    """The ``insert`` of ``conn``'s dialect (both take ``on_conflict_do_nothing``)."""
    return postgres_insert if conn.dialect.name == "postgresql" else sqlite_insert


def _inserted(conn: Connection, statement: Insert) -> bool:
    """Whether an ``INSERT … ON CONFLICT DO NOTHING`` wrote its row (PostgreSQL's driver gives
    no row count for it, so the row is returned)."""
    table = statement.table
    return conn.execute(statement.returning(*table.primary_key)).first() is not None


# -- attempts ------------------------------------------------------------------------------------


def _opened(conn: Connection, item: Folded, event: AttemptOpened) -> bool:
    statement = (
        dialect_insert(conn)(PROJ_ATTEMPTS)
        .values(
            capture_key=item.stream_id,
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
            opened_position=item.position,
        )
        .on_conflict_do_nothing()
    )
    return _inserted(conn, statement)


def _attempt_update(values: Callable[[Event], dict[str, object]]) -> Applier:
    def apply(conn: Connection, item: Folded) -> bool:
        statement = (
            update(PROJ_ATTEMPTS)
            .where(PROJ_ATTEMPTS.c.capture_key == item.stream_id)
            .values(**values(item.event))
        )
        return conn.execute(statement).rowcount == 1

    return apply


def _settled(conn: Connection, item: Folded, event: AttemptSettled) -> bool:
    values: dict[str, object] = {
        "settled": True,
        "admissions_closed": True,
        "settle_timed_out": event.timed_out,
    }
    return _attempt_update(lambda _: values)(conn, item)


def _cleaned(conn: Connection, item: Folded) -> bool:
    # Keys of an attempt never opened may be cleaned too: nothing to show, nothing contradicted.
    _attempt_update(lambda _: {"cleaned": True})(conn, item)
    return True


# -- calls ---------------------------------------------------------------------------------------


def _call_key(item: Folded, call_id: str) -> ColumnElement[bool]:
    return (PROJ_CALLS.c.capture_key == item.stream_id) & (PROJ_CALLS.c.call_id == call_id)


_INTENT_COLUMNS = (
    "call_id",
    "parent_call_id",
    "decision",
    "root_reason",
    "prompt_tokens",
    "intended_position",
    "policy_version",
)


def _intent_statement(dialect_insert: DialectInsert) -> Insert:
    # Taken from the attempt's row: no row (never opened), no call. Built once: the capture path
    # runs it for every call, and building a statement costs more than running it.
    values = [bindparam(f"p_{name}", type_=PROJ_CALLS.c[name].type) for name in _INTENT_COLUMNS]
    source = select(PROJ_ATTEMPTS.c.capture_key, literal("pending"), literal(False), *values).where(
        PROJ_ATTEMPTS.c.capture_key == bindparam("p_key")
    )
    columns = ["capture_key", "status", "late", *_INTENT_COLUMNS]
    return (
        dialect_insert(PROJ_CALLS)
        .from_select(columns, source)
        .on_conflict_do_nothing()
        .returning(PROJ_CALLS.c.call_id)
    )


_INTENT = {
    "postgresql": _intent_statement(postgres_insert),
    "sqlite": _intent_statement(sqlite_insert),
}


def _intended(conn: Connection, item: Folded, event: CallIntended) -> bool:
    parameters = {
        "p_key": item.stream_id,
        "p_call_id": event.call_id,
        "p_parent_call_id": event.parent_call_id,
        "p_decision": event.decision,
        "p_root_reason": event.root_reason,
        "p_prompt_tokens": event.prompt_tokens,
        "p_intended_position": item.position,
        "p_policy_version": event.policy_version,
    }
    return conn.execute(_INTENT[conn.dialect.name], parameters).first() is not None


_COMMIT_COLUMNS = (
    "prev_len",
    "delta_len",
    "cum_len",
    "generated_len",
    "blob_key",
    "blob_sha256",
    "blob_bytes",
    "finish_reason",
    "response_id",
)


def _commit_statement() -> Update:
    settled = (
        select(PROJ_ATTEMPTS.c.settled)
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_key"))
        .scalar_subquery()
    )
    # The generation's policy version replaces the one intended; a commit that does not say
    # (an engine that does not know, an older event) keeps the intended one.
    version = func.coalesce(
        bindparam("p_policy_version", type_=Integer), PROJ_CALLS.c.policy_version
    )
    values = {
        name: bindparam(f"p_{name}", type_=PROJ_CALLS.c[name].type) for name in _COMMIT_COLUMNS
    }
    return (
        update(PROJ_CALLS)
        .where(
            PROJ_CALLS.c.capture_key == bindparam("p_key"),
            PROJ_CALLS.c.call_id == bindparam("p_call_id"),
            PROJ_CALLS.c.status == "pending",
            PROJ_CALLS.c.parent_call_id.is_not_distinct_from(bindparam("p_parent", type_=String)),
        )
        .values(
            **values,
            policy_version=version,
            status="committed",
            late=settled,
            resolved_position=bindparam("p_position", type_=BigInteger),
        )
    )


_COMMIT = _commit_statement()


def _committed(conn: Connection, item: Folded, event: CallCommitted) -> bool:
    parameters = {f"p_{name}": getattr(event, name) for name in _COMMIT_COLUMNS}
    parameters.update(
        p_key=item.stream_id,
        p_call_id=event.call_id,
        p_parent=event.parent_call_id,
        p_policy_version=event.policy_version,
        p_position=item.position,
    )
    return conn.execute(_COMMIT, parameters).rowcount == 1


def _failed(conn: Connection, item: Folded, event: CallFailed) -> bool:
    # A failure recorded after a commit (the request ended after the blob was acknowledged, say)
    # keeps the call committed; the reason is still shown.
    pending = PROJ_CALLS.c.status == "pending"
    statement = (
        update(PROJ_CALLS)
        .where(_call_key(item, event.call_id), PROJ_CALLS.c.failure_reason.is_(None))
        .values(
            failure_reason=event.reason,
            failure_detail=event.detail,
            status=case((pending, "failed"), else_=PROJ_CALLS.c.status),
            resolved_position=case((pending, item.position), else_=PROJ_CALLS.c.resolved_position),
        )
    )
    return conn.execute(statement).rowcount == 1


# -- rollouts ------------------------------------------------------------------------------------


def _selected(conn: Connection, item: Folded, event: RolloutSelected) -> bool:
    source = select(
        PROJ_ATTEMPTS.c.capture_key,
        PROJ_ATTEMPTS.c.rollout_id,
        PROJ_ATTEMPTS.c.prompt_group,
        literal(event.policy),
        literal(event.reward),
        literal(event.terminal_response_id),
        literal(len(event.call_ids)),
        literal("selected"),
        literal(item.position),
    ).where(PROJ_ATTEMPTS.c.capture_key == item.stream_id)
    wanted = set(event.call_ids)
    if wanted:  # every call it names is intended
        intended = (
            select(func.count())
            .select_from(PROJ_CALLS)
            .where(PROJ_CALLS.c.capture_key == item.stream_id, PROJ_CALLS.c.call_id.in_(wanted))
            .scalar_subquery()
        )
        source = source.where(intended == len(wanted))
    columns = [
        "capture_key",
        "rollout_id",
        "prompt_group",
        "policy",
        "reward",
        "terminal_response_id",
        "selected_calls",
        "status",
        "selected_position",
    ]
    statement = (
        dialect_insert(conn)(PROJ_ROLLOUTS).from_select(columns, source).on_conflict_do_nothing()
    )
    if not _inserted(conn, statement):
        return False
    indexes = {call_id: index for index, call_id in enumerate(event.call_ids)}
    if indexes:
        conn.execute(
            update(PROJ_CALLS)
            .where(
                PROJ_CALLS.c.capture_key == item.stream_id,
                PROJ_CALLS.c.call_id.in_(list(indexes)),
            )
            .values(selection_index=case(indexes, value=PROJ_CALLS.c.call_id))
        )
    return True


def _finalized(conn: Connection, item: Folded, event: RolloutFinalized) -> bool:
    statement = (
        update(PROJ_ROLLOUTS)
        .where(PROJ_ROLLOUTS.c.capture_key == item.stream_id, PROJ_ROLLOUTS.c.status == "selected")
        .values(
            status="trainable" if event.trainable else "masked",
            masked_reason=event.masked_reason,
            rows=len(event.paths),
        )
    )
    return conn.execute(statement).rowcount == 1


def _published(conn: Connection, item: Folded, event: BatchPublished) -> bool:
    conn.execute(
        update(PROJ_ROLLOUTS)
        .where(
            PROJ_ROLLOUTS.c.rollout_id.in_(event.rollout_ids),
            PROJ_ROLLOUTS.c.status == "trainable",
        )
        .values(step=event.step)
    )
    return True


APPLIERS: dict[str, Applier] = {
    AttemptOpened.type: _typed(AttemptOpened, _opened),
    AdmissionsClosed.type: _attempt_update(lambda _: {"admissions_closed": True}),
    AttemptSettled.type: _typed(AttemptSettled, _settled),
    AttemptCleaned.type: _cleaned,
    CallIntended.type: _typed(CallIntended, _intended),
    CallCommitted.type: _typed(CallCommitted, _committed),
    CallFailed.type: _typed(CallFailed, _failed),
    RolloutSelected.type: _typed(RolloutSelected, _selected),
    RolloutFinalized.type: _typed(RolloutFinalized, _finalized),
    BatchPublished.type: _typed(BatchPublished, _published),
}
