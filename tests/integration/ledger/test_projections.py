"""Projection tables folded from events, with checkpoints, and identical after a rebuild."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select, text

from grove.ledger.catch_up import PROJECTIONS, catch_up, projection_marks, rebuild
from grove.ledger.events import BatchPublished, LedgerPosition
from grove.ledger.schema import PROJ_ATTEMPTS, PROJ_CALLS, PROJ_ROLLOUTS
from grove.ledger.store import EventStore

from .scenario import compaction_rollout


def record(store: EventStore, capture_key: str, **names) -> None:
    for index, event in enumerate(compaction_rollout(capture_key, **names)):
        store.append(capture_key, [event], expected_version=index)


def snapshot(store: EventStore) -> dict[str, list[tuple]]:
    with store.engine.connect() as conn:
        return {
            p.name: [tuple(r) for r in conn.execute(select(p.table).order_by(*p.table.primary_key))]
            for p in PROJECTIONS
        }


def calls(store: EventStore) -> dict[str, tuple]:
    query = select(
        PROJ_CALLS.c.call_id, PROJ_CALLS.c.status, PROJ_CALLS.c.late, PROJ_CALLS.c.selection_index
    )
    with store.engine.connect() as conn:
        return {row.call_id: tuple(row)[1:] for row in conn.execute(query)}


def test_calls_projection_shows_status_lateness_and_selection(store: EventStore):
    record(store, "att-1")
    catch_up(store)
    assert calls(store) == {
        "c1": ("committed", False, 0),
        "c2": ("committed", False, 1),
        "c3": ("committed", False, 2),
        "c4": ("committed", False, None),
        "c5": ("committed", False, 3),
        "c6": ("failed", False, None),
        "c7": ("committed", True, None),
    }


def test_attempt_and_rollout_projections_follow_the_lifecycle(store: EventStore):
    record(store, "att-1", rollout_id="r7", group="g3")
    store.append(
        "training",
        [
            BatchPublished(
                step=4,
                rollout_ids=("r7",),
                row_ids=("r7/0", "r7/1"),
                ledger_position=LedgerPosition(position=19),
            )
        ],
    )
    catch_up(store)
    with store.engine.connect() as conn:
        attempt = conn.execute(select(PROJ_ATTEMPTS)).one()
        rollout = conn.execute(select(PROJ_ROLLOUTS)).one()
    assert (attempt.admissions_closed, attempt.settled, attempt.settle_timed_out) == (
        True,
        True,
        True,
    )
    assert (rollout.rollout_id, rollout.prompt_group, rollout.status, rollout.rows) == (
        "r7",
        "g3",
        "trainable",
        2,
    )
    assert (rollout.reward, rollout.selected_calls, rollout.step) == (1.0, 4, 4)


def test_catch_up_twice_folds_each_event_once(store: EventStore):
    record(store, "att-1")
    first = catch_up(store)
    again = catch_up(store)
    assert first == again
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM grove_proj_calls")).scalar_one() == 7


def test_checkpoints_advance_to_the_last_folded_event(store: EventStore):
    record(store, "att-1")
    catch_up(store)
    marks = projection_marks(store)
    last = store.read_stream("att-1")[-1]
    assert {m.position for m in marks.values()} == {last.position}


def test_incremental_folding_and_rebuild_from_zero_give_identical_tables(store: EventStore):
    record(store, "att-1")
    catch_up(store)
    record(store, "att-2", rollout_id="r1")
    catch_up(store, batch_size=3)
    incremental = snapshot(store)
    rebuild(store)
    assert snapshot(store) == incremental


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_concurrent_catch_up_runners_fold_each_event_once(store: EventStore):
    record(store, "att-1")
    with ThreadPoolExecutor(4) as pool:
        for future in [pool.submit(catch_up, store, 2) for _ in range(4)]:
            future.result()  # re-raises a runner's error
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM grove_proj_calls")).scalar_one() == 7


def test_lineage_view_lists_every_ancestor_with_its_depth(store: EventStore):
    record(store, "att-1")
    catch_up(store)
    query = text(
        "SELECT ancestor_call_id, depth FROM grove_call_lineage "
        "WHERE capture_key = 'att-1' AND call_id = 'c7' ORDER BY depth"
    )
    with store.engine.connect() as conn:
        assert [tuple(r) for r in conn.execute(query)] == [("c7", 0), ("c5", 1), ("c3", 2)]
