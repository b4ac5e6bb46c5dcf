"""One trainer step in a fresh process, and the resident memory it added at its peak.

Usage: ``python -m bench.support.learner_peak POLICY_JSON ROWS LENGTH``; prints one JSON object,
``{"step_peak_bytes": N}``: the process's ``ru_maxrss`` after the step less before it (the model,
its trainer and the rows already built). Run by ``bench/learner.py``, one process per side, so
neither side's peak hides the other's.
"""

from __future__ import annotations

import json
import resource
import sys

import torch

from bench.learner import grove_trainer, rows_batch


def max_rss_bytes() -> int:
    """This process's peak resident memory so far (Linux reports kibibytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main() -> None:
    """Build the trainer and the rows, take one step, print the peak it added."""
    torch.set_num_threads(1)
    policy, rows, length = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    batch = rows_batch([length] * rows)
    trainer = grove_trainer(batch, policy)
    before = max_rss_bytes()
    trainer.train_step(batch)
    print(json.dumps({"step_peak_bytes": max_rss_bytes() - before}))


if __name__ == "__main__":
    main()
