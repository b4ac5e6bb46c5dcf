"""The training worker the crash suite kills and restarts: a ``TrainingRun`` that resumes from
its latest checkpoint, trains every step the ledger can publish, and prints one JSON line.

``python -m tests.reliability.worker --database-url URL --blob-url URL --checkpoints DIR``; the
crash suite runs ``main`` in a forked process (``processes.py``) with a crash point armed.
The model is the embedded one, built from the same seed in every process, so a run resumed
after any number of kills must end bitwise where an uninterrupted run on the same batches ends.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import torch

from grove.capture.embedded import build_model, build_tokenizer
from grove.config import GroveConfig
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.train.training_run import TrainingRun
from grove.training.projector import PublishedBatch

__all__ = ["ROLLOUTS_PER_GROUP", "WORKER_CONFIG", "main"]

ROLLOUTS_PER_GROUP: Final = 2
WORKER_CONFIG: Final[dict[str, Any]] = {
    "seed": 0,
    "token_capture": {"enabled": True, "forest_training": True},
    "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": ROLLOUTS_PER_GROUP},
    "policy": {
        "train_global_batch_size": ROLLOUTS_PER_GROUP,
        "train_micro_batch_size": 4,
        "logprob_micro_batch_size": 4,
        "learning_rate": 1e-2,
    },
    # The gateway's engine never receives the worker's weights: every call records version 0.
    "async_rl": {"max_policy_lag": 1_000_000},
}


def _next_batch(run: TrainingRun, store: EventStore, timeout_s: float) -> PublishedBatch | None:
    """The next step's batch, or None once the projector has read the whole ledger and none can
    be formed (on PostgreSQL a transaction elsewhere can hold the reader back for a moment)."""
    deadline = time.monotonic() + timeout_s
    while True:
        published = run.next_batch()
        if published is not None:
            return published
        if run.projector.events_read >= store.count() or time.monotonic() > deadline:
            return None
        time.sleep(0.05)


def main(argv: Sequence[str] | None = None) -> None:
    """Resume, train every step that can be published, print ``{"step", "resumed_from"}``."""
    parser = argparse.ArgumentParser(prog="tests.reliability.worker")
    parser.add_argument("--database-url", required=True)
    parser.add_argument("--blob-url", required=True)
    parser.add_argument("--checkpoints", required=True, type=Path)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    config = GroveConfig.model_validate(WORKER_CONFIG)
    torch.manual_seed(config.seed)
    tokenizer = build_tokenizer()
    store = EventStore.open(args.database_url)
    try:
        run = TrainingRun(
            store,
            open_blob_store(args.blob_url),
            build_model(tokenizer, seed=config.seed),
            config,
            args.checkpoints,
            pad_token_id=tokenizer.pad_token_id,
        )
        resumed = run.resume()
        while (published := _next_batch(run, store, args.timeout)) is not None:
            run.train(published)
    finally:
        store.close()
    print(json.dumps({"step": run.step, "resumed_from": None if resumed is None else resumed.name}))


if __name__ == "__main__":
    main()
