"""The orphan rule, pure: stored keys that no event names and no pending call may still write."""

from __future__ import annotations

from grove.storage import orphan_keys


def test_stored_keys_no_event_names_are_orphans():
    assert orphan_keys(["s/a/1", "s/a/2"], known=["s/a/1"], pending=[]) == ["s/a/2"]


def test_keys_of_pending_calls_are_never_orphans():
    assert orphan_keys(["s/a/1", "s/a/2"], known=[], pending=["s/a/2"]) == ["s/a/1"]


def test_known_keys_that_are_not_stored_are_not_reported():
    assert orphan_keys([], known=["s/a/1"], pending=[]) == []


def test_orphans_are_sorted_and_unique():
    assert orphan_keys(["s/b/1", "s/a/1", "s/b/1"], known=[], pending=[]) == ["s/a/1", "s/b/1"]
