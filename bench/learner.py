"""The learner: Grove's trainer step against a plain transformers + AdamW loop, and what each
learner feature buys, each as a ratio measured in one run.

Usage: ``python -m bench.learner [--quick] [--json] [--smoke]``

- ``learner_over_plain``: tokens/s of ``Trainer.train_step`` (the trainer
  ``grove.train.training_run.build_trainer`` builds from a configuration) over a plain loop on the
  same rows and micro batches: the same model (the embedded Qwen2 shape, hidden 128, 4 layers,
  float32, CPU), ``model(ids).logits``, float32 log-softmax, the same clipped policy-gradient
  loss divided by the step's tokens, ``clip_grad_norm_`` and one ``torch.optim.AdamW`` step. The
  two sides alternate, the first round of each warms up and is not counted, and torch runs on one
  thread. Times are the process's CPU time, which other processes on a shared machine inflate far
  less than wall time. Aim: >= 0.9.
- ``packed_over_padded``: tokens/s with ``policy.sequence_packing.enabled`` over padded micro
  batches of 4 rows, on 8 rows whose lengths vary 8x, bins of at most the longest row
  (``train_mb_tokens = max_total_sequence_length``). Aim: >= 1.5.
  ``packed_wide_bins_over_padded`` is the same with bins of 4 longest rows: a bin is one
  sequence under a dense block-diagonal mask, so its attention costs the square of the bin.
- ``fsdp_bytes_per_rank_over_single``: parameter and optimizer bytes one rank holds
  (``grove.training.fsdp.rank_state_bytes``) with the model sharded by FSDP2 on 2 ``torchrun``
  ranks (gloo), over one unsharded process's, after one step
  (``bench/support/learner_fsdp.py``). Aim: <= 0.55.
- ``checkpointed_peak_over_plain``: the peak resident memory a step adds, with
  ``policy.dtensor_cfg.activation_checkpointing`` over without, on long rows; each side runs in
  a fresh process (``bench/support/learner_peak.py``) whose freed memory goes back to the kernel,
  so its resident memory follows the live tensors. Aim: <= 0.6.
- ``bf16_tmpe_max``: the largest TMPE of ``grove demo``'s configuration with
  ``policy.precision: bfloat16``; ``float32_tmpe_max`` beside it, the same steps in float32.
  Reported.

The full run (and ``--smoke`` alone) adds the larger-model smoke
(``bench/support/learner_smoke.py``): a 63M-parameter Llama directory built offline, 2 steps on 2
``torchrun`` ranks with FSDP2, bfloat16, activation checkpointing and sequence packing; its wall
time and each rank's peak resident memory.

A figure whose learner feature the configuration does not accept is ``null``, and
``not_measured`` says why (the configuration's own refusal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import yaml

from bench.support.learner_smoke import SMOKE_POLICY, run_smoke
from bench.support.learner_workload import (
    MICRO_BATCH,
    bench_model,
    grove_trainer,
    learner_config,
    rows_batch,
    varied_lengths,
)
from bench.support.memory import FREED_TO_KERNEL
from bench.support.report import print_figures
from bench.support.torchrun import rank_results
from grove.config.loading import ConfigurationError
from grove.training.trainer import StepBatch

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "grove" / "demo" / "demo.yaml"
CLIP = 0.2


def refusal(rollouts: int, policy: dict[str, Any]) -> str | None:
    """Why the configuration refuses ``policy``, or None when it loads."""
    try:
        learner_config(rollouts, policy)
    except ConfigurationError as error:
        return str(error)
    return None


class PlainLoop:
    """The baseline: one step of a plain transformers + AdamW loop over fixed micro batches."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)

    def train_step(self, batch: StepBatch) -> None:
        """Forward and backward each micro batch, clip, one AdamW step."""
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        tokens = batch.loss_mask.sum()
        for start in range(0, batch.rows, MICRO_BATCH):
            ids = batch.token_ids[start : start + MICRO_BATCH]  # (r, T)
            logits = self.model(ids).logits.float()  # (r, T, V)
            logprobs = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
            ratio = torch.exp(logprobs - batch.generation_logprobs[start : start + MICRO_BATCH, 1:])
            advantage = batch.advantages[start : start + MICRO_BATCH, None]
            clipped = torch.clamp(ratio, 1 - CLIP, 1 + CLIP) * advantage
            mask = batch.loss_mask[start : start + MICRO_BATCH, 1:]
            loss = -(torch.minimum(ratio * advantage, clipped) * mask).sum() / tokens
            loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()


def alternating_step_s(
    sides: dict[str, Callable[[StepBatch], object]], batch: StepBatch, rounds: int
) -> dict[str, float]:
    """Median step time of each side, in this process's CPU time, over ``rounds`` rounds that
    alternate the sides' order; the first round warms up and is not counted."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    order = list(sides.items())
    for index in range(rounds + 1):
        for name, step in order if index % 2 else order[::-1]:
            start = time.process_time()
            step(batch)
            if index:
                times[name].append(time.process_time() - start)
    return {name: statistics.median(values) for name, values in times.items()}


def real_tokens(batch: StepBatch) -> int:
    """Tokens of the rows without their right padding."""
    columns = torch.arange(1, batch.loss_mask.shape[1] + 1)
    return int(torch.where(batch.loss_mask, columns, 0).amax(dim=1).sum())


def learner_over_plain(rows: int, length: int, rounds: int) -> dict[str, float]:
    """Grove's step and the plain loop's on the same rows, in tokens/s, and their ratio."""
    batch = rows_batch([length] * rows)
    grove = grove_trainer(batch)
    plain = PlainLoop(bench_model())
    step_s = alternating_step_s(
        {"grove": grove.train_step, "plain": plain.train_step}, batch, rounds
    )
    tokens = real_tokens(batch)
    return {
        "learner_over_plain": round(step_s["plain"] / step_s["grove"], 3),
        "grove_tokens_per_s": round(tokens / step_s["grove"]),
        "plain_tokens_per_s": round(tokens / step_s["plain"]),
    }


def packing(longest: int, bin_tokens: int) -> dict[str, Any]:
    """The policy keys of sequence packing into bins of ``bin_tokens``, rows of up to
    ``longest`` tokens."""
    return {
        "max_total_sequence_length": longest,
        "sequence_packing": {"enabled": True, "train_mb_tokens": bin_tokens},
    }


def packed_over_padded(rows: int, longest: int, rounds: int) -> dict[str, float]:
    """Tokens/s with sequence packing over padded rows, row lengths from ``longest / 8`` to
    ``longest``; bins of the longest row, and of ``MICRO_BATCH`` longest rows."""
    batch = rows_batch(varied_lengths(rows, longest))
    step_s = alternating_step_s(
        {
            "packed": grove_trainer(batch, packing(longest, longest)).train_step,
            "wide": grove_trainer(batch, packing(longest, longest * MICRO_BATCH)).train_step,
            "padded": grove_trainer(batch).train_step,
        },
        batch,
        rounds,
    )
    return {
        "packed_over_padded": round(step_s["padded"] / step_s["packed"], 3),
        "packed_wide_bins_over_padded": round(step_s["padded"] / step_s["wide"], 3),
        "packed_step_s": round(step_s["packed"], 4),
        "padded_step_s": round(step_s["padded"], 4),
    }


def fsdp_bytes_per_rank_over_single() -> dict[str, float]:
    """Parameter and optimizer bytes per rank on 2 FSDP2 ranks over one process's."""
    ranks = rank_results("bench.support.learner_fsdp", ranks=2)
    single = ranks[0]["single_state_bytes"]
    per_rank = max(rank["rank_state_bytes"] for rank in ranks)
    return {
        "fsdp_bytes_per_rank_over_single": round(per_rank / single, 3),
        "fsdp_rank_state_mib": round(per_rank / 2**20, 2),
        "single_state_mib": round(single / 2**20, 2),
    }


def step_peak_bytes(policy: dict[str, Any], rows: int, length: int) -> int:
    """The resident memory one step adds at its peak, in a fresh process."""
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.support.learner_peak",
            json.dumps(policy),
            str(rows),
            str(length),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **FREED_TO_KERNEL},
    )
    if run.returncode != 0:
        raise RuntimeError(f"the peak-memory step failed: {run.stderr[-2000:]}")
    return int(json.loads(run.stdout.strip().splitlines()[-1])["step_peak_bytes"])


def checkpointed_peak_over_plain(rows: int, length: int) -> dict[str, float]:
    """A step's added peak memory with activation checkpointing over without."""
    checkpointed = step_peak_bytes(
        {"dtensor_cfg": {"activation_checkpointing": True}}, rows, length
    )
    plain = step_peak_bytes({}, rows, length)
    return {
        "checkpointed_peak_over_plain": round(checkpointed / plain, 3),
        "checkpointed_step_peak_mib": round(checkpointed / 2**20, 1),
        "plain_step_peak_mib": round(plain / 2**20, 1),
    }


def demo_max_tmpe(precision: str, steps: int) -> float:
    """The largest TMPE of ``steps`` steps of ``grove train`` on the demo's configuration with
    ``policy.precision: precision``."""
    config = yaml.safe_load(DEMO.read_text())
    config["data"]["path"] = str(DEMO.parent / config["data"]["path"])
    config["policy"]["precision"] = precision
    with tempfile.TemporaryDirectory() as work:
        path = Path(work) / f"demo-{precision}.yaml"
        path.write_text(yaml.safe_dump(config))
        grove = str(Path(sys.executable).parent / "grove")
        command = [grove, "train", str(path), "--json", "--steps", str(steps), "--workdir", work]
        run = subprocess.run(
            command,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
    if run.returncode != 0:
        raise RuntimeError(f"the {precision} demo failed: {run.stderr[-2000:]}")
    return float(json.loads(run.stdout.strip().splitlines()[-1])["max_tmpe"])


def bf16_tmpe_max(steps: int) -> dict[str, float]:
    """The largest TMPE of ``steps`` steps of the demo in bfloat16, and in float32 beside it."""
    return {
        "bf16_tmpe_max": demo_max_tmpe("bfloat16", steps),
        "float32_tmpe_max": demo_max_tmpe("float32", steps),
        "bf16_demo_steps": steps,
    }


def larger_model_smoke() -> dict[str, Any]:
    """The larger-model smoke, in a temporary directory."""
    with tempfile.TemporaryDirectory() as work:
        return run_smoke(Path(work))


FEATURES: dict[str, dict[str, Any]] = {
    "packed_over_padded": packing(512, 512),
    "checkpointed_peak_over_plain": {"dtensor_cfg": {"activation_checkpointing": True}},
    "bf16_tmpe_max": {"precision": "bfloat16"},
    "smoke": SMOKE_POLICY,
}
"""The policy keys each figure needs; a figure whose keys the configuration refuses is not
measured. The FSDP2 figures build the sharded learner from ``grove.training.fsdp`` itself."""


def run(quick: bool, *, figures: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Every figure (or those named), on the quick or the full workload."""
    torch.set_num_threads(1)
    rounds = 3 if quick else 7
    measures: dict[str, Callable[[], dict[str, Any]]] = {
        "learner_over_plain": lambda: learner_over_plain(8, 256 if quick else 512, rounds),
        "packed_over_padded": lambda: packed_over_padded(8, 512 if quick else 1024, rounds),
        "fsdp_bytes_per_rank_over_single": fsdp_bytes_per_rank_over_single,
        "checkpointed_peak_over_plain": lambda: checkpointed_peak_over_plain(
            4, 1024 if quick else 2048
        ),
        "bf16_tmpe_max": lambda: bf16_tmpe_max(2 if quick else 10),
        "smoke": larger_model_smoke,
    }
    if figures is None and quick:
        figures = tuple(name for name in measures if name != "smoke")
    results: dict[str, Any] = {"quick": quick}
    not_measured: dict[str, str] = {}
    for name, measure in measures.items():
        if figures is not None and name not in figures:
            continue
        refused = refusal(8, FEATURES[name]) if name in FEATURES else None
        if refused is not None:
            results[name] = None
            not_measured[name] = refused
            continue
        results.update(measure())
    results["not_measured"] = not_measured
    return results


def main() -> None:
    """Run the benchmark; print a table, or one JSON object with ``--json``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter rows and fewer rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--smoke", action="store_true", help="only the larger-model smoke")
    arguments = parser.parse_args()
    results = run(arguments.quick, figures=("smoke",) if arguments.smoke else None)
    print_figures(results, as_json=arguments.json)


if __name__ == "__main__":
    main()
