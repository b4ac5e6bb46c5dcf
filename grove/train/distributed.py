"""Data-parallel ``grove train`` under ``torchrun`` (``docs/train.md``, "Data-parallel training").

``torchrun --nproc-per-node N grove train CONFIG`` starts N processes; ``policy.data_parallel_size``
must be N (a run of one process may set any size: it trains every rank's rows itself). Rank 0 is
the run as one process would run it — gateway, engine, harness, projector, the ledger's
``batch.published`` events, checkpoints, metrics, the summary — and each other rank is a learner
only: it builds the same model and trainer and trains its shard of every step
(``training/row_sharding.py``). Nothing but rank 0 touches the workdir, the ledger or the blob
store.

Rank 0 sends the other ranks three kinds of message, each pickled over a gloo group
(``grove.training.data_parallel.ProcessGroupRanks.broadcast``), in this order:

1. ``TrainingState`` once, before the first step: the weights, optimizer and scheduler state and
   step count (fresh or restored by ``--resume``), so every rank starts from rank 0's state;
2. one ``grove.training.trainer.StepBatch`` per step: the whole step (every rank needs its logical
side:
   owners, advantages and the retained token count); each rank takes its rows from it;
3. ``RunEnded`` once: the run's summary, or the error that stopped rank 0, which the other ranks
   raise as ``RankStopped``.

Within a step the gradients are summed over the ranks (gloo on CPU; NCCL for CUDA tensors, with no
change to this code), so every rank takes the same optimizer step on the same weights. A rank
that fails stops ``torchrun``, which ends the others.

With ``policy.dtensor_cfg.enabled`` the ranks are ``ShardedRanks`` and each trains its FSDP2
shard of the model (``grove.training.fsdp``): FSDP sums the gradients during the backward; after
every step all ranks gather the full weights into rank 0's unsharded copy (its engine samples
them), and at every checkpoint the full optimizer state, which rank 0 writes as an ordinary
schema-5 checkpoint. ``TrainingState`` then carries only the scheduler and step; the weights and
optimizer state are scattered from rank 0 onto the shards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, TypeVar

import torch
import torch.distributed as dist

from grove.config import GroveConfig
from grove.engines.models import load_model
from grove.errors import JobError
from grove.train.training_run import build_trainer, checkpoint_due
from grove.training.data_parallel import ProcessGroupRanks, ShardedRanks
from grove.training.row_sharding import RankGroup, SingleProcess
from grove.training.trainer import StepBatch, Trainer

__all__ = [
    "DataParallelMismatch",
    "RankStopped",
    "RunEnded",
    "TrainingState",
    "data_parallel_ranks",
    "follow_main_rank",
    "is_main_rank",
    "leading_ranks",
    "share_training_state",
]

T = TypeVar("T")

WAIT_FOR_MAIN_RANK: Final = timedelta(days=7)
"""How long a rank waits for rank 0's next message: a step waits for its rollouts (an external
agent's may take long), so the process group's timeout is far beyond torch's 30 minutes."""


class DataParallelMismatch(JobError, ValueError):
    """``torchrun`` started another number of ranks than ``policy.data_parallel_size``."""

    def __init__(self, world_size: int, data_parallel_size: int) -> None:
        self.world_size = world_size
        self.data_parallel_size = data_parallel_size
        super().__init__(
            f"torchrun started {world_size} ranks (WORLD_SIZE={world_size}), but "
            f"policy.data_parallel_size is {data_parallel_size}: every step is laid out for "
            f"policy.data_parallel_size ranks. Set policy.data_parallel_size: {world_size}, or "
            f"launch torchrun --nproc-per-node {data_parallel_size}"
        )


class RankStopped(JobError, RuntimeError):
    """Rank 0 stopped the run with an error; ``error`` is its message."""

    def __init__(self, rank: int, error: str) -> None:
        self.rank = rank
        self.error = error
        super().__init__(f"rank {rank}: rank 0 stopped the run: {error}")


@dataclass(frozen=True)
class TrainingState:
    """Rank 0's trainer state, sent once before the first step (producer:
    ``share_training_state`` on rank 0; consumer: the same call on the other ranks)."""

    model: Mapping[str, torch.Tensor]
    optimizer: dict[str, Any]  # as state_dict() gives it and load_state_dict() takes it
    scheduler: dict[str, Any] | None
    step: int


@dataclass(frozen=True)
class RunEnded:
    """The last message of rank 0: the run's summary, or the error that stopped it (None when
    it finished)."""

    summary: Any
    error: str | None = None


def is_main_rank(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this process is rank 0 of its launch (or was not launched by ``torchrun``)."""
    return environ.get("RANK", "0") == "0"


@contextmanager
def data_parallel_ranks(
    config: GroveConfig, environ: Mapping[str, str] = os.environ
) -> Iterator[RankGroup]:
    """The data-parallel ranks of this launch: one process that trains every rank's shard
    without ``torchrun`` (or with one rank), else the process group started from ``torchrun``'s
    environment, destroyed on exit.
    Raises ``DataParallelMismatch`` before starting anything when the rank count is not
    ``policy.data_parallel_size``."""
    world_size = int(environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        yield SingleProcess(config.policy.data_parallel_size)
        return
    if world_size != config.policy.data_parallel_size:
        raise DataParallelMismatch(world_size, config.policy.data_parallel_size)
    cuda = torch.cuda.is_available() and dist.is_nccl_available()
    dist.init_process_group(
        backend="cpu:gloo,cuda:nccl" if cuda else "gloo", timeout=WAIT_FOR_MAIN_RANK
    )
    group = ShardedRanks if config.policy.dtensor_cfg.enabled else ProcessGroupRanks
    try:
        yield group(dist.new_group(backend="gloo", timeout=WAIT_FOR_MAIN_RANK))
    finally:
        dist.destroy_process_group()


def share_training_state(ranks: RankGroup, trainer: Trainer) -> None:
    """Rank 0's weights, optimizer and scheduler state and step on every rank: rank 0 sends its
    own, the others load them. Nothing happens in one process.

    A sharded trainer's weights and optimizer state are not pickled: rank 0's whole model and
    the optimizer state ``--resume`` restored into its ``UnshardedCopy`` are scattered onto
    every rank's shards (``grove.training.fsdp.load_full_state``)."""
    if ranks.world_size == 1:
        return
    unsharded = trainer.unsharded
    if ranks.rank == 0:
        if unsharded is None:
            model, optimizer = trainer.model.state_dict(), trainer.optimizer.state_dict()
        else:  # scattered below; the flag says whether --resume restored an optimizer state
            restored = unsharded.optimizer is not None and bool(unsharded.optimizer.state)
            model, optimizer = {}, {"restored": restored}
        state = TrainingState(
            model=model,
            optimizer=optimizer,
            scheduler=trainer.scheduler.state_dict() if trainer.scheduler is not None else None,
            step=trainer.step,
        )
        ranks.broadcast(state)
    else:
        state = _expect(ranks, TrainingState)
        if unsharded is None:
            trainer.model.load_state_dict(state.model)
            trainer.optimizer.load_state_dict(state.optimizer)
        if trainer.scheduler is not None and state.scheduler is not None:
            trainer.scheduler.load_state_dict(state.scheduler)
        trainer.step = state.step
    if unsharded is not None:
        restored = bool(state.optimizer["restored"])
        unsharded.scatter(trainer.model, trainer.optimizer, restored=restored)


@contextmanager
def leading_ranks(ranks: RankGroup) -> Iterator[None]:
    """Rank 0's run: an error that escapes it is sent to the other ranks (``RunEnded``) before
    it is raised, so they stop too instead of waiting for a step."""
    try:
        yield
    except BaseException as error:
        if ranks.world_size > 1:
            ranks.broadcast(RunEnded(None, f"{type(error).__name__}: {error}"))
        raise


def end_run(ranks: RankGroup, summary: object) -> None:
    """Rank 0's last message: the run finished with ``summary``."""
    if ranks.world_size > 1:
        ranks.broadcast(RunEnded(summary))


def follow_main_rank(config: GroveConfig, ranks: RankGroup, summary_type: type[T]) -> T:
    """A rank other than 0: build the model and trainer, take rank 0's state, train this rank's
    shard of every step rank 0 sends, and return rank 0's summary (of ``summary_type``)."""
    loaded = load_model(
        config.model.path,
        dtype=config.model.dtype,
        seed=config.seed,
        architecture=config.model.architecture,
    )
    trainer = build_trainer(config, loaded.model, ranks=ranks)
    share_training_state(ranks, trainer)
    while True:
        message: object = ranks.broadcast(None)
        if isinstance(message, StepBatch):
            trainer.train_step(message)
            if trainer.unsharded is not None and checkpoint_due(config, trainer.step):
                # rank 0 writes the checkpoint: every rank joins the gather of its state
                trainer.unsharded.gather_optimizer(trainer.model, trainer.optimizer)
            continue
        if isinstance(message, RunEnded) and message.error is not None:
            raise RankStopped(ranks.rank, message.error)
        if isinstance(message, RunEnded) and isinstance(message.summary, summary_type):
            return message.summary
        raise RankStopped(ranks.rank, f"an unexpected message {type(message).__name__}")


def _expect(ranks: RankGroup, kind: type[T]) -> T:
    """Rank 0's next message, which must be a ``kind`` (a ``RunEnded`` error is raised)."""
    message: object = ranks.broadcast(None)
    if isinstance(message, kind):
        return message
    if isinstance(message, RunEnded) and message.error is not None:
        raise RankStopped(ranks.rank, message.error)
    raise RankStopped(
        ranks.rank, f"expected {kind.__name__}, got an unexpected {type(message).__name__}"
    )
