"""One statement per event type that applies the event to the projection tables.

An ``Applier`` takes one event (``Folded``: the event and where it landed) and applies it to
``grove_proj_attempts``, ``grove_proj_calls`` or ``grove_proj_rollouts`` with one small indexed
statement, only when the rows allow it under the attempt's lifecycle rules
(``grove.ledger.lifecycle``): an opening inserts the attempt's row (with a fork's source) unless it
exists, an intent inserts the call's row (with the attempt that owns its parent, when another) from
the attempt's (no attempt, no call), a commit moves a pending call with the same parent to
committed (``late`` when the attempt had settled), a failure records its reason once and fails a
call still pending, a selection inserts the rollout's row only when every call it names is
intended, a finalization resolves a selected rollout, a publication names the step of its trainable
rollouts. The applier answers whether the rows allowed the event: False means nothing changed, and
the inline fold (``ledger/inline_fold.py``) then records the contradiction in the fold's own words.

Every statement is built once (per dialect where the dialect's ``insert`` differs), with bound
parameters, and executed with each event's values: building a statement and its cache key costs
more CPU than running it (``docs/benchmarks.md``, "ledger appends").
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    Boolean,
    Connection,
    Float,
    Integer,
    String,
    Table,
    bindparam,
    case,
    false,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.elements import BindParameter

from grove.ledger.compiled import CompiledStatement
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


# -- attempts ------------------------------------------------------------------------------------


_OPEN_COLUMNS = (
    "rollout_id",
    "prompt_group",
    "rollout_index",
    "policy_version",
    "forest_mode",
    "selection_policy",
)


# A fork's source (``attempt.opened.fork_from``): NULL unless the attempt is a fork.
_FORK_COLUMNS = ("fork_source_capture_key", "fork_source_call_id")


def _open_statement(dialect_insert: DialectInsert) -> Insert:
    values = {
        name: bindparam(f"p_{name}", type_=PROJ_ATTEMPTS.c[name].type)
        for name in (*_OPEN_COLUMNS, *_FORK_COLUMNS)
    }
    return (
        dialect_insert(PROJ_ATTEMPTS)
        .values(
            capture_key=bindparam("p_key", type_=String),
            **values,
            admissions_closed=False,
            settled=False,
            settle_timed_out=False,
            cleaned=False,
            opened_position=bindparam("p_position", type_=BigInteger),
        )
        .on_conflict_do_nothing()
        .returning(*PROJ_ATTEMPTS.primary_key)
    )


_OPEN = {
    "postgresql": CompiledStatement(_open_statement(postgres_insert)),
    "sqlite": CompiledStatement(_open_statement(sqlite_insert)),
}


def _open_parameters(item: Folded, event: AttemptOpened) -> dict[str, object]:
    """The opening statement's parameters for ``event``, the ``attempt.opened`` of ``item``."""
    parameters = {f"p_{name}": getattr(event, name) for name in _OPEN_COLUMNS}
    fork = event.fork_from
    parameters.update(
        p_key=item.stream_id,
        p_position=item.position,
        p_fork_source_capture_key=None if fork is None else fork.source_capture_key,
        p_fork_source_call_id=None if fork is None else fork.source_call_id,
    )
    return parameters


def _opened(conn: Connection, item: Folded, event: AttemptOpened) -> bool:
    parameters = _open_parameters(item, event)
    return _OPEN[conn.dialect.name].execute(conn, parameters).first() is not None


def _attempt_update(**values: object) -> Update:
    """The update of attempt ``:p_key``'s row to ``values``."""
    return (
        update(PROJ_ATTEMPTS)
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_key", type_=String))
        .values(**values)
    )


_CLOSE = CompiledStatement(_attempt_update(admissions_closed=True))
_SETTLE = CompiledStatement(
    _attempt_update(
        settled=True,
        admissions_closed=True,
        settle_timed_out=bindparam("p_timed_out", type_=Boolean),
    )
)
_CLEAN = CompiledStatement(_attempt_update(cleaned=True))


def _closed(conn: Connection, item: Folded) -> bool:
    return _CLOSE.execute(conn, {"p_key": item.stream_id}).rowcount == 1


def _settled(conn: Connection, item: Folded, event: AttemptSettled) -> bool:
    parameters = {"p_key": item.stream_id, "p_timed_out": event.timed_out}
    return _SETTLE.execute(conn, parameters).rowcount == 1


def _cleaned(conn: Connection, item: Folded) -> bool:
    # Keys of an attempt never opened may be cleaned too: nothing to show, nothing contradicted.
    _CLEAN.execute(conn, {"p_key": item.stream_id})
    return True


# -- calls ---------------------------------------------------------------------------------------


_INTENT_COLUMNS = (
    "call_id",
    "parent_call_id",
    "decision",
    "root_reason",
    "prompt_tokens",
    "intended_position",
    "policy_version",
    "source_capture_key",  # the intent's: the commit must name the same (``ledger/attempt.py``)
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
    "postgresql": CompiledStatement(_intent_statement(postgres_insert)),
    "sqlite": CompiledStatement(_intent_statement(sqlite_insert)),
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
        "p_source_capture_key": event.source_capture_key,
    }
    return _INTENT[conn.dialect.name].execute(conn, parameters).first() is not None


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
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_key", type_=String))
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


_COMMIT = CompiledStatement(_commit_statement())


def _committed(conn: Connection, item: Folded, event: CallCommitted) -> bool:
    parameters = {f"p_{name}": getattr(event, name) for name in _COMMIT_COLUMNS}
    parameters.update(
        p_key=item.stream_id,
        p_call_id=event.call_id,
        p_parent=event.parent_call_id,
        p_policy_version=event.policy_version,
        p_position=item.position,
    )
    return _COMMIT.execute(conn, parameters).rowcount == 1


def _fail_statement() -> Update:
    # A failure recorded after a commit (the request ended after the blob was acknowledged, say)
    # keeps the call committed; the reason is still shown.
    pending = PROJ_CALLS.c.status == "pending"
    position = bindparam("p_position", type_=BigInteger)
    return (
        update(PROJ_CALLS)
        .where(
            PROJ_CALLS.c.capture_key == bindparam("p_key", type_=String),
            PROJ_CALLS.c.call_id == bindparam("p_call_id", type_=String),
            PROJ_CALLS.c.failure_reason.is_(None),
        )
        .values(
            failure_reason=bindparam("p_reason", type_=String),
            failure_detail=bindparam("p_detail", type_=String),
            status=case((pending, "failed"), else_=PROJ_CALLS.c.status),
            resolved_position=case((pending, position), else_=PROJ_CALLS.c.resolved_position),
        )
    )


_FAIL = CompiledStatement(_fail_statement())


def _failed(conn: Connection, item: Folded, event: CallFailed) -> bool:
    parameters = {
        "p_key": item.stream_id,
        "p_call_id": event.call_id,
        "p_reason": event.reason,
        "p_detail": event.detail,
        "p_position": item.position,
    }
    return _FAIL.execute(conn, parameters).rowcount == 1


# -- rollouts ------------------------------------------------------------------------------------


_SELECTION_VALUES = {
    "policy": String,
    "reward": Float,
    "terminal_response_id": String,
    "selected_calls": Integer,
    "status": String,
    "selected_position": BigInteger,
}


def _select_statement(dialect_insert: DialectInsert, count: int) -> Insert:
    # Only when every call it names is intended: as many intended calls among the ``count``
    # distinct calls it names (``:p_call_0`` ...) as it names (none named, none counted).
    named = [bindparam(f"p_call_{index}", type_=String) for index in range(count)]
    intended = (
        select(func.count())
        .select_from(PROJ_CALLS)
        .where(
            PROJ_CALLS.c.capture_key == bindparam("p_key", type_=String),
            PROJ_CALLS.c.call_id.in_(named) if named else false(),
        )
        .scalar_subquery()
    )
    values: list[BindParameter[Any]] = [
        bindparam(f"p_{name}", type_=kind) for name, kind in _SELECTION_VALUES.items()
    ]
    source = select(
        PROJ_ATTEMPTS.c.capture_key,
        PROJ_ATTEMPTS.c.rollout_id,
        PROJ_ATTEMPTS.c.prompt_group,
        *values,
    ).where(
        PROJ_ATTEMPTS.c.capture_key == bindparam("p_key", type_=String),
        intended == bindparam("p_distinct", type_=Integer),
    )
    columns = ["capture_key", "rollout_id", "prompt_group", *_SELECTION_VALUES]
    return (
        dialect_insert(PROJ_ROLLOUTS)
        .from_select(columns, source)
        .on_conflict_do_nothing()
        .returning(*PROJ_ROLLOUTS.primary_key)
    )


@functools.lru_cache(maxsize=256)
def _select(dialect: str, count: int) -> CompiledStatement:
    """The selection's statement for ``count`` distinct calls named (one per count: the calls
    are parameters, so their number shapes the statement)."""
    dialect_insert = postgres_insert if dialect == "postgresql" else sqlite_insert
    return CompiledStatement(_select_statement(dialect_insert, count))


# One row per call named, executed as one batch; a call named twice keeps its last index.
_INDEX = CompiledStatement(
    update(PROJ_CALLS)
    .where(
        PROJ_CALLS.c.capture_key == bindparam("p_key", type_=String),
        PROJ_CALLS.c.call_id == bindparam("p_call_id", type_=String),
    )
    .values(selection_index=bindparam("p_index", type_=Integer))
)


def _selected(conn: Connection, item: Folded, event: RolloutSelected) -> bool:
    wanted = sorted(set(event.call_ids))
    parameters = {
        "p_key": item.stream_id,
        **{f"p_call_{index}": call_id for index, call_id in enumerate(wanted)},
        "p_distinct": len(wanted),
        "p_policy": event.policy,
        "p_reward": event.reward,
        "p_terminal_response_id": event.terminal_response_id,
        "p_selected_calls": len(event.call_ids),
        "p_status": "selected",
        "p_selected_position": item.position,
    }
    if _select(conn.dialect.name, len(wanted)).execute(conn, parameters).first() is None:
        return False
    indexes = {call_id: index for index, call_id in enumerate(event.call_ids)}
    if indexes:
        rows = [
            {"p_key": item.stream_id, "p_call_id": call_id, "p_index": index}
            for call_id, index in indexes.items()
        ]
        _INDEX.execute_many(conn, rows)
    return True


_FINALIZE = CompiledStatement(
    update(PROJ_ROLLOUTS)
    .where(
        PROJ_ROLLOUTS.c.capture_key == bindparam("p_key", type_=String),
        PROJ_ROLLOUTS.c.status == "selected",
    )
    .values(
        status=bindparam("p_status", type_=String),
        masked_reason=bindparam("p_masked_reason", type_=String),
        rows=bindparam("p_rows", type_=Integer),
    )
)


def _finalized(conn: Connection, item: Folded, event: RolloutFinalized) -> bool:
    parameters = {
        "p_key": item.stream_id,
        "p_status": "trainable" if event.trainable else "masked",
        "p_masked_reason": event.masked_reason,
        "p_rows": len(event.paths),
    }
    return _FINALIZE.execute(conn, parameters).rowcount == 1


_PUBLISH = (
    update(PROJ_ROLLOUTS)
    .where(
        PROJ_ROLLOUTS.c.rollout_id.in_(bindparam("p_rollouts", expanding=True, type_=String)),
        PROJ_ROLLOUTS.c.status == "trainable",
    )
    .values(step=bindparam("p_step", type_=Integer))
)


def _published(conn: Connection, item: Folded, event: BatchPublished) -> bool:
    conn.execute(_PUBLISH, {"p_rollouts": list(event.rollout_ids), "p_step": event.step})
    return True


APPLIERS: dict[str, Applier] = {
    AttemptOpened.type: _typed(AttemptOpened, _opened),
    AdmissionsClosed.type: _closed,
    AttemptSettled.type: _typed(AttemptSettled, _settled),
    AttemptCleaned.type: _cleaned,
    CallIntended.type: _typed(CallIntended, _intended),
    CallCommitted.type: _typed(CallCommitted, _committed),
    CallFailed.type: _typed(CallFailed, _failed),
    RolloutSelected.type: _typed(RolloutSelected, _selected),
    RolloutFinalized.type: _typed(RolloutFinalized, _finalized),
    BatchPublished.type: _typed(BatchPublished, _published),
}
