"""One trainer step in a fresh process, and the resident memory it added at its peak.

Usage: ``python -m bench.support.learner_peak POLICY_JSON ROWS LENGTH``, started with
``bench.support.memory.FREED_TO_KERNEL`` in its environment; prints one JSON object,
``{"step_peak_bytes": N}``. A first step creates AdamW's state; then the peak is reset
(``bench.support.memory.reset_peak``) and ``N`` is the peak resident memory of the second step
less the resident memory before it: the step's activations, its logits and their gradients, and
the transients of backward and the optimizer. ``bench/learner.py`` runs one process per side, so
neither side's peak hides the other's.
"""

from __future__ import annotations

import json
import sys

import torch

from bench.support.learner_workload import grove_trainer, rows_batch
from bench.support.memory import peak_resident_bytes, reset_peak, resident_bytes


def main() -> None:
    """Build the trainer and the rows, take two steps, print the peak the second one added."""
    torch.set_num_threads(1)
    policy, rows, length = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    batch = rows_batch([length] * rows)
    trainer = grove_trainer(batch, policy)
    trainer.train_step(batch)
    reset_peak()
    before = resident_bytes()
    trainer.train_step(batch)
    print(json.dumps({"step_peak_bytes": peak_resident_bytes() - before}))


if __name__ == "__main__":
    main()
