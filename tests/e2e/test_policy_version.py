"""``grove train`` records the policy version each call was sampled with: the calls of step ``s``'s
rollouts were sampled by the weights after ``s`` optimizer steps, so ``grove_calls`` shows version
``s`` on them (``docs/events.md``, "Policy versions")."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from sqlalchemy import text

from grove.ledger.catch_up import catch_up
from grove.ledger.store import EventStore

GROVE = str(Path(sys.executable).parent / "grove")
RUN = "pv1"

# The calls per (step, policy version, status) of run pv1: prompt groups are RUN-sSTEP-gG.
QUERY = text(
    "SELECT prompt_group, policy_version, status, COUNT(*) AS calls FROM grove_calls "
    "WHERE prompt_group LIKE 'pv1-%' GROUP BY prompt_group, policy_version, status"
)


def write_config(directory: Path) -> Path:
    """Two steps of the recency agent on the embedded model: 1 group x 2 rollouts a step."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tasks.jsonl").write_text('{"prompt": "Say hello in plain words."}\n')
    config = {
        "seed": 5,
        "model": {"path": "embedded"},
        "harness": {
            "target": "examples.recency_agent:play",
            "options": {"turns": 2, "keep_rounds": 1, "max_tokens": 4},
        },
        "data": {"path": "tasks.jsonl", "epochs": 10},
        "token_capture": {"pending_call_timeout_s": 30},
        "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": 2, "max_num_steps": 2},
        "policy": {
            "train_global_batch_size": 2,
            "train_micro_batch_size": 2,
            "logprob_micro_batch_size": 2,
        },
    }
    path = directory / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_each_steps_calls_record_the_policy_version_they_were_sampled_with(tmp_path: Path):
    work = tmp_path / "work"
    config = write_config(tmp_path / "cfg")
    result = subprocess.run(
        [GROVE, "train", str(config), "--json", "--run", RUN, "--workdir", str(work)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONHASHSEED": "0"},
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    store = EventStore.open(f"sqlite:///{work / 'ledger.db'}")
    try:
        catch_up(store)
        with store.engine.connect() as conn:
            rows = conn.execute(QUERY).all()
    finally:
        store.close()
    versions: dict[int, set[int | None]] = {}
    committed: dict[int, int] = {}
    for row in rows:
        step = int(row.prompt_group.split("-")[1].removeprefix("s"))
        versions.setdefault(step, set()).add(row.policy_version)
        if row.status == "committed":
            committed[step] = committed.get(step, 0) + row.calls
    assert versions == {0: {0}, 1: {1}}
    assert committed[0] >= 2 and committed[1] >= 2  # every rollout made at least one call
