"""Fork sources: the committed call of another attempt that a fork continues (``docs/fork.md``).

``fork_source`` checks that the named call can be continued (a committed call, not late, of an
opened attempt, whose chain's blobs the source's cleanup has not removed) and records its chain,
root first, crossing into the source's own fork source, so the fork's rows read the source tokens
from the blobs the chain names. The source's ``attempt.cleaned`` events are the commit point of
its cleanup (``grove.training.cleanup``): a fork opened after one of them named a chain blob
could never train, so it is refused; a fork opened before is held by the cleanup.
"""

from __future__ import annotations

from grove.ledger.attempt import AttemptError, AttemptState, CallState
from grove.ledger.events import CallCommitted, ForkSource, SourceCall

__all__ = ["chain_link", "fork_source"]


def fork_source(capture_key: str, source: AttemptState, source_call_id: str) -> ForkSource:
    """The fork source of attempt ``capture_key`` at call ``source_call_id`` of ``source``:
    ``AttemptError`` unless that is a committed call (not late) of an opened attempt."""
    if source.opened is None:
        raise AttemptError(
            capture_key, f"the fork source {source.capture_key!r} is not an opened attempt", None
        )
    call = source.calls.get(source_call_id)
    if (
        call is None
        or call.failure is not None  # a rejected response is never a parent
        or source_call_id not in source.parentable_call_ids
    ):
        status = "unknown" if call is None else _fork_refusal_status(call)
        raise AttemptError(
            capture_key,
            f"a fork continues a committed call, but call {source_call_id!r} of attempt "
            f"{source.capture_key!r} is {status}",
            source_call_id,
        )
    committed = call.committed
    assert committed is not None  # parentable calls are committed
    chain = _source_chain(source, source_call_id)
    _refuse_cleaned(capture_key, source, source_call_id, chain)
    return ForkSource(
        source_capture_key=source.capture_key,
        source_call_id=source_call_id,
        source_chain_digest=committed.chain_digest,
        source_cum_len=committed.cum_len,
        source_replay_summary=committed.replay_summary,
        chain=chain,
    )


def _refuse_cleaned(
    capture_key: str, source: AttemptState, source_call_id: str, chain: tuple[SourceCall, ...]
) -> None:
    """``AttemptError`` when an ``attempt.cleaned`` event of ``source`` removed a blob of
    ``chain``: the fork's rows would have no source tokens (``docs/fork.md``, "Cleanup")."""
    cleaned = set(source.cleaned_keys)
    gone = [c for c in chain if c.blob_key in cleaned]
    if gone:
        raise AttemptError(
            capture_key,
            f"a fork reads its source chain's blobs, but cleanup removed {len(gone)} of them "
            f"from attempt {source.capture_key!r} (first: call {gone[0].call_id!r}) after its "
            f"rollout was final, so call {source_call_id!r} of attempt {source.capture_key!r} "
            "can no longer be forked; fork a call of an attempt that is not yet final, or a "
            "selected call of a published rollout",
            source_call_id,
        )


def _source_chain(source: AttemptState, call_id: str) -> tuple[SourceCall, ...]:
    """The chain of committed call ``call_id`` of ``source``, root first: its own calls, after
    the chain of ``source``'s fork source when the chain starts there."""
    own: list[SourceCall] = []
    inherited: tuple[SourceCall, ...] = ()
    current: str | None = call_id
    while current is not None:
        call = source.calls[current]
        committed = call.committed
        assert committed is not None  # a committed call's ancestors are committed
        own.append(chain_link(source.capture_key, committed))
        if call.intended.source_capture_key is not None:
            assert source.opened is not None and source.opened.fork_from is not None
            inherited = source.opened.fork_from.chain
            break
        current = call.parent_call_id
    return (*inherited, *reversed(own))


def _fork_refusal_status(call: CallState) -> str:
    """What a call that cannot be forked is: late, failed for a reason, or still pending."""
    if call.late:
        return "late"
    if call.failure is not None:
        return f"failed ({call.failure.reason})"
    return call.status.value


def chain_link(capture_key: str, committed: CallCommitted) -> SourceCall:
    """Committed call ``committed`` of attempt ``capture_key`` as a link of a chain: what a
    fork's source chain records per call, and what its tokens are read from."""
    return SourceCall(
        capture_key=capture_key,
        call_id=committed.call_id,
        blob_key=committed.blob_key,
        blob_sha256=committed.blob_sha256,
        blob_bytes=committed.blob_bytes,
        chain_digest=committed.chain_digest,
        finish_reason=committed.finish_reason,
        response_id=committed.response_id,
        output_fingerprint=committed.output_fingerprint,
    )
