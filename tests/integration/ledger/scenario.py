"""Events of one small rollout, built by keyword so each test says only what it cares about."""

from __future__ import annotations

import hashlib

from grove.ledger.database import translate_errors
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptOpened,
    AttemptSettled,
    CallCommitted,
    CallFailed,
    CallIntended,
    ForkSource,
    ReplaySummary,
    RolloutFinalized,
    RolloutSelected,
)
from grove.ledger.store import EventStore

SUMMARY = ReplaySummary(
    normalization_version=1,
    item_count=1,
    source_digest="0" * 64,
    canonical_source_digest="0" * 64,
    render_options_digest="1" * 64,
)


def execute_raw(store: EventStore, statement: str) -> None:
    """Run ``statement`` on the store's database, with database errors translated as Grove does."""
    with translate_errors(store.url), store.engine.begin() as conn:
        conn.exec_driver_sql(statement)


def digest(text: str) -> str:
    """A sha256 hex digest of ``text``."""
    return hashlib.sha256(text.encode()).hexdigest()


def opened(
    capture_key: str,
    *,
    rollout_id: str = "r0",
    group: str = "g0",
    fork_from: ForkSource | None = None,
) -> AttemptOpened:
    """``attempt.opened`` for rollout ``rollout_id`` of prompt group ``group`` (a fork of
    ``fork_from`` when given)."""
    return AttemptOpened(
        capture_key=capture_key,
        rollout_id=rollout_id,
        prompt_group=group,
        rollout_index=0,
        policy_version=0,
        model_fingerprint="tiny",
        template_fingerprint="chatml",
        fork_from=fork_from,
    )


def intended(
    call_id: str,
    *,
    parent: str | None = None,
    source: str | None = None,
    prompt_tokens: int = 5,
    policy_version: int | None = None,
) -> CallIntended:
    """``call.intended``: a root without ``parent``, else a continuation (of call ``parent``
    of attempt ``source``, a fork's source, when given)."""
    return CallIntended(
        call_id=call_id,
        decision="continuation" if parent else "root",
        parent_call_id=parent,
        source_capture_key=source,
        root_reason=None if parent else "initial",
        replay_summary=SUMMARY,
        prompt_tokens=prompt_tokens,
        policy_version=policy_version,
    )


def committed(
    capture_key: str,
    call_id: str,
    *,
    parent: str | None = None,
    source: str | None = None,
    prev: int = 0,
    new: int = 8,
    policy_version: int | None = None,
) -> CallCommitted:
    """``call.committed`` with ``new`` tokens (3 of them generated) on top of ``prev``
    (``source``: the attempt that owns ``parent``, when another)."""
    return CallCommitted(
        call_id=call_id,
        parent_call_id=parent,
        source_capture_key=source,
        prev_len=prev,
        delta_len=new,
        cum_len=prev + new,
        prompt_delta_len=new - 3,
        generated_len=3,
        blob_key=f"staging/{capture_key}/{call_id}",
        blob_sha256=digest(call_id),
        blob_bytes=100,
        chain_digest=digest("chain" + call_id),
        finish_reason="stop",
        response_id=f"resp-{call_id}",
        output_fingerprint=digest("out" + call_id),
        replay_summary=SUMMARY,
        policy_version=policy_version,
    )


def compaction_rollout(
    capture_key: str,
    *,
    rollout_id: str = "r0",
    group: str = "g0",
    policy_version: int | None = None,
) -> list:
    """The seed's example: c1 -> c2; rewrite roots c3; c4 rejected; retry c5 accepted.

    Also a failed call c6 and a late commit of c7 after settling. Every intent and commit
    records ``policy_version``.
    """
    v = policy_version
    return [
        opened(capture_key, rollout_id=rollout_id, group=group),
        intended("c1", policy_version=v),
        committed(capture_key, "c1", policy_version=v),
        intended("c2", parent="c1", policy_version=v),
        committed(capture_key, "c2", parent="c1", prev=8, policy_version=v),
        intended("c3", policy_version=v),
        committed(capture_key, "c3", policy_version=v),
        intended("c4", parent="c3", policy_version=v),
        committed(capture_key, "c4", parent="c3", prev=8, policy_version=v),
        intended("c5", parent="c3", policy_version=v),
        committed(capture_key, "c5", parent="c3", prev=8, policy_version=v),
        intended("c6", parent="c5", policy_version=v),
        CallFailed(call_id="c6", reason="engine_error", detail="boom"),
        intended("c7", parent="c5", policy_version=v),
        AdmissionsClosed(),
        AttemptSettled(pending_call_ids=("c7",), timed_out=True),
        committed(capture_key, "c7", parent="c5", prev=16, policy_version=v),
        RolloutSelected(
            policy="returned_history",
            call_ids=("c1", "c2", "c3", "c5"),
            terminal_response_id="resp-c5",
            reward=1.0,
        ),
        RolloutFinalized(
            rollout_id=rollout_id,
            trainable=True,
            paths=(("c1", "c2"), ("c3", "c5")),
            owned=(("c1", "c2"), ("c3", "c5")),
        ),
    ]
