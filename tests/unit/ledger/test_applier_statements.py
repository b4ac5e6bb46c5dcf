"""The inline fold's statements are built once and executed with each event's values: a second
attempt runs the very SQL of the first, and every value still lands in its own attempt's rows."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Connection, event, select

from grove.ledger import migrate
from grove.ledger.events import AttemptCleaned, BatchPublished, LedgerPosition
from grove.ledger.schema import PROJ_ATTEMPTS, PROJ_CALLS, PROJ_ROLLOUTS
from grove.ledger.store import EventStore
from tests.integration.ledger.scenario import compaction_rollout


@pytest.fixture
def store(database_url: str) -> Iterator[EventStore]:
    """An event store that folds inline, on a migrated test database."""
    migrate.upgrade(database_url)
    opened = EventStore.open(database_url)
    try:
        yield opened
    finally:
        opened.close()


def record(store: EventStore, capture_key: str, rollout_id: str, group: str) -> list[str]:
    """Append the compaction rollout one event per append (as the capture path does); the SQL
    the appends sent to the driver, in order."""
    executed: list[str] = []

    def remember(conn: Connection, cursor: object, statement: str, *args: object) -> None:
        executed.append(statement)

    event.listen(store.engine, "before_cursor_execute", remember)
    try:
        for index, item in enumerate(
            compaction_rollout(capture_key, rollout_id=rollout_id, group=group)
        ):
            store.append(capture_key, [item], expected_version=index)
    finally:
        event.remove(store.engine, "before_cursor_execute", remember)
    return executed


def test_a_second_attempt_executes_the_very_statements_of_the_first(store: EventStore) -> None:
    first = record(store, "att-1", "r1", "g1")
    second = record(store, "att-2", "r2", "g2")

    assert len(first) >= 2 * len(compaction_rollout("att-1"))  # the append and the fold each
    assert second == first
    assert not any("att-" in statement for statement in first)  # values travel as parameters


def test_each_attempt_rows_hold_its_own_events_values(store: EventStore) -> None:
    record(store, "att-1", "r1", "g1")
    record(store, "att-2", "r2", "g2")
    store.append("att-1", [AttemptCleaned(keys=("att-1",))], expected_version=19)
    store.append(
        "training",
        [
            BatchPublished(
                step=4,
                rollout_ids=("r2",),
                row_ids=("row-0",),
                ledger_position=LedgerPosition(position=0),
            )
        ],
    )

    attempts = select(
        PROJ_ATTEMPTS.c.capture_key,
        PROJ_ATTEMPTS.c.rollout_id,
        PROJ_ATTEMPTS.c.prompt_group,
        PROJ_ATTEMPTS.c.opened_position,
        PROJ_ATTEMPTS.c.admissions_closed,
        PROJ_ATTEMPTS.c.settled,
        PROJ_ATTEMPTS.c.settle_timed_out,
        PROJ_ATTEMPTS.c.cleaned,
    ).order_by(PROJ_ATTEMPTS.c.capture_key)
    rollouts = select(
        PROJ_ROLLOUTS.c.capture_key,
        PROJ_ROLLOUTS.c.rollout_id,
        PROJ_ROLLOUTS.c.prompt_group,
        PROJ_ROLLOUTS.c.policy,
        PROJ_ROLLOUTS.c.reward,
        PROJ_ROLLOUTS.c.terminal_response_id,
        PROJ_ROLLOUTS.c.selected_calls,
        PROJ_ROLLOUTS.c.status,
        PROJ_ROLLOUTS.c.rows,
        PROJ_ROLLOUTS.c.step,
        PROJ_ROLLOUTS.c.selected_position,
    ).order_by(PROJ_ROLLOUTS.c.capture_key)
    failed = select(
        PROJ_CALLS.c.capture_key,
        PROJ_CALLS.c.status,
        PROJ_CALLS.c.failure_reason,
        PROJ_CALLS.c.failure_detail,
        PROJ_CALLS.c.resolved_position,
    ).where(PROJ_CALLS.c.call_id == "c6")
    indexes = select(
        PROJ_CALLS.c.capture_key, PROJ_CALLS.c.call_id, PROJ_CALLS.c.selection_index
    ).where(PROJ_CALLS.c.selection_index.is_not(None))
    with store.engine.connect() as conn:
        assert [tuple(row) for row in conn.execute(attempts)] == [
            ("att-1", "r1", "g1", 1, True, True, True, True),
            ("att-2", "r2", "g2", 20, True, True, True, False),
        ]
        assert [tuple(row) for row in conn.execute(rollouts)] == [
            ("att-1", "r1", "g1", "returned_history", 1.0, "resp-c5", 4, "trainable", 2, None, 18),
            ("att-2", "r2", "g2", "returned_history", 1.0, "resp-c5", 4, "trainable", 2, 4, 37),
        ]
        assert sorted(tuple(row) for row in conn.execute(failed)) == [
            ("att-1", "failed", "engine_error", "boom", 13),
            ("att-2", "failed", "engine_error", "boom", 32),
        ]
        assert sorted(tuple(row) for row in conn.execute(indexes)) == [
            (key, call_id, index)
            for key in ("att-1", "att-2")
            for index, call_id in enumerate(("c1", "c2", "c3", "c5"))
        ]
