"""``grove_calls.policy_version``: the committed call's policy version, else the intended one;
events written before the field existed read as NULL (no upcaster, nothing rewritten)."""

from __future__ import annotations

from sqlalchemy import text

from grove.ledger.catch_up import catch_up, rebuild
from grove.ledger.events import CallCommitted, CallIntended
from grove.ledger.store import EventStore, ImportEvent

from .scenario import committed, intended, opened


def versions(store: EventStore, capture_key: str) -> dict[str, int | None]:
    catch_up(store)
    query = text(
        "SELECT call_id, policy_version FROM grove_calls WHERE capture_key = :key "
        "ORDER BY intended_position"
    )
    with store.engine.connect() as conn:
        return {
            row.call_id: row.policy_version for row in conn.execute(query, {"key": capture_key})
        }


def test_the_view_shows_the_committed_version_over_the_intended_one(store: EventStore):
    # c1 was admitted under version 2 and sampled by version 3 (an update landed in between);
    # c2 is still pending under version 3.
    store.append(
        "att-1",
        [
            opened("att-1"),
            intended("c1", policy_version=2),
            committed("att-1", "c1", policy_version=3),
            intended("c2", parent="c1", policy_version=3),
        ],
        expected_version=0,
    )
    assert versions(store, "att-1") == {"c1": 3, "c2": 3}


def test_a_commit_that_does_not_know_its_version_keeps_the_intended_one(store: EventStore):
    store.append(
        "att-1",
        [opened("att-1"), intended("c1", policy_version=4), committed("att-1", "c1")],
        expected_version=0,
    )
    assert versions(store, "att-1") == {"c1": 4}


def test_a_rebuild_gives_the_same_versions(store: EventStore):
    store.append(
        "att-1",
        [
            opened("att-1"),
            intended("c1", policy_version=0),
            committed("att-1", "c1", policy_version=1),
        ],
        expected_version=0,
    )
    before = versions(store, "att-1")
    rebuild(store)
    assert versions(store, "att-1") == before == {"c1": 1}


def test_events_written_before_the_field_existed_read_as_null(store: EventStore):
    old_intent = intended("c1").model_dump(mode="json")
    old_commit = committed("att-1", "c1").model_dump(mode="json")
    del old_intent["policy_version"], old_commit["policy_version"]
    store.append("att-1", [opened("att-1")], expected_version=0)
    store.import_events(
        [
            ImportEvent("att-1", 2, CallIntended.type, CallIntended.schema_version, old_intent),
            ImportEvent("att-1", 3, CallCommitted.type, CallCommitted.schema_version, old_commit),
        ]
    )
    [stored_intent, stored_commit] = store.read_stream("att-1", after_version=1)
    assert "policy_version" not in stored_intent.payload  # stored as written, never rewritten
    assert stored_intent.decode().policy_version is None
    assert stored_commit.decode().policy_version is None
    assert versions(store, "att-1") == {"c1": None}
