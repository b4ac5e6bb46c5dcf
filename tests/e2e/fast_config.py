"""A shipped example configuration made fast for the end-to-end tests.

Two steps of the demo's agent on the shipped settings take minutes on two cores; the tests run
them with a few keys overridden: no warm start (a random model answers with noise, which the
agent still returns, is scored on and compacts after), ``groups`` prompt groups of ``rollouts``
rollouts, and compaction after every question but the last (``compact_at_tokens: 1``), so every
rollout compacts and starts a new root whatever the model writes.
"""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def fast_config(name: str, directory: Path, *, groups: int, rollouts: int) -> Path:
    """``examples/NAME`` with the overrides of the module docstring, written to ``directory``."""
    config = yaml.safe_load((EXAMPLES / name).read_text())
    config["model"]["warm_start"] = False
    config["data"]["path"] = str((EXAMPLES / config["data"]["path"]).resolve())
    config["harness"]["options"]["compact_at_tokens"] = 1
    config["grpo"].update(num_prompts_per_step=groups, num_generations_per_prompt=rollouts)
    config["policy"].update(
        train_global_batch_size=groups * rollouts,
        train_micro_batch_size=rollouts,
        logprob_micro_batch_size=rollouts,
    )
    path = directory / name
    path.write_text(yaml.safe_dump(config))
    return path
