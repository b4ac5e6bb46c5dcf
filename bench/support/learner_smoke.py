"""The larger-model smoke of ``bench/learner.py``: a Llama directory of about 63M parameters,
built offline, trained 2 steps by ``grove train`` on 2 ``torchrun`` ranks (gloo, CPU) with FSDP2,
bfloat16, activation checkpointing and sequence packing.

The directory holds random weights (seed 0: hidden 768, 10 layers, 12 attention heads over 4
key-value heads, MLP 2048, tied embeddings) and the embedded byte-level tokenizer
(``grove.capture.embedded.build_tokenizer``), saved with ``save_pretrained``. The harness is the
demo's tool agent on the demo's tasks, 4 rollouts of one prompt group per step, 16 tokens a call.

Each rank runs ``grove train`` in-process (``python -m bench.support.learner_smoke RANK_FILE
CONFIG``) and, when it ends, writes its peak resident memory (``ru_maxrss``) to ``RANK_FILE``
with its rank appended.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from transformers import LlamaConfig, LlamaForCausalLM

from grove.capture.embedded import build_tokenizer
from grove.capture.tiny_decoder import seeded

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "grove" / "demo" / "demo.yaml"
RANKS = 2


def build_model_directory(directory: Path) -> int:
    """Write the smoke's Llama directory (weights, config, tokenizer); return its parameters."""
    tokenizer = build_tokenizer()
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=10,
        num_attention_heads=12,
        num_key_value_heads=4,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    model = seeded(0, lambda: LlamaForCausalLM(config))
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


def smoke_config(model_dir: Path) -> dict[str, Any]:
    """The demo's configuration on the Llama directory, with every learner feature on."""
    config = yaml.safe_load(DEMO.read_text())
    config["model"] = {"path": str(model_dir)}
    config["data"]["path"] = str(DEMO.parent / config["data"]["path"])
    config["harness"]["options"]["max_tokens"] = 16
    config["grpo"] = {
        "num_prompts_per_step": 1,
        "num_generations_per_prompt": 4,
        "max_num_steps": 2,
    }
    config["policy"] = {
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_micro_batch_size": 2,
        "data_parallel_size": RANKS,
        "learning_rate": 1e-5,
        "max_total_sequence_length": 1024,
        "precision": "bfloat16",
        "dtensor_cfg": {"enabled": True, "activation_checkpointing": True},
        "sequence_packing": {"enabled": True, "train_mb_tokens": 2048},
    }
    return config


def run_smoke(work: Path) -> dict[str, Any]:
    """Build the directory, train 2 steps on 2 ranks; wall time and peak memory per rank."""
    parameters = build_model_directory(work / "model")
    config_path = work / "smoke.yaml"
    config_path.write_text(yaml.safe_dump(smoke_config(work / "model")))
    rank_file = work / "peak"
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(RANKS),
        "-m",
        "bench.support.learner_smoke",
        str(rank_file),
        str(config_path),
    ]
    start = time.perf_counter()
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    wall_s = time.perf_counter() - start
    if run.returncode != 0:
        raise RuntimeError(f"the larger-model smoke failed: {run.stderr[-3000:]}")
    peaks = [int(Path(f"{rank_file}{rank}").read_text()) for rank in range(RANKS)]
    return {
        "smoke_parameters": parameters,
        "smoke_steps": 2,
        "smoke_wall_s": round(wall_s, 1),
        "smoke_peak_mib_per_rank": [round(peak / 2**20) for peak in peaks],
    }


def main() -> None:
    """One rank: ``grove train CONFIG`` in this process, then its peak memory to the rank file."""
    from grove.cli import app

    rank_file, config = sys.argv[1], sys.argv[2]
    workdir = Path(config).parent / "workdir"
    try:
        app(["train", config, "--json", "--workdir", str(workdir)], standalone_mode=False)
    finally:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        Path(f"{rank_file}{os.environ.get('RANK', '0')}").write_text(json.dumps(peak))


if __name__ == "__main__":
    main()
