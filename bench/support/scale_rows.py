"""The projection rows of a ``bench/support/scale_ledger.py`` ledger, written in bulk by
``bench/scale.py``.

``ProjectionRows.fold`` makes the rows the fold (``ledger/inline_fold.py``) makes from the same
events, for attempts that keep the lifecycle rules (every event applies; no contradiction);
``bench/scale.py`` checks them row for row against ``grove.ledger.catch_up.rebuild`` of its
smallest ledger in every run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bench.support.scale_ledger import Placed
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptOpened,
    AttemptSettled,
    BatchPublished,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    RolloutFinalized,
    RolloutSelected,
)

ATTEMPT_COLUMNS = (
    "capture_key",
    "rollout_id",
    "prompt_group",
    "rollout_index",
    "policy_version",
    "forest_mode",
    "selection_policy",
    "admissions_closed",
    "settled",
    "settle_timed_out",
    "cleaned",
    "opened_position",
)
CALL_COLUMNS = (
    "capture_key",
    "call_id",
    "parent_call_id",
    "decision",
    "root_reason",
    "status",
    "late",
    "prompt_tokens",
    "prev_len",
    "delta_len",
    "cum_len",
    "generated_len",
    "blob_key",
    "blob_sha256",
    "blob_bytes",
    "finish_reason",
    "response_id",
    "failure_reason",
    "failure_detail",
    "selection_index",
    "intended_position",
    "resolved_position",
    "policy_version",
)
ROLLOUT_COLUMNS = (
    "capture_key",
    "rollout_id",
    "prompt_group",
    "policy",
    "reward",
    "terminal_response_id",
    "selected_calls",
    "status",
    "masked_reason",
    "rows",
    "step",
    "selected_position",
)


@dataclass
class ProjectionRows:
    """The rows the fold makes from events of attempts that keep the lifecycle rules (every
    event applies; no contradiction), by table."""

    attempts: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    rollouts: dict[str, dict[str, Any]] = field(default_factory=dict)
    streams: dict[str, int] = field(default_factory=dict)

    def fold(self, placed: Sequence[Placed]) -> None:
        """Apply events in position order."""
        for item in placed:
            self.streams[item.stream_id] = item.stream_version
            self._apply(item.stream_id, item.position, item.event)

    def _apply(self, key: str, position: int, event: Event) -> None:
        if isinstance(event, AttemptOpened):
            self.attempts[key] = {
                "capture_key": key,
                "rollout_id": event.rollout_id,
                "prompt_group": event.prompt_group,
                "rollout_index": event.rollout_index,
                "policy_version": event.policy_version,
                "forest_mode": event.forest_mode,
                "selection_policy": event.selection_policy,
                "admissions_closed": False,
                "settled": False,
                "settle_timed_out": False,
                "cleaned": False,
                "opened_position": position,
            }
        elif isinstance(event, AdmissionsClosed):
            self.attempts[key]["admissions_closed"] = True
        elif isinstance(event, AttemptSettled):
            self.attempts[key].update(
                settled=True, admissions_closed=True, settle_timed_out=event.timed_out
            )
        elif isinstance(event, CallIntended):
            row = dict.fromkeys(CALL_COLUMNS)
            row.update(
                capture_key=key,
                call_id=event.call_id,
                parent_call_id=event.parent_call_id,
                decision=event.decision,
                root_reason=event.root_reason,
                status="pending",
                late=False,
                prompt_tokens=event.prompt_tokens,
                intended_position=position,
                policy_version=event.policy_version,
            )
            self.calls[key, event.call_id] = row
        elif isinstance(event, CallCommitted):
            row = self.calls[key, event.call_id]
            for name in (
                "prev_len",
                "delta_len",
                "cum_len",
                "generated_len",
                "blob_key",
                "blob_sha256",
                "blob_bytes",
                "finish_reason",
                "response_id",
            ):
                row[name] = getattr(event, name)
            if event.policy_version is not None:
                row["policy_version"] = event.policy_version
            row.update(status="committed", late=self.attempts[key]["settled"])
            row["resolved_position"] = position
        elif isinstance(event, CallFailed):
            row = self.calls[key, event.call_id]
            row.update(failure_reason=event.reason, failure_detail=event.detail)
            if row["status"] == "pending":
                row.update(status="failed", resolved_position=position)
        elif isinstance(event, RolloutSelected):
            attempt = self.attempts[key]
            self.rollouts[key] = {
                "capture_key": key,
                "rollout_id": attempt["rollout_id"],
                "prompt_group": attempt["prompt_group"],
                "policy": event.policy,
                "reward": event.reward,
                "terminal_response_id": event.terminal_response_id,
                "selected_calls": len(event.call_ids),
                "status": "selected",
                "masked_reason": None,
                "rows": None,
                "step": None,
                "selected_position": position,
            }
            for index, call_id in enumerate(event.call_ids):
                self.calls[key, call_id]["selection_index"] = index
        elif isinstance(event, RolloutFinalized):
            self.rollouts[key].update(
                status="trainable" if event.trainable else "masked",
                masked_reason=event.masked_reason,
                rows=len(event.paths),
            )
        elif isinstance(event, BatchPublished):
            for rollout_id in event.rollout_ids:  # capture key = rollout id in these ledgers
                rollout = self.rollouts.get(rollout_id)
                if rollout is not None and rollout["status"] == "trainable":
                    rollout["step"] = event.step
        else:
            raise TypeError(f"no projection rule here for {event.type}")

    def tables(self) -> dict[str, list[tuple[Any, ...]]]:
        """The rows by table name, as tuples in the order of the ``*_COLUMNS``."""
        return {
            "grove_proj_attempts": [
                tuple(r[c] for c in ATTEMPT_COLUMNS) for r in self.attempts.values()
            ],
            "grove_proj_calls": [tuple(r[c] for c in CALL_COLUMNS) for r in self.calls.values()],
            "grove_proj_rollouts": [
                tuple(r[c] for c in ROLLOUT_COLUMNS) for r in self.rollouts.values()
            ],
            "grove_proj_streams": sorted(self.streams.items()),
        }


TABLE_COLUMNS = {
    "grove_proj_attempts": ATTEMPT_COLUMNS,
    "grove_proj_calls": CALL_COLUMNS,
    "grove_proj_rollouts": ROLLOUT_COLUMNS,
    "grove_proj_streams": ("stream_id", "version"),
}
