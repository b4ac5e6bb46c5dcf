"""A torchrun worker for ``tests/e2e/test_fsdp.py``: the tiny Qwen2 model sharded with FSDP2
(gloo, CPU) trains ``STEPS`` steps of ``step_batches()``; rank 0 writes what the test compares.

``python -m torch.distributed.run --nproc-per-node 2 tests/e2e/fsdp_worker.py OUT`` writes under
``OUT``: ``final.pt`` (the full weights after every step), ``step2.pt`` (full weights and
one-process optimizer state after two steps), ``resumed.pt`` (the weights of a second sharded
model that loaded ``step2.pt``'s state and trained the last step) and ``bytes.json`` (this
rank's parameter and optimizer bytes against one process's).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from grove.training.data_parallel import ShardedRanks
from grove.training.fsdp import (
    full_model_state,
    full_optimizer_state,
    load_full_state,
    rank_state_bytes,
    shard_model,
)
from grove.training.row_sharding import SINGLE_PROCESS, RankGroup
from grove.training.trainer import StepBatch, Trainer
from tests.unit.trainer.tiny_lm import synthetic_step_batch, tiny_causal_lm

STEPS = 3
LEARNING_RATE = 1e-2


def step_batches() -> list[StepBatch]:
    """Three steps of four rollouts: five rows and three padding rows (8 = 2 ranks x micro
    batch 1 x 4), so each rank trains four rows."""
    generator = torch.Generator().manual_seed(7)
    return [
        synthetic_step_batch(rows_per_rollout=[2, 1, 1, 1], padding_rows=3, generator=generator)
        for _ in range(STEPS)
    ]


def learner(model: torch.nn.Module, ranks: RankGroup) -> Trainer:
    """The trainer both launches use: AdamW, micro batch 1, clipping at norm 1."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return Trainer(
        model,
        optimizer,
        global_batch_rollouts=4,
        micro_batch_size=1,
        max_grad_norm=1.0,
        ranks=ranks,
    )


def main(out: Path) -> None:
    dist.init_process_group(backend="gloo")
    ranks = ShardedRanks()
    batches = step_batches()
    trainer = learner(shard_model(tiny_causal_lm(seed=0)), ranks)
    for batch in batches[:-1]:
        trainer.train_step(batch)
    state = full_model_state(trainer.model)
    optimizer_state = full_optimizer_state(trainer.model, trainer.optimizer)
    trainer.train_step(batches[-1])
    final = full_model_state(trainer.model)
    sharded_bytes = rank_state_bytes(trainer.model, trainer.optimizer)

    resumed = learner(shard_model(tiny_causal_lm(seed=1)), ranks)
    load_full_state(
        resumed.model, resumed.optimizer, model_state=state, optimizer_state=optimizer_state
    )
    resumed.train_step(batches[-1])
    resumed_weights = full_model_state(resumed.model)

    if ranks.rank == 0:
        single = learner(tiny_causal_lm(seed=0), SINGLE_PROCESS)
        single.train_step(batches[0])  # one process's state, to size it
        torch.save(final, out / "final.pt")
        torch.save({"model": state, "optimizer": optimizer_state}, out / "step2.pt")
        torch.save(resumed_weights, out / "resumed.pt")
        whole = rank_state_bytes(single.model, single.optimizer)
        (out / "bytes.json").write_text(json.dumps({"rank": sharded_bytes, "single": whole}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
