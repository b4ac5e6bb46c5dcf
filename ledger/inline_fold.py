"""Folding events into the projection tables, inside the transaction that appends them.

``project_appended`` runs in ``EventStore.append``'s transaction, so the lineage views are
current when an append returns (``docs/sql.md``). Each stream's last folded version is kept in
``grove_proj_streams``; an append moves it by compare-and-set from the version just before its
first event and folds its events with one small indexed statement each. When the stream's earlier
events were never folded (a ledger upgraded from before inline projection, imported events, a
rebuild under way), the missing ones are read from the event table and folded first: a stream is
always folded whole and in order, by whichever transaction gets there first.

The rows follow the attempt fold's rules (``grove.ledger.lifecycle.lifecycle_violation``): the first
open, intent, commit, selection and finalization stand, and an event the rules leave out is
recorded in ``grove_proj_contradictions`` with the fold's own words, never raised. Each
statement applies an event only when the rows allow it; when it changes nothing, the rows are
read into ``LifecycleFacts`` and the fold's rule says why (``ledger/contradictions.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, TypeVar

from sqlalchemy import (
    BigInteger,
    Connection,
    Integer,
    String,
    bindparam,
    case,
    func,
    literal,
    select,
    update,
)
from sqlalchemy.dialects.postgresql import insert as postgres_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.sql.dml import Insert, Update

from grove.ledger.append_batch import AppendBatch, Landed
from grove.ledger.contradictions import (
    ContradictionRow,
    contradiction_lines,
    contradiction_row,
    lifecycle_facts,
    record_contradictions,
)
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
from grove.ledger.lifecycle import (
    ATTEMPT_EVENTS,
    NEVER_OPENED,
    lifecycle_violation,
)
from grove.ledger.schema import (
    EVENTS,
    PROJ_ATTEMPTS,
    PROJ_CALLS,
    PROJ_ROLLOUTS,
    PROJ_STREAMS,
)
from grove.ledger.upcasting import decode_payload

__all__ = ["AppendFold", "Folded", "fold_stream"]


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


def _dialect_insert(conn: Connection):
    return postgres_insert if conn.dialect.name == "postgresql" else sqlite_insert


def _inserted(conn: Connection, statement: Insert) -> bool:
    """Whether an ``INSERT … ON CONFLICT DO NOTHING`` wrote its row (PostgreSQL's driver gives
    no row count for it, so the row is returned)."""
    table = statement.table
    return conn.execute(statement.returning(*table.primary_key)).first() is not None


# -- attempts ------------------------------------------------------------------------------------


def _opened(conn: Connection, item: Folded, event: AttemptOpened) -> bool:
    statement = (
        _dialect_insert(conn)(PROJ_ATTEMPTS)
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


def _call_key(item: Folded, call_id: str):
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


def _intent_statement(dialect_insert) -> Insert:
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
        _dialect_insert(conn)(PROJ_ROLLOUTS).from_select(columns, source).on_conflict_do_nothing()
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

# -- folding --------------------------------------------------------------------------------------


def _text_safe(item: Folded) -> Folded:
    """``item`` with U+0000 in its event's strings replaced by U+FFFD: PostgreSQL's text columns
    cannot hold it (the event table keeps the exact string, escaped in JSONB)."""
    if item.nul_free:
        return item
    changed: dict[str, object] = {}
    for name, value in item.event:
        if isinstance(value, str) and "\x00" in value:
            changed[name] = value.replace("\x00", "\ufffd")
        elif isinstance(value, tuple) and any(isinstance(v, str) and "\x00" in v for v in value):
            changed[name] = tuple(
                v.replace("\x00", "\ufffd") if isinstance(v, str) else v for v in value
            )
    if not changed:
        return item
    return Folded(
        item.stream_id, item.stream_version, item.position, item.event.model_copy(update=changed)
    )


def _fold(conn: Connection, items: Sequence[Folded], opened: bool | None = None) -> None:
    """Apply one stream's events in order; record those the rules leave out, in one insert.

    Once the stream is known not to be an opened attempt (``opened`` False: the caller read it
    already), its attempt events are contradictions without another statement (a stream of
    other events costs at most one read, not one per event).
    """
    contradictions: list[ContradictionRow] = []
    never_opened = opened is False
    if conn.dialect.name == "postgresql" and not all(item.nul_free for item in items):
        items = [_text_safe(item) for item in items]
    for item in items:
        event = item.event
        if never_opened and isinstance(event, ATTEMPT_EVENTS):
            contradictions.append(contradiction_row(item, NEVER_OPENED))
            continue
        apply = APPLIERS.get(event.type)
        if apply is None or apply(conn, item):
            never_opened = never_opened and not isinstance(event, AttemptOpened)
            continue
        facts = lifecycle_facts(conn, item)
        never_opened = not facts.opened
        contradictions.append(contradiction_row(item, lifecycle_violation(facts, event)))
    record_contradictions(conn, contradictions)


# -- streams -------------------------------------------------------------------------------------


def fold_stream(conn: Connection, stream_id: str, known: Sequence[Folded] = ()) -> None:
    """Fold the stream's events not folded yet, up to its last event visible in ``conn``'s
    transaction, taking ``known`` (read already, in version order) instead of reading them."""
    conn.execute(
        _dialect_insert(conn)(PROJ_STREAMS)
        .values(stream_id=stream_id, version=0)
        .on_conflict_do_nothing()
    )
    mark = select(PROJ_STREAMS.c.version).where(PROJ_STREAMS.c.stream_id == stream_id)
    if conn.dialect.name == "postgresql":
        mark = mark.with_for_update()
    folded = conn.execute(mark).scalar_one()
    pending = [item for item in known if item.stream_version > folded]
    if known and not pending:
        return  # another transaction folded them first
    first_known = pending[0].stream_version if pending else None
    query = (
        select(EVENTS)
        .where(EVENTS.c.stream_id == stream_id, EVENTS.c.stream_version > folded)
        .order_by(EVENTS.c.stream_version)
    )
    if first_known is not None:
        query = query.where(EVENTS.c.stream_version < first_known)
    read = [
        Folded(
            stream_id,
            row.stream_version,
            row.position,
            decode_payload(row.event_type, row.schema_version, row.payload),
        )
        for row in conn.execute(query)
    ]
    items = read + pending
    if not items:
        return
    _fold(conn, items)
    conn.execute(
        update(PROJ_STREAMS)
        .where(PROJ_STREAMS.c.stream_id == stream_id)
        .values(version=items[-1].stream_version)
    )


def _claim_new(dialect_insert) -> Insert:
    return (
        dialect_insert(PROJ_STREAMS)
        .values(stream_id=bindparam("p_stream"), version=bindparam("p_last"))
        .on_conflict_do_nothing()
        .returning(PROJ_STREAMS.c.stream_id)
    )


# A stream's first append claims it by inserting its mark (no attempt of it can be open yet);
# a later one by moving the mark on from the version just before its first event, reading in
# the same statement whether its attempt is open.
_CLAIM_NEW = {"postgresql": _claim_new(postgres_insert), "sqlite": _claim_new(sqlite_insert)}
_CLAIM_NEXT = (
    update(PROJ_STREAMS)
    .where(
        PROJ_STREAMS.c.stream_id == bindparam("p_stream"),
        PROJ_STREAMS.c.version == bindparam("p_first"),
    )
    .values(version=bindparam("p_last"))
    .returning(
        select(PROJ_ATTEMPTS.c.capture_key)
        .where(PROJ_ATTEMPTS.c.capture_key == bindparam("p_stream"))
        .exists()
        .label("opened")
    )
)


def _claim(conn: Connection, stream_id: str, first: int, last: int) -> tuple[bool, bool]:
    """Claim the fold of the stream's versions ``first`` to ``last``: whether it was claimed (the
    stream was folded up to ``first - 1``), and whether its attempt is open."""
    parameters = {"p_stream": stream_id, "p_first": first - 1, "p_last": last}
    if first == 1:
        return conn.execute(_CLAIM_NEW[conn.dialect.name], parameters).first() is not None, False
    row = conn.execute(_CLAIM_NEXT, parameters).first()
    return row is not None, row is not None and bool(row.opened)


class AppendFold:
    """The inline fold of one append (one stream's events, in version order), in the append's
    transaction. A ``COPY`` append calls ``stage`` while the server still writes its rows: it
    pairs each event with where it landed and, when the events are all an attempt's and open
    none, builds their contradiction rows as if the stream were never opened (the usual case of
    such an append), with no statement. ``apply`` then claims the stream and records those rows
    when the claim confirms it; otherwise it folds the events one by one, as without staging."""

    def __init__(self, batch: AppendBatch, dialect: str) -> None:
        self.batch, self.stream_id, self.dialect = batch, batch.stream_id, dialect
        self.items: list[Folded] = []
        self.unopened: list[ContradictionRow] | None = None
        self.unopened_lines: str | None = None

    def _pair(self, landed: Sequence[Landed]) -> None:
        self.items = [
            Folded(
                self.stream_id,
                slot.stream_version,
                slot.position,
                row.event,
                nul_free="\\u0000" not in row.payload,  # json writes U+0000 as this escape
            )
            for row, slot in zip(self.batch.rows(), landed, strict=True)
        ]

    def stage(self, landed: Sequence[Landed]) -> None:
        """Build what needs no statement (``landed``: where each event landed, in order)."""
        self._pair(landed)
        if all(isinstance(item.event, ATTEMPT_EVENTS) for item in self.items):
            safe = self.items if self.dialect != "postgresql" else map(_text_safe, self.items)
            self.unopened = [contradiction_row(item, NEVER_OPENED) for item in safe]
            self.unopened_lines = contradiction_lines(self.unopened, self.dialect)

    def apply(self, conn: Connection, landed: Sequence[Landed]) -> None:
        """Fold the events (``landed`` as for ``stage``, when it was not called)."""
        if not self.items:
            self._pair(landed)
        items = self.items
        claimed, opened = _claim(
            conn, self.stream_id, items[0].stream_version, items[-1].stream_version
        )
        if not claimed:
            fold_stream(conn, self.stream_id, items)
        elif not opened and self.unopened is not None:
            record_contradictions(conn, self.unopened, self.unopened_lines)
        else:
            _fold(conn, items, opened)
