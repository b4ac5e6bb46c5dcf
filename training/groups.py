"""Which complete prompt groups a training step may take, and why the others are dropped.

A prompt group trains whole or not at all: its rollouts share one baseline, so a step takes a
group with every one of its logical rollouts or leaves the group out (``docs/forest.md``,
"Failures and drops"). ``decide_group`` applies the rules in this order; the first that holds
names the drop:

- ``rollout_timeout`` / ``harness_failed``: Grove abandoned one of the group's attempts — its
  harness did not return a result within ``async_rl.rollout_failure.rollout_timeout_s``, or it
  failed in a way that prevents one (it raised, returned no finite reward, or its result was
  refused). Grove records the abandonment as the attempt's selection: no call, no harness result,
  the policy ``abandoned:<reason>`` (``abandonment_policy``), so the decision is the ledger's and
  a result posted later is refused;
- ``no_valid_layout``: every rollout is masked; ``below_min_valid_fraction``: fewer verified
  rollouts than ``token_capture.min_valid_fraction_per_group`` (``group_decisions``);
- ``policy_lag_exceeded``: the policy versions of the calls its rows train span more than
  ``async_rl.max_policy_lag``, or the oldest of them lags the step being trained by more than it
  (``step - oldest``; the step is the trainer's optimizer steps so far, which is the version of
  the weights it trains). A call whose version is unknown (recorded by an engine that does not
  say) constrains nothing.

Every rule reads only the group's finalized rollouts and the step, so a projector rebuilt from the
ledger reaches the same decisions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, Final

from grove.training.advantages import GroupDecision, RolloutOutcome, group_decisions
from grove.training.errors import AdvantageError

__all__ = [
    "ABANDONED_POLICY_PREFIX",
    "DropReason",
    "GroupMember",
    "GroupRules",
    "abandonment_policy",
    "abandonment_reason",
    "decide_group",
]

ABANDONED_POLICY_PREFIX: Final = "abandoned:"


class DropReason(StrEnum):
    """Why a complete prompt group is left out of every step."""

    ROLLOUT_TIMEOUT = "rollout_timeout"
    HARNESS_FAILED = "harness_failed"
    NO_VALID_LAYOUT = "no_valid_layout"
    BELOW_MIN_VALID_FRACTION = "below_min_valid_fraction"
    POLICY_LAG_EXCEEDED = "policy_lag_exceeded"


ABANDONMENT_REASONS: Final = (DropReason.ROLLOUT_TIMEOUT, DropReason.HARNESS_FAILED)


def abandonment_policy(reason: DropReason) -> str:
    """The ``rollout.selected`` policy that records Grove's abandonment of an attempt."""
    if reason not in ABANDONMENT_REASONS:
        raise AdvantageError(
            "abandonment_reason",
            f"an attempt is abandoned for {[str(r) for r in ABANDONMENT_REASONS]}, got {reason!r}",
        )
    return f"{ABANDONED_POLICY_PREFIX}{reason}"


def abandonment_reason(
    policy: str, call_ids: Sequence[str], result: Mapping[str, Any] | None
) -> DropReason | None:
    """Why Grove abandoned the attempt whose recorded selection is ``policy``, ``call_ids`` and
    the harness ``result``, or None for a harness's own selection (an abandonment selects no call
    and carries no result)."""
    if call_ids or result is not None or not policy.startswith(ABANDONED_POLICY_PREFIX):
        return None
    reason = policy.removeprefix(ABANDONED_POLICY_PREFIX)
    return DropReason(reason) if reason in set(ABANDONMENT_REASONS) else None


@dataclass(frozen=True)
class GroupRules:
    """The group settings: ``min_valid_fraction`` (``token_capture.min_valid_fraction_per_group``)
    in (0, 1] or None; ``max_policy_lag`` (``async_rl.max_policy_lag``) >= 0, or None for no
    policy-version rule."""

    min_valid_fraction: float | None = None
    max_policy_lag: int | None = None

    def __post_init__(self) -> None:
        if self.max_policy_lag is not None and self.max_policy_lag < 0:
            raise AdvantageError(
                "max_policy_lag", f"max_policy_lag must be >= 0 or None, got {self.max_policy_lag}"
            )


@dataclass(frozen=True)
class GroupMember:
    """One logical rollout of a complete group, as the group rules see it (producer: the
    projector). ``abandoned`` is why Grove abandoned its attempt (None: the harness returned);
    ``policy_versions`` the known versions of the calls its rows train, ascending (empty for a
    masked rollout)."""

    outcome: RolloutOutcome
    abandoned: DropReason | None = None
    policy_versions: tuple[int, ...] = ()


def decide_group(
    group_id: str, members: Sequence[GroupMember], rules: GroupRules, step: int | None = None
) -> GroupDecision:
    """Whether the complete group ``group_id`` may train at ``step`` (None: leave out the rule
    that depends on the step), with the first rule that drops it."""
    outcomes = [m.outcome for m in members]
    verified = sum(o.verified for o in outcomes)
    for member in members:
        if member.abandoned is not None:
            detail = f"rollout {member.outcome.rollout_id} abandoned"
            return GroupDecision(group_id, False, member.abandoned, verified, len(members), detail)
    (decision,) = group_decisions(
        [replace(o, group_id=group_id) for o in outcomes], rules.min_valid_fraction
    )
    if not decision.kept:
        return decision
    lag = _policy_lag(members, rules.max_policy_lag, step)
    if lag is not None:
        return replace(decision, kept=False, reason=DropReason.POLICY_LAG_EXCEEDED, detail=lag)
    return decision


def _policy_lag(members: Sequence[GroupMember], lag: int | None, step: int | None) -> str | None:
    """Why the group's policy versions break ``lag``, or None."""
    versions = sorted({v for m in members for v in m.policy_versions})
    if lag is None or not versions:
        return None
    oldest, newest = versions[0], versions[-1]
    if newest - oldest > lag:
        return (
            f"its calls were sampled by policy versions {oldest} to {newest}, more than "
            f"max_policy_lag {lag} apart"
        )
    if step is not None and step - oldest > lag:
        return (
            f"its oldest call was sampled by policy version {oldest}, {step - oldest} behind "
            f"step {step}: more than max_policy_lag {lag}"
        )
    return None
