"""How a ``COPY`` append splits its events into parts (``ledger/postgres.py``)."""

from __future__ import annotations

import pytest

from grove.ledger.postgres import COPY_PART, _parts


@pytest.mark.parametrize("count", [1, COPY_PART, 3 * COPY_PART - 1])
def test_an_append_under_three_first_parts_goes_in_one(count: int):
    assert list(_parts(count)) == [(0, count)]


def test_each_part_is_twice_the_one_before_and_the_last_takes_the_rest():
    assert list(_parts(500)) == [(0, 64), (64, 192), (192, 500)]
    assert COPY_PART == 64


def test_the_parts_cover_every_event_once():
    for count in range(1, 3000, 37):
        parts = list(_parts(count))
        assert [start for start, _ in parts] == [0] + [stop for _, stop in parts[:-1]]
        assert parts[-1][1] == count
