"""Abandoning an attempt whose harness will not deliver a result (``docs/forest.md``, "Failures
and drops").

When a rollout outlives ``async_rl.rollout_failure.rollout_timeout_s``, or its in-process harness
fails in a way that prevents a result, the training run abandons its attempt, in three ledger
writes: it closes the attempt's admissions (every later call of the harness is refused, 409
``attempt_closed``, so the harness unwinds), settles it at once (calls still generating stay
pending and are late if they commit), and records its selection as an abandonment — no call, no
harness result, the policy ``abandoned:<reason>`` (``grove.training.groups.abandonment_policy``).
The projector finalizes it masked and drops its prompt group with that reason; a result posted later
is refused (the attempt's selection is recorded once), and a resumed run does not play it again.
"""

from __future__ import annotations

import contextlib

from grove.ledger.attempt import AttemptLog
from grove.ledger.errors import EventIdConflict
from grove.ledger.events import RolloutSelected
from grove.training.groups import DropReason, abandonment_policy, abandonment_reason

__all__ = ["abandon_attempt"]


def abandon_attempt(log: AttemptLog, capture_key: str, reason: DropReason) -> bool:
    """Abandon the attempt ``capture_key`` for ``reason``; False when its harness's result was
    recorded first (the attempt completed: it is not abandoned)."""
    selection = log.load(capture_key).selection
    if selection is not None:
        recorded = abandonment_reason(selection.policy, selection.call_ids, selection.result)
        return recorded is not None
    log.close_admissions(capture_key)
    if log.load(capture_key).settled is None:
        # The gateway may settle it for a result meanwhile; the selection decides below.
        with contextlib.suppress(EventIdConflict):
            log.settle(capture_key, timeout_s=0.0)
    abandoned = RolloutSelected(policy=abandonment_policy(reason), call_ids=(), reward=0.0)
    try:
        log.select(capture_key, abandoned)
    except EventIdConflict:
        return False  # the harness's result was selected first
    return True
