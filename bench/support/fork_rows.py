"""A fork's rows two ways: as the projector published them, and as the reference builds them by
hand from the ledger's commits and the blobs (``tests/fixtures/fork_reference.py``).

``chain_records`` walks an attempt's calls from one call up to its root through the recorded
parent links and reads each call's delta blob (verified against its recorded digest): the source
chain of a fork is read from the source attempt's own commits, not from the fork's opening, so
it is an independent path to the same tokens. ``batch_rows`` reads a published batch back into
plain rows per rollout, without the padding.
"""

from __future__ import annotations

import math

from grove.ledger.attempt import AttemptLog
from grove.storage import BlobRef, BlobStore
from grove.training.batch import TrainingBatch
from grove.training.forest import CallRecord
from tests.fixtures.fork_reference import ForkCase, ReferenceRow, reference_row

__all__ = ["batch_rows", "chain_records", "expected_fork_row", "generated_logprob_sum"]


def chain_records(log: AttemptLog, blobs: BlobStore, key: str, call_id: str) -> list[CallRecord]:
    """The committed calls of attempt ``key`` from its root to ``call_id``, root first, each
    named ``key/id`` with its parent so named, with the tokens and logprobs of its blob."""
    state = log.load(key)
    chain: list[CallRecord] = []
    current: str | None = call_id
    while current is not None:
        committed = state.calls[current].committed
        if committed is None:
            raise RuntimeError(f"call {current!r} of {key!r} is not committed")
        delta = blobs.get_delta(
            BlobRef(committed.blob_key, committed.blob_sha256, committed.blob_bytes)
        )
        parent = committed.parent_call_id
        chain.append(
            CallRecord(
                f"{key}/{current}",
                None if parent is None else f"{committed.source_capture_key or key}/{parent}",
                delta.prompt_delta.tolist(),
                delta.generated.tolist(),
                delta.logprobs.tolist(),
            )
        )
        current = None if committed.source_capture_key else parent
    return chain[::-1]


def generated_logprob_sum(calls: list[CallRecord]) -> float:
    """The sum of the recorded logprobs of every generated token of ``calls``: at temperature 1,
    the natural log of the probability that sampling anew generates exactly these tokens."""
    return math.fsum(lp for call in calls for lp in call.logprobs)


def expected_fork_row(
    log: AttemptLog, blobs: BlobStore, source: tuple[str, str], fork: str, endpoint: str
) -> ReferenceRow:
    """The one row a fork of call ``source`` = (attempt, call) whose own calls end at
    ``endpoint`` must train: the source chain (read from the source's commits) as context, then
    the fork's own calls, loss on all their generated tokens."""
    source_chain = chain_records(log, blobs, *source)
    own = chain_records(log, blobs, fork, endpoint)
    if own[0].parent_id != source_chain[-1].call_id:
        raise RuntimeError(f"{fork}'s first call does not continue {source[0]}/{source[1]}")
    case = ForkCase(source_chain, own, [call.call_id for call in own])
    return reference_row(case, own[-1].call_id, owned=case.selected)


def batch_rows(batch: TrainingBatch) -> dict[str, list[ReferenceRow]]:
    """Each rollout's rows of ``batch``, in batch order, cut to their real length; padding rows
    (owner -1) are left out."""
    rows: dict[str, list[ReferenceRow]] = {rollout: [] for rollout in batch.rollout_ids}
    for index, owner in enumerate(batch.parent_indices.tolist()):
        if owner < 0:
            continue
        length = int(batch.row_lengths[index])
        rows[batch.rollout_ids[owner]].append(
            ReferenceRow(
                batch.input_ids[index, :length].tolist(),
                batch.loss_mask[index, :length].int().tolist(),
                batch.generation_logprobs[index, :length].tolist(),
            )
        )
    return rows
