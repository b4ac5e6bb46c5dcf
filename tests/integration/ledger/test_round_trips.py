"""What one read and one append cost the database, on both: statements counted, not timed."""

from __future__ import annotations

import pytest

from grove.ledger.errors import WrongExpectedVersion
from grove.ledger.events import CallFailed
from grove.ledger.store import ANY_VERSION, EventStore, NewEvent

from .scenario import opened
from .statements import statements


def failed(call_id: str) -> CallFailed:
    return CallFailed(call_id=call_id, reason="engine_error")


def test_an_append_at_its_expected_version_is_one_insert_and_no_read(store: EventStore):
    store.append("att-1", [opened("att-1")], expected_version=0)
    with statements(store) as counts:
        store.append("att-1", [failed("c1"), failed("c2")], expected_version=1)
    assert (counts["INSERT"], counts["SELECT"]) == (1, 0)
    assert [e.stream_version for e in store.read_stream("att-1")] == [1, 2, 3]


def test_an_append_with_any_version_is_one_insert_and_no_read(store: EventStore):
    store.append("att-1", [opened("att-1")], expected_version=0)
    with statements(store) as counts:
        result = store.append("att-1", [failed("c1")], expected_version=ANY_VERSION)
    assert (counts["INSERT"], counts["SELECT"]) == (1, 0)
    assert result.stream_version == 2


def test_a_stale_append_writes_nothing_then_reads_the_actual_version(store: EventStore):
    store.append("att-1", [opened("att-1"), failed("c1")], expected_version=0)
    with statements(store) as counts, pytest.raises(WrongExpectedVersion) as info:
        store.append("att-1", [failed("c2")], expected_version=1)
    assert (info.value.expected, info.value.actual) == (1, 2)
    assert counts["INSERT"] == 1 and counts["SELECT"] == 2  # recorded ids, then the version
    assert store.stream_version("att-1") == 2


def test_a_retried_append_fails_on_its_recorded_id_and_returns_the_recorded_positions(
    store: EventStore,
):
    first = store.append("att-1", [NewEvent(opened("att-1"), "ev-1")], expected_version=0)
    again = store.append("att-1", [NewEvent(opened("att-1"), "ev-1")], expected_version=ANY_VERSION)
    assert again.duplicate and again.positions == first.positions
    assert store.count() == 1


def test_a_stream_read_is_one_select(store: EventStore):
    store.append("att-1", [opened("att-1"), failed("c1")], expected_version=0)
    with statements(store) as counts:
        events = store.read_stream("att-1", after_version=1)
    assert dict(counts) == {"SELECT": 1}
    assert [e.stream_version for e in events] == [2]
