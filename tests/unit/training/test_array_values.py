"""A 1-D array's values read as a list, converted once (``training/array_values.py``), and a
record over an array of another rank is refused naming its call."""

from __future__ import annotations

import pytest
import torch

from grove.training.array_values import ArrayValues, as_list, values_total
from grove.training.errors import ForestError
from grove.training.forest import CallRecord, RecordRule


class CountingArray:
    """A 1-D array that counts its conversions to a list."""

    def __init__(self, values: list[float]) -> None:
        self.tensor = torch.tensor(values)
        self.shape = self.tensor.shape
        self.conversions = 0

    def tolist(self) -> list[float]:
        self.conversions += 1
        return self.tensor.tolist()

    def sum(self) -> torch.Tensor:
        return self.tensor.sum()


def test_length_and_total_read_the_array_without_converting_it():
    array = CountingArray([0.5, 0.25, 2.0])
    values = ArrayValues(array)

    assert (len(values), values_total(values), array.conversions) == (3, 2.75, 0)


def test_values_are_converted_once_and_equal_the_list():
    array = CountingArray([0.5, 0.25])
    values = ArrayValues(array)

    assert (values == [0.5, 0.25], values[1], as_list(values), list(values)) == (
        True,
        0.25,
        [0.5, 0.25],
        [0.5, 0.25],
    )
    assert array.conversions == 1


def test_a_record_over_a_two_dimensional_array_is_refused_naming_its_call():
    square = torch.zeros((2, 2), dtype=torch.int32)
    flat = torch.zeros(2, dtype=torch.int32)

    with pytest.raises(ForestError, match=r"arrays must be 1-D, got shape \(2, 2\)") as refused:
        CallRecord.from_arrays("c1", None, square, flat, torch.zeros(2))

    assert (refused.value.rule, refused.value.call_id) == (RecordRule.INVALID_INPUT, "c1")
