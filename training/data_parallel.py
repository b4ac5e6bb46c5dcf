"""The data-parallel ranks of a ``torch.distributed`` process group
(``grove.training.row_sharding``).

Gradients and tensors of rows travel on the default group, so they take whatever backend it was
started with for their device (gloo for CPU tensors; NCCL for CUDA tensors when the group was
started with ``cpu:gloo,cuda:nccl``). Python objects (a step's batch, checkpoint state) are
pickled over a separate gloo group, since object collectives on NCCL would stage every object
through the GPU.

Gradients are summed, never averaged: every rank's loss is already divided by the whole step's
retained token count (``grove.training.row_sharding``). They are summed in one flat buffer per
dtype and device; a parameter without a gradient on some rank counts as zero there, and one
without a gradient on every rank keeps None, as in one process (AdamW skips it).

``ShardedRanks`` is the same group for a model sharded with FSDP2 (``grove.training.fsdp``,
``policy.dtensor_cfg.enabled``): FSDP reduce-scatters (sums) each gradient into its shard during
backward, so there is nothing left to sum. The flat all-reduce stays for ranks that each hold the
whole model (``docs/train.md``, "Sharded training with FSDP2"): tree-packed micro batches, whose
number differs between ranks (FSDP collectives run in every pass; this one runs once per step),
and a model whose layers FSDP cannot find.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar, cast

import torch
import torch.distributed as dist

from grove.training.errors import BatchError
from grove.training.row_sharding import shard_rows

__all__ = ["ProcessGroupRanks", "ShardedRanks"]

T = TypeVar("T")


class ProcessGroupRanks:
    """The ranks of the initialized default process group; ``objects`` is a gloo group of the
    same ranks for pickled objects."""

    def __init__(self, objects: dist.ProcessGroup | None = None) -> None:
        if not dist.is_initialized():
            raise BatchError(
                "process_group",
                "data-parallel ranks need an initialized torch.distributed process group "
                "(launch with torchrun)",
            )
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.objects = objects if objects is not None else dist.new_group(backend="gloo")

    def own_shards(self, rows: int) -> tuple[range, ...]:
        """This rank's shard (``grove.training.row_sharding.shard_rows``)."""
        return (shard_rows(rows, self.world_size)[self.rank],)

    def end_shard(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Nothing to set aside: a rank trains one shard."""

    def broadcast(self, value: T | None) -> T:
        """The main rank's ``value`` on every rank, pickled over the gloo group."""
        box: list[object] = [value if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.objects)
        return cast(T, box[0])

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Each gradient summed over the ranks, in one flat buffer per dtype and device."""
        params = [p for p in parameters if p.requires_grad]
        present = torch.tensor([p.grad is not None for p in params], dtype=torch.int32)
        dist.all_reduce(present, group=self.objects)
        summed = [p for p, count in zip(params, present.tolist(), strict=True) if count]
        buckets: dict[tuple[torch.dtype, torch.device], list[torch.nn.Parameter]] = {}
        for param in summed:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            buckets.setdefault((param.grad.dtype, param.grad.device), []).append(param)
        for bucket in buckets.values():
            grads = [cast(torch.Tensor, p.grad) for p in bucket]
            flat = torch.cat([g.reshape(-1) for g in grads])
            dist.all_reduce(flat)
            for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                grad.copy_(part.view_as(grad))

    def sum_values(self, values: Sequence[float]) -> list[float]:
        """Each of ``values`` summed over the ranks (in float64)."""
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, group=self.objects)
        return [float(v) for v in tensor.tolist()]

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` summed elementwise over the ranks, in place; returned."""
        dist.all_reduce(tensor)
        return tensor


class ShardedRanks(ProcessGroupRanks):
    """The ranks of a model sharded with FSDP2: its gradients are summed by FSDP itself."""

    def sum_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Nothing to do: FSDP summed each gradient into its shard during backward."""
