"""The larger-model smoke of ``bench/learner.py``: a Llama directory of about 63M parameters,
built offline, trained 2 steps on 2 ``torchrun`` ranks (gloo, CPU) with FSDP2, bfloat16,
activation checkpointing and sequence packing.

The directory holds random weights (seed 0: hidden 768, 10 layers, 12 attention heads over 4
key-value heads, MLP 2048, tied embeddings, 2048 positions) and the embedded byte-level
tokenizer (``grove.capture.embedded.build_tokenizer``), saved with ``save_pretrained``; each rank
loads it as ``model.path`` names a directory (``grove.engines.models.load_model``).

Each rank builds the learner ``grove train`` builds under ``policy.dtensor_cfg.enabled``
(``bench.support.learner_workload.sharded_trainer``: FSDP2 per decoder layer and the root,
``ShardedRanks``; rank 0 keeps its engine's whole copy) under the configuration of
``SMOKE_POLICY``, and trains 2 steps of the same 8 rows, 32 to 256 tokens long, packed into bins
of at most 512 tokens.
Usage (on torchrun ranks): ``python -m bench.support.learner_smoke OUT MODEL_DIR``; each rank
writes its steps' wall time, its peak resident memory over the whole process (the full model is
loaded on every rank before it is sharded) and over the two steps alone.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from bench.support.decoders import causal_lm
from bench.support.learner_workload import learner_config, rows_batch, sharded_trainer
from bench.support.memory import peak_resident_bytes, reset_peak
from bench.support.torchrun import rank_results, write_rank_result
from grove.capture.embedded import build_tokenizer
from grove.engines.models import load_model

RANKS = 2
STEPS = 2
ROWS = 8
LONGEST = 256
SMOKE_POLICY: dict[str, Any] = {
    "data_parallel_size": RANKS,
    "train_micro_batch_size": 2,
    "max_total_sequence_length": LONGEST,
    "precision": "bfloat16",
    "dtensor_cfg": {"enabled": True, "activation_checkpointing": True},
    "sequence_packing": {"enabled": True, "train_mb_tokens": 512, "logprob_mb_tokens": 512},
}
"""The smoke's policy keys."""


def build_model_directory(directory: Path) -> int:
    """Write the smoke's Llama directory (weights, config, tokenizer); return its parameters."""
    tokenizer = build_tokenizer()
    model = causal_lm(
        "llama",
        seed=0,
        vocab_size=len(tokenizer),
        hidden_size=768,
        intermediate_size=2048,
        layers=10,
        heads=12,
        kv_heads=4,
        context=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def run_smoke(work: Path) -> dict[str, Any]:
    """Build the directory under ``work``, train 2 steps on 2 ranks; wall time and peak
    resident memory per rank."""
    parameters = build_model_directory(work / "model")
    start = time.perf_counter()
    ranks = rank_results("bench.support.learner_smoke", str(work / "model"), ranks=RANKS)
    wall_s = time.perf_counter() - start
    return {
        "smoke_parameters": parameters,
        "smoke_steps": STEPS,
        "smoke_wall_s": round(wall_s, 1),
        "smoke_steps_s": round(max(rank["steps_s"] for rank in ranks), 1),
        "smoke_peak_mib_per_rank": [round(rank["peak_bytes"] / 2**20) for rank in ranks],
        "smoke_steps_peak_mib_per_rank": [
            round(rank["steps_peak_bytes"] / 2**20) for rank in ranks
        ],
    }


def main() -> None:
    """One rank: load the directory, shard it, train the steps, write this rank's figures."""
    out, model_dir = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    dist.init_process_group(backend="gloo")
    model = load_model(model_dir).model
    trainer = sharded_trainer(learner_config(ROWS, SMOKE_POLICY), model)
    batch = rows_batch([32 + (LONGEST - 32) * i // (ROWS - 1) for i in range(ROWS)])
    whole_peak = peak_resident_bytes()
    reset_peak()
    start = time.perf_counter()
    for _ in range(STEPS):
        trainer.train_step(batch)
    steps_s = time.perf_counter() - start
    write_rank_result(
        out,
        {
            "steps_s": steps_s,
            "peak_bytes": max(whole_peak, peak_resident_bytes()),
            "steps_peak_bytes": peak_resident_bytes(),
        },
    )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
