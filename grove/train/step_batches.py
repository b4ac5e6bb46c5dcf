"""How ``grove train`` forms each step's batch: played by an in-process harness, or awaited from
external agents (``docs/forest.md``, "Failures and drops").

In process (``played_batch``): the step's groups are played; each is then kept or dropped by the
group rules (an abandoned attempt, no valid layout, too few verified rollouts, policy lag). Up to
``async_rl.rollout_failure.max_replacement_groups`` dropped groups — of any reason, replacements
included — are replaced by freshly played groups (``StepPlayer.play_replacements``), and the
decisions are taken again, until nothing more is dropped or the budget is spent. The step is then
published from its kept groups, unless the drops leave fewer logical rollouts than
``async_rl.rollout_failure.min_step_batch_fraction`` allows: training stops with an error that
names each dropped group, why, and — for a failed or timed-out harness — the rollout and what
happened.

External (``awaited_batch``): the step takes the first ``grpo.num_prompts_per_step`` complete
groups the rules keep, waiting for agents to complete more; a dropped group is simply never
chosen, so replacement is implicit. While it looks, the run notices attempts open without a result
for ``async_rl.rollout_failure.rollout_timeout_s`` (measured from when it first saw each open) and
abandons them (``grove.train.abandonment``): their groups are dropped.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from grove.ledger.attempt import AttemptLog
from grove.train.abandonment import abandon_attempt
from grove.train.fork_groups import SourceRollout
from grove.train.progress import StepProgress
from grove.train.rollouts import StepPlayer
from grove.train.training_run import TrainingRun
from grove.training.advantages import GroupDecision
from grove.training.groups import DropReason
from grove.training.projector import PublishedBatch

__all__ = ["OverdueAttempts", "awaited_batch", "fork_sources", "played_batch"]

POLL_INTERVAL_S = 0.5  # how often an external run looks for complete prompt groups

logger = logging.getLogger(__name__)


def _report(progress: StepProgress, line: str) -> None:
    """A drop or an abandonment: on the terminal, and in the log (``--json`` runs too)."""
    logger.warning("%s", line)
    progress.note(line)


def played_batch(
    training: TrainingRun,
    player: StepPlayer,
    progress: StepProgress,
    sources: Sequence[SourceRollout] = (),
) -> PublishedBatch | None:
    """The next step's batch, played by ``player`` (forking turns of ``sources``, the previous
    step's batch, as ``grpo.forks`` asks): rebuilt when it was published already, None when the
    task file is used up."""
    published = training.published_batch()
    if published is not None:
        return published
    step = training.step
    groups = player.play(step, progress.advance, sources)
    if groups is None:
        return None
    budget = training.config.async_rl.rollout_failure.max_replacement_groups
    per_group = training.config.grpo.num_generations_per_prompt
    replaced, noted = 0, set[str]()
    while True:
        decisions = [_explained(d, player) for d in training.group_decisions(groups)]
        dropped = [d for d in decisions if not d.kept]
        for decision in dropped:
            if decision.group_id not in noted:
                noted.add(decision.group_id)
                _report(progress, f"step {step}: dropped prompt group {_named(decision)}")
        more = min(len(dropped), budget) - replaced
        if more <= 0:
            return training.publish(decisions)
        progress.note(f"step {step}: playing {more} replacement prompt group(s)")
        progress.extend(more * per_group)
        groups += player.play_replacements(step, replaced, more, progress.advance)
        replaced += more


def fork_sources(published: PublishedBatch) -> list[SourceRollout]:
    """The rollouts of ``published`` as the fork pick sees them (``grove.train.fork_groups``)."""
    return [
        SourceRollout(
            capture_key=r.capture_key,
            group_id=r.group_id,
            reward=r.reward,
            selected=tuple(r.forest.selected),
            terminal=r.forest.terminal,
            trainable=r.forest.trainable and r.abandoned is None,
        )
        for r in published.rollouts
    ]


def _explained(decision: GroupDecision, player: StepPlayer) -> GroupDecision:
    """``decision`` with what the player saw of its failed or timed-out rollout."""
    failure = player.failures.get(decision.group_id)
    if decision.kept or failure is None or failure.reason != decision.reason:
        return decision
    return replace(decision, detail=failure.detail)


def _named(decision: GroupDecision) -> str:
    return f"{decision.group_id} ({decision.reason}" + (
        f": {decision.detail})" if decision.detail else ")"
    )


@dataclass
class OverdueAttempts:
    """Attempts of an external run open without a result for ``timeout_s``, measured from when
    the run first saw each open (``first_seen``, monotonic seconds); each is reported once."""

    timeout_s: float
    clock: Callable[[], float] = time.monotonic
    first_seen: dict[str, float] = field(default_factory=dict)
    reported: set[str] = field(default_factory=set)

    def overdue(self, open_attempts: tuple[str, ...]) -> list[str]:
        """The attempts of ``open_attempts`` open for ``timeout_s`` or longer, not reported yet."""
        now = self.clock()
        self.first_seen = {key: self.first_seen.get(key, now) for key in open_attempts}
        late = [
            key
            for key, seen in self.first_seen.items()
            if now - seen >= self.timeout_s and key not in self.reported
        ]
        self.reported.update(late)
        return late


def awaited_batch(
    training: TrainingRun, overdue: OverdueAttempts | None, progress: StepProgress
) -> PublishedBatch:
    """The next step's batch from external agents' complete prompt groups, waiting for them;
    abandons the attempts that are ``overdue`` meanwhile."""
    log = AttemptLog(training.projector.store)
    while True:
        published = training.next_batch()
        if published is not None:
            return published
        if overdue is not None:
            for key in overdue.overdue(training.projector.unselected_attempts):
                if abandon_attempt(log, key, DropReason.ROLLOUT_TIMEOUT):
                    _report(
                        progress,
                        f"step {training.step}: abandoned attempt {key}: no result within "
                        f"{overdue.timeout_s:g} s (async_rl.rollout_failure.rollout_timeout_s)",
                    )
        progress.waiting(training.step)
        time.sleep(POLL_INTERVAL_S)
