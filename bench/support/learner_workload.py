"""The learner bench's workload, shared by ``bench/learner.py`` and the processes it starts: the
model, the rows and the configuration of a step, the trainer ``grove train`` builds from it, and
the FSDP2-sharded trainer of ``grove.training.fsdp``.
"""

from __future__ import annotations

from typing import Any

import torch

from grove.capture.embedded import build_model, build_tokenizer
from grove.config import GroveConfig, load_config
from grove.train.training_run import build_trainer
from grove.training.data_parallel import ShardedRanks
from grove.training.trainer import StepBatch, Trainer

__all__ = [
    "MICRO_BATCH",
    "bench_model",
    "grove_trainer",
    "learner_config",
    "rows_batch",
    "sharded_trainer",
    "varied_lengths",
]

MICRO_BATCH = 4


def rows_batch(lengths: list[int], *, seed: int = 0) -> StepBatch:
    """One logical rollout per row, right-padded to the longest: the second half of each row's
    tokens are its generated (loss) tokens, advantages alternate +1 and -1."""
    generator = torch.Generator().manual_seed(seed)
    width = max(lengths)
    token_ids = torch.zeros((len(lengths), width), dtype=torch.int64)  # (R, T)
    loss_mask = torch.zeros((len(lengths), width), dtype=torch.bool)  # (R, T)
    for row, length in enumerate(lengths):
        token_ids[row, :length] = torch.randint(10, 500, (length,), generator=generator)
        loss_mask[row, length // 2 : length] = True
    owners = torch.arange(len(lengths))
    return StepBatch(
        token_ids=token_ids,
        loss_mask=loss_mask,
        generation_logprobs=torch.full(token_ids.shape, -6.0),
        advantages=torch.where(owners % 2 == 0, 1.0, -1.0),
        owners=owners,
        logical_rollouts=len(lengths),
    )


def varied_lengths(rows: int, longest: int) -> list[int]:
    """``rows`` row lengths evenly spaced from ``longest / 8`` to ``longest``: they vary 8x."""
    shortest = longest // 8
    return [shortest + (longest - shortest) * i // (rows - 1) for i in range(rows)]


def learner_config(rollouts: int, policy: dict[str, Any] | None = None) -> GroveConfig:
    """The configuration of a step of ``rollouts`` rows, with ``policy`` keys added."""
    return load_config(
        {
            "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": rollouts},
            "policy": {
                "train_global_batch_size": rollouts,
                "train_micro_batch_size": MICRO_BATCH,
                "learning_rate": 1e-5,
                "max_grad_norm": 1.0,
                **(policy or {}),
            },
        }
    )


def bench_model(*, hidden_size: int = 128, num_layers: int = 4) -> torch.nn.Module:
    """The benches' model: the embedded Qwen2 shape, random weights, float32, train mode."""
    return build_model(build_tokenizer(), seed=0, hidden_size=hidden_size, num_layers=num_layers)


def grove_trainer(batch: StepBatch, policy: dict[str, Any] | None = None) -> Trainer:
    """``build_trainer``'s trainer of a fresh bench model, for ``batch``'s rollouts."""
    return build_trainer(learner_config(batch.logical_rollouts, policy), bench_model())


def sharded_trainer(config: GroveConfig, model: torch.nn.Module) -> Trainer:
    """The trainer ``grove train`` builds for ``model`` under ``policy.dtensor_cfg.enabled``: FSDP2
    shards over the initialized default process group (``ShardedRanks``), rank 0 keeping its
    engine's whole copy beside its shards (``build_trainer``)."""
    return build_trainer(config, model, ranks=ShardedRanks())
