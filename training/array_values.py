"""A 1-D array's values as a read-only sequence that becomes a Python list only when read.

The projector decodes each selected call's blob into tensors; converting every one to Python
lists costs more than the forest that reads them (``docs/benchmarks.md``). ``ArrayValues`` wraps
a 1-D tensor or numpy array: its length and sum come from the array (no conversion), and its
values are converted once, on first read, and cached. ``build_forest`` reads only lengths and
the logprobs' sum, so a rollout's lists are built only for the rows that are read.

The sum departs from a plain ``array.sum()`` in one case: when the array's sum is NaN or +inf
(a float32 overflow, say), it is taken again over the exact Python values, so a finite row is
never mistaken for a NaN one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

__all__ = ["Array1D", "ArrayValues", "as_list", "values_total"]


class Array1D(Protocol):
    """A 1-D tensor or array (torch or numpy): what ``ArrayValues`` wraps."""

    shape: Any

    def tolist(self) -> Any: ...

    def sum(self) -> Any: ...


class ArrayValues(Sequence[Any]):
    """A 1-D array's values as a read-only sequence, converted to a Python list on first read
    (its length and sum never convert it). Equal to a list with the same values; an array of
    another rank is a ``ValueError``."""

    __slots__ = ("_array", "_list")

    def __init__(self, array: Array1D) -> None:
        if len(array.shape) != 1:
            raise ValueError(f"arrays must be 1-D, got shape {tuple(array.shape)}")
        self._array = array
        self._list: list[Any] | None = None

    def values(self) -> list[Any]:
        """The values as a Python list (converted once)."""
        if self._list is None:
            self._list = self._array.tolist()
        return self._list

    def total(self) -> float:
        """The sum of the values: NaN or +inf exactly when a value is NaN or +inf."""
        total = float(self._array.sum())
        if math.isnan(total) or total == math.inf:
            return sum(self.values())  # the exact check, on a float32 overflow too
        return total

    def __len__(self) -> int:
        return int(self._array.shape[0])

    def __getitem__(self, index: Any) -> Any:
        return self.values()[index]

    def __iter__(self) -> Iterator[Any]:
        return iter(self.values())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrayValues):
            other = other.values()
        return self.values() == other if isinstance(other, list) else NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self.values())


def as_list(values: Sequence[Any]) -> list[Any]:
    """``values`` as a list (an ``ArrayValues``' converted once and shared, so never mutate it)."""
    return values.values() if isinstance(values, ArrayValues) else list(values)


def values_total(values: Sequence[float]) -> float:
    """The sum of ``values``: from the array for an ``ArrayValues`` (one C loop), else Python's."""
    return values.total() if isinstance(values, ArrayValues) else sum(values)
