"""Data-parallel sharding of one step's rows: which rows each rank trains (``docs/train.md``,
"Data-parallel training").

A step's batch lays out whole prompt groups, each padded with ownerless rows (owner -1, no loss
token, zero advantage) to a multiple of the execution row multiple, ``policy.data_parallel_size x
policy.train_micro_batch_size`` (``grove.training.batch.assemble_batch``). Its ``R`` rows are
therefore cut into ``world_size`` contiguous shards of ``R / world_size`` rows, the same count on
every rank and a whole number of micro batches each, so a rank's micro batches are exactly the micro
batches one process would run on the same rows. Six logical rollouts of two groups with 7 and 6
rows over four ranks (micro batch 1): each group is padded to 8 rows, 13 real rows and 3 padding
rows in all, four rows a rank.

Every rank holds the whole step batch (its logical side too: owners, advantages, the retained
token count), so the loss of every micro batch is divided by the whole step's retained token
count, not the rank's; the ranks' gradients are then summed, not averaged, and the sum is the
gradient one process takes over all rows. A micro batch plan that keeps rows together (micro
batches of other sizes) still trains each micro batch on exactly one rank: the rank whose shard
holds its first row. A group may span two ranks: its advantages were
computed over the whole group before the batch was cut, so where its rows train changes nothing.

``RankGroup`` is the trainer's one seam to the other ranks; ``SINGLE_PROCESS`` is the identity,
and ``grove.training.data_parallel.ProcessGroupRanks`` the ``torch.distributed`` implementation.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final, Protocol, TypeVar

import torch

from grove.training.errors import BatchError

__all__ = [
    "SINGLE_PROCESS",
    "RankGroup",
    "SingleProcess",
    "shard_micro_batches",
    "shard_rows",
]

T = TypeVar("T")


def shard_rows(rows: int, world_size: int) -> tuple[range, ...]:
    """The rows of each rank, in rank order: ``world_size`` contiguous, equal ranges.

    Raises ``BatchError`` when ``rows`` is not a multiple of ``world_size`` (a batch laid out
    with ``row_multiple = data-parallel size x micro batch`` always is).
    """
    if world_size < 1:
        raise BatchError("world_size", f"the data-parallel size must be >= 1, got {world_size}")
    if rows < 1 or rows % world_size:
        raise BatchError(
            "rows_per_rank",
            f"a step's {rows} rows cannot be shared equally among {world_size} data-parallel "
            "ranks: lay the batch out with row_multiple = policy.data_parallel_size x "
            "policy.train_micro_batch_size, which pads every prompt group with ownerless rows",
        )
    per_rank = rows // world_size
    return tuple(range(rank * per_rank, (rank + 1) * per_rank) for rank in range(world_size))


def shard_micro_batches(planned: Sequence[slice], shard: range) -> list[slice]:
    """The micro batches of ``planned`` (slices that tile a step's rows in order) that the rank
    holding ``shard`` runs: those that start in it. Every micro batch belongs to exactly one
    rank; with fixed micro batches of a batch laid out for the ranks, a rank's micro batches
    cover exactly its shard."""
    return [part for part in planned if shard.start <= (part.start or 0) < shard.stop]


class RankGroup(Protocol):
    """The data-parallel ranks a step's rows are shared among (consumer: ``Trainer``). Every
    method is collective: each process calls it in the same order."""

    @property
    def rank(self) -> int:
        """This process's rank, 0 being the main rank."""
        ...

    @property
    def world_size(self) -> int:
        """How many processes train each step."""
        ...

    def own_shards(self, rows: int) -> tuple[range, ...]:
        """The shards of a step of ``rows`` rows that this process trains, in rank order: its
        own, or every rank's in one process."""
        ...

    def end_shard(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """After a shard's micro batches: set its gradients aside when this process trains
        another shard next, so that the shards' gradients are summed as the ranks' are."""
        ...

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by its sum over the shards; a parameter that no
        shard has a gradient for keeps None."""
        ...

    def broadcast(self, value: T | None) -> T:
        """The main rank's ``value`` on every rank (the others pass None)."""
        ...

    def sum_values(self, values: Sequence[float]) -> list[float]:
        """Each of ``values`` summed over the processes."""
        ...

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed elementwise over the processes (same shape on each)."""
        ...


class SingleProcess:
    """One process that trains every rank's shard itself, in rank order (``shards``: the
    data-parallel size the steps are laid out for). Each shard's gradient is summed apart and
    the shards' sums are then added in rank order, the order in which two ranks add theirs, so
    a one-process run of a two-rank layout computes the same floats as two ranks."""

    rank: Final = 0
    world_size: Final = 1

    def __init__(self, shards: int = 1) -> None:
        if shards < 1:
            raise BatchError("shards", f"a process trains >= 1 shards, got {shards}")
        self.shards = shards
        self._sums: dict[torch.nn.Parameter, torch.Tensor] = {}

    def own_shards(self, rows: int) -> tuple[range, ...]:
        """Every rank's shard (``shard_rows``)."""
        return shard_rows(rows, self.shards)

    def end_shard(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Add the shard's gradients to the shards' sums and clear them (one shard: nothing to
        do)."""
        if self.shards == 1:
            return
        for param in parameters:
            if param.grad is not None:
                done = self._sums.get(param)
                self._sums[param] = param.grad if done is None else done + param.grad
                param.grad = None

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """The shards' sums as the gradients (one shard: they are already)."""
        if self.shards == 1:
            return
        for param in parameters:
            param.grad = self._sums.pop(param, None)
        self._sums.clear()

    def broadcast(self, value: T | None) -> T:
        """``value`` itself."""
        if value is None:
            raise BatchError("broadcast", "a single process broadcasts its own value, got None")
        return value

    def sum_values(self, values: Sequence[float]) -> list[float]:
        """``values`` unchanged."""
        return list(values)

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` unchanged."""
        return tensor


SINGLE_PROCESS: Final = SingleProcess()
"""The ranks of a run without ``torchrun`` whose steps are laid out for one rank (stateless)."""
