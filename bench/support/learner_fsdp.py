"""Parameter and optimizer bytes per rank of the FSDP2-sharded learner against one process's.

Usage (on torchrun ranks, ``bench.support.torchrun.rank_results``): ``python -m
bench.support.learner_fsdp OUT``. Every rank shards the bench model (``shard_model``: per decoder
layer, then the root), trains one step of 8 rows (AdamW's state exists after it) and writes
``grove.training.fsdp.rank_state_bytes``; rank 0 also trains one step of the same rows on an
unsharded model in the same process and writes that trainer's bytes (``single_state_bytes``).
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist

from bench.support.learner_workload import (
    bench_model,
    grove_trainer,
    learner_config,
    rows_batch,
    sharded_trainer,
)
from bench.support.torchrun import write_rank_result
from grove.training.fsdp import rank_state_bytes

ROWS = 8


def main() -> None:
    """One sharded step on this rank, and on rank 0 one unsharded step; write the bytes."""
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    batch = rows_batch([64] * ROWS)
    data_parallel = {"data_parallel_size": dist.get_world_size()}
    sharded = sharded_trainer(learner_config(ROWS, data_parallel), bench_model())
    sharded.train_step(batch)
    result: dict[str, int | None] = {
        "rank_state_bytes": rank_state_bytes(sharded.model, sharded.optimizer),
        "single_state_bytes": None,
    }
    if dist.get_rank() == 0:
        single = grove_trainer(batch)
        single.train_step(batch)
        result["single_state_bytes"] = rank_state_bytes(single.model, single.optimizer)
    write_rank_result(sys.argv[1], result)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
