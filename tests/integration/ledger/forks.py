"""Forks recorded through the ledger's attempt log, with the fork source capture records.

``open_fork`` opens an attempt from a committed call of another as the gateway does: the fork
source is ``grove.capture.forks.fork_source`` of the source's state, and ``AttemptLog`` checks
every call that names a parent in the source (``docs/fork.md``). ``source_and_forks`` records a
source attempt, a fork of it and a fork of that fork.
"""

from __future__ import annotations

from sqlalchemy import text

from grove.capture.forks import fork_source
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import RolloutFinalized, RolloutSelected
from grove.ledger.store import EventStore

from .scenario import committed, intended, opened

SOURCE, FORK, FORK_OF_FORK = "src", "fork-1", "fork-2"


def call(
    log: AttemptLog,
    capture_key: str,
    call_id: str,
    *,
    parent: str | None = None,
    source: str | None = None,
    prev: int = 0,
) -> None:
    """Intend and commit call ``call_id`` (a continuation of ``parent``, of attempt ``source``
    when that is another, with ``prev`` tokens inherited)."""
    log.intend(capture_key, intended(call_id, parent=parent, source=source))
    log.commit(
        capture_key, committed(capture_key, call_id, parent=parent, source=source, prev=prev)
    )


def open_fork(
    log: AttemptLog, capture_key: str, source_key: str, source_call_id: str, *, group: str = "g-f"
) -> None:
    """Open ``capture_key`` (rollout ``r-KEY``) as a fork of call ``source_call_id`` of
    ``source_key``."""
    source = fork_source(capture_key, log.load(source_key), source_call_id)
    log.open(opened(capture_key, rollout_id=f"r-{capture_key}", group=group, fork_from=source))


def finish(log: AttemptLog, capture_key: str, call_ids: tuple[str, ...], reward: float) -> None:
    """Settle the attempt, select ``call_ids`` with ``reward`` and finalize it: trainable with a
    row per call when the reward is positive, else masked."""
    log.settle(capture_key, timeout_s=0)
    log.select(
        capture_key,
        RolloutSelected(policy="returned_history", call_ids=call_ids, reward=reward),
    )
    trainable = reward > 0
    log.finalize(
        capture_key,
        RolloutFinalized(
            rollout_id=f"r-{capture_key}",
            trainable=trainable,
            masked_reason=None if trainable else "blob_invalid",
            paths=tuple((c,) for c in call_ids) if trainable else (),
        ),
    )


def source_and_forks(log: AttemptLog) -> None:
    """Record ``src`` (c1 -> c2 -> c3), ``fork-1`` of src/c2 (f1 continues c2, f2 continues f1,
    and f0 is a root of its own) and ``fork-2`` of fork-1/f2 (g1 continues f2)."""
    log.open(opened(SOURCE, rollout_id="r-src", group="g-src"))
    call(log, SOURCE, "c1")
    call(log, SOURCE, "c2", parent="c1", prev=8)
    call(log, SOURCE, "c3", parent="c2", prev=16)
    open_fork(log, FORK, SOURCE, "c2")
    call(log, FORK, "f1", parent="c2", source=SOURCE, prev=16)
    call(log, FORK, "f2", parent="f1", prev=24)
    call(log, FORK, "f0")
    open_fork(log, FORK_OF_FORK, FORK, "f2")
    call(log, FORK_OF_FORK, "g1", parent="f2", source=FORK, prev=32)


def fork_columns(store: EventStore) -> tuple[list[tuple], list[tuple]]:
    """The projections' fork columns: (capture_key, fork_source_capture_key,
    fork_source_call_id) of every attempt by capture key, and (capture_key, call_id,
    source_capture_key) of every call whose parent is in another attempt, by key and call."""
    with store.engine.connect() as conn:
        attempts = conn.execute(
            text(
                "SELECT capture_key, fork_source_capture_key, fork_source_call_id "
                "FROM grove_proj_attempts ORDER BY capture_key"
            )
        ).all()
        calls = conn.execute(
            text(
                "SELECT capture_key, call_id, source_capture_key FROM grove_proj_calls "
                "WHERE source_capture_key IS NOT NULL ORDER BY capture_key, call_id"
            )
        ).all()
    return [tuple(row) for row in attempts], [tuple(row) for row in calls]
