"""Per-state groups: which recorded calls a step forks, and what its fork groups scored
(``grpo.forks``, ``docs/fork.md``, "Per-state groups").

From step 1 on, ``grpo.forks.per_step`` (K) of a step's ``grpo.num_prompts_per_step`` prompt
groups are *fork groups*: each continues one committed call of the previous step's batch,
``grpo.num_generations_per_prompt`` times, so its rollouts share that state and their advantages
compare only what each did from there (credit for one turn, without a critic). The other groups
play tasks as usual.

The candidates are the turns of the previous step's trainable rollouts of task groups (forks are
not forked again by ``grove train``): each selected call but the scored terminal one, after which
nothing is left to play. Their blobs outlive the previous step's cleanup, since a published
trainable rollout keeps its selected calls' blobs. The rule (``grpo.forks.pick``):

- ``uniform``: K distinct turns drawn uniformly from every candidate;
- ``low_reward``: the same draw among the turns of rollouts whose reward is below their group's
  mean (the rollouts that went wrong somewhere), falling back to every candidate when there is
  none.

The draw is seeded by the run's seed and the step alone, and the candidates are ordered as the
batch orders its rollouts, so a resumed run forks the same calls. With fewer than K candidates
the step forks what there is and plays tasks in the other groups.

Each step logs ``forks/groups`` (fork groups in its batch) and, when there are some,
``forks/reward_variance``: the mean over fork groups of the variance of their rollouts' rewards
(population variance; 0 when every fork of a state scored alike, so the group teaches nothing).

Pure: plain data in, plain data out (the player reads the previous batch, ``grove.train.rollouts``).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean, pvariance
from typing import Literal

__all__ = [
    "ForkPick",
    "PickRule",
    "SourceRollout",
    "fork_candidates",
    "fork_metrics",
    "pick_forks",
]

PickRule = Literal["uniform", "low_reward"]


@dataclass(frozen=True)
class SourceRollout:
    """A rollout of the previous step's batch, as the pick sees it: its attempt, prompt group,
    reward, selected calls (its own, in selection order), scored call, and whether it trains."""

    capture_key: str
    group_id: str
    reward: float
    selected: tuple[str, ...]
    terminal: str | None
    trainable: bool


@dataclass(frozen=True)
class ForkPick:
    """A call to fork: committed call ``call_id`` of attempt ``capture_key``, of a rollout of
    prompt group ``group_id`` (whose task the fork group plays again)."""

    capture_key: str
    call_id: str
    group_id: str


def fork_candidates(rollouts: Sequence[SourceRollout], rule: PickRule) -> list[ForkPick]:
    """The turns ``rule`` may fork among ``rollouts`` (task groups' rollouts, batch order)."""
    trainable = [r for r in rollouts if r.trainable]
    if rule == "low_reward":
        means = {
            group: fmean(r.reward for r in trainable if r.group_id == group)
            for group in {r.group_id for r in trainable}
        }
        low = [r for r in trainable if r.reward < means[r.group_id]]
        trainable = low or trainable
    return [
        ForkPick(r.capture_key, call_id, r.group_id)
        for r in trainable
        for call_id in r.selected
        if call_id != r.terminal and "/" not in call_id  # "/": a fork's source call, not its own
    ]


def pick_forks(
    candidates: Sequence[ForkPick], *, count: int, seed: int, step: int
) -> list[ForkPick]:
    """``count`` of ``candidates`` (all of them when fewer), drawn uniformly with a generator
    seeded by ``seed`` and ``step``; in draw order."""
    if count >= len(candidates):
        return list(candidates)
    return random.Random(f"grove-forks/{seed}/{step}").sample(list(candidates), count)


def fork_metrics(rewards: Mapping[str, Sequence[float]]) -> dict[str, float]:
    """The step's fork metrics from the rewards of each fork group in its batch."""
    metrics = {"forks/groups": float(len(rewards))}
    if rewards:
        metrics["forks/reward_variance"] = fmean(pvariance(r) for r in rewards.values())
    return metrics
