"""Crash points: a process kills itself with SIGKILL at a named point of the capture or training
path, chosen by ``GROVE_CRASH_AT=POINT:N`` (the N-th time this process reaches POINT).

Product code carries no hook: ``install`` wraps the product function at each point in this
process only (the launcher calls it before the gateway or the worker starts), so the rest of
the code runs unchanged. Before dying, the process appends one JSON line to ``GROVE_CRASH_LOG``
naming the point and what was in flight (capture key, call id, blob key, step), which tells the
test what to look for afterwards. Unset, nothing is wrapped.

=====================  =======  ==================================================================
point                  process  the process dies
=====================  =======  ==================================================================
intent_uncommitted     gateway  inside the append of a ``call.intended``: row inserted, transaction
                                not committed
after_intent           gateway  after the intent is recorded, before inference
after_blob_put         gateway  after the delta blob is stored, before ``call.committed``
after_commit           gateway  after ``call.committed``, before the answer reaches the client
after_finalize         worker   after a ``rollout.finalized`` (projection half done)
after_publish          worker   after ``batch.published``, before the optimizer step
checkpoint_write       worker   after the N-th fsync of a checkpoint write (1-5: its files, 6: its
                                manifest, 7: after the rename into place)
=====================  =======  ==================================================================
"""

from __future__ import annotations

import functools
import json
import os
import signal
from collections.abc import Callable, Mapping
from typing import Any, Final

import grove.training.checkpoint
from grove.ledger.attempt import AttemptLog
from grove.ledger.events import BatchPublished, CallIntended
from grove.ledger.postgres import PostgresBackend
from grove.ledger.sqlite import SqliteBackend
from grove.ledger.store import EventStore
from grove.storage import BlobStore

__all__ = [
    "CRASH_AT_ENV",
    "CRASH_LOG_ENV",
    "GATEWAY_POINTS",
    "WORKER_POINTS",
    "install",
    "parse",
]

CRASH_AT_ENV: Final = "GROVE_CRASH_AT"
CRASH_LOG_ENV: Final = "GROVE_CRASH_LOG"
GATEWAY_POINTS: Final = ("intent_uncommitted", "after_intent", "after_blob_put", "after_commit")
WORKER_POINTS: Final = ("after_finalize", "after_publish", "checkpoint_write")

Context = Mapping[str, Any]
Probe = Callable[[tuple[Any, ...], Any], Context | None]
"""``(arguments, result) -> what was in flight``, or None when the call is not the point."""


def parse(spec: str) -> tuple[str, int]:
    """``"POINT:N"`` as ``(POINT, N)``; ``ValueError`` for an unknown point or N < 1."""
    point, _, count = spec.partition(":")
    if point not in GATEWAY_POINTS + WORKER_POINTS or not count.isdigit() or int(count) < 1:
        raise ValueError(
            f"{CRASH_AT_ENV}={spec!r}: expected POINT:N with N >= 1 and POINT one of "
            f"{', '.join(GATEWAY_POINTS + WORKER_POINTS)}"
        )
    return point, int(count)


def _die(point: str, count: int, context: Context) -> None:
    log = os.environ.get(CRASH_LOG_ENV)
    if log:
        line = json.dumps({"point": point, "count": count, "pid": os.getpid(), **context})
        with open(log, "a") as handle:
            handle.write(line + "\n")
    os.kill(os.getpid(), signal.SIGKILL)


def _wrap_after(owner: object, name: str, probe: Probe, reached: Callable[[Context], None]) -> None:
    """Replace ``owner.name`` by a wrapper that calls ``reached`` after it returns, when the
    probe names the call as the crash point."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        context = probe(args, result)
        if context is not None:
            reached(context)
        return result

    setattr(owner, name, wrapper)


def _intent_rows(args: tuple[Any, ...], result: Any) -> Context | None:
    batch = args[2]  # (backend, connection, batch)
    intents = [e for e in batch.events if isinstance(e, CallIntended)]
    if not intents:
        return None
    return {"capture_key": batch.stream_id, "call_id": intents[0].call_id}


def _call_event(args: tuple[Any, ...], result: Any) -> Context:
    return {"capture_key": args[1], "call_id": args[2].call_id}  # (log, capture key, event)


def _published(args: tuple[Any, ...], result: Any) -> Context | None:
    events = [getattr(item, "event", item) for item in args[2]]  # (store, stream, events)
    steps = [e.step for e in events if isinstance(e, BatchPublished)]
    return {"stream": args[1], "step": steps[0]} if steps else None


_POINTS: Final[dict[str, list[tuple[object, str, Probe]]]] = {
    "intent_uncommitted": [
        (SqliteBackend, "insert_rows", _intent_rows),
        (PostgresBackend, "insert_rows", _intent_rows),
    ],
    "after_intent": [(AttemptLog, "intend", _call_event)],
    "after_blob_put": [(BlobStore, "put_delta", lambda args, result: {"blob_key": args[1]})],
    "after_commit": [(AttemptLog, "commit", _call_event)],
    "after_finalize": [(AttemptLog, "finalize", lambda args, result: {"capture_key": args[1]})],
    "after_publish": [(EventStore, "append", _published)],
    "checkpoint_write": [
        (grove.training.checkpoint, "_fsync", lambda args, result: {"path": str(args[0])}),
    ],
}


def install(spec: str | None) -> None:
    """Arm the crash point ``spec`` (``POINT:N``) in this process; None or "" arms nothing."""
    if not spec:
        return
    point, count = parse(spec)
    seen = 0

    def reached(context: Context) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            _die(point, count, context)

    for owner, name, probe in _POINTS[point]:
        _wrap_after(owner, name, probe, reached)
