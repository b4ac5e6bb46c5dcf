"""``locate_boundary`` given the prefix digests finds the boundary it finds hashing them anew."""

from __future__ import annotations

import pytest

from grove.ledger.admission import AdmissionItem, locate_boundary, prefix_digests

ITEMS = {
    "no assistant item": (AdmissionItem("user", "a" * 64, "a" * 64),),
    "a continuation": (
        AdmissionItem("system", "a" * 64, "a" * 64),
        AdmissionItem("user", "b" * 64, "b" * 64),
        AdmissionItem("assistant", "c" * 64, "d" * 64, ("resp-1",)),
        AdmissionItem("tool", "e" * 64, "e" * 64),
    ),
}


@pytest.mark.parametrize("name", sorted(ITEMS))
def test_a_boundary_from_given_prefix_digests_is_the_boundary_hashed_anew(name: str) -> None:
    items = ITEMS[name]
    assert locate_boundary(items, tuple(prefix_digests(items))) == locate_boundary(items)
