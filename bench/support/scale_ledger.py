"""Synthetic ledgers of realistic shape for ``bench/scale.py``: events, blobs and projection rows.

A ledger is prompt groups of 8 rollouts; an attempt makes 5-40 calls. Admission is the real one
(``grove.ledger.admission.decide`` on each request's boundary, with the attempt's admission index),
so every intent carries the record ``grove replay --verify`` re-runs. Shapes, drawn per attempt from
a seeded generator:

- a first root (first_call), then continuations: each request is the previous one plus the
  call's assistant output and a tool observation;
- a compaction (30% of attempts): the harness replaces its history by a summary, and the next
  call is a new root (history_rewritten) that stores its whole prompt;
- a rejection (20%): the harness rejects a committed response (``rejected_by_harness``) and sends
  the same request again, which continues the same parent: the forest gains a branch;
- a failure (5%): a call fails in the engine (``engine_error``) and is retried; the rollout is
  masked (``capture_failed``): a partial history never trains.

The selection is the real ``all_captured`` policy on the folded attempt; the finalization of a
*full* attempt is the projector's own (``grove.training.finalization.decide``, reading its blobs),
of the others the same forest rules on the same call structure (``build_forest``) without tokens:
their blobs are not written (a million files would measure the file system, not Grove), their
recorded size is the encoded size of their shape and their digests are stand-ins. Every
``groups_per_step`` groups a ``batch.published`` publishes them, as the projector would.

Events are imported in bulk (``EventStore.import_events``: ``COPY`` on PostgreSQL), the calls of a
group's eight attempts interleaved as concurrent rollouts write them. The projection tables are
written in bulk too (``bench/support/scale_rows.py``).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from grove.ledger.admission import (
    AdmissionIndex,
    CallStatus,
    RequestBoundary,
    decide,
    extend_prefix_digest,
)
from grove.ledger.attempt import fold_attempt
from grove.ledger.events import (
    AdmissionsClosed,
    AttemptOpened,
    AttemptSettled,
    BatchPublished,
    CallCommitted,
    CallFailed,
    CallIntended,
    Event,
    LedgerPosition,
    ReplaySummary,
    RolloutFinalized,
    RolloutSelected,
)
from grove.storage import BlobStore, CallDelta, chain_digest, encode_delta, staging_key
from grove.training.finalization import (
    captured_calls,
    finalization_event,
    finalization_forest,
    masked_forest,
)
from grove.training.forest import CallRecord, build_forest
from grove.training.selection import PolicyRegistry, completion_mask_reason

ROLLOUTS_PER_GROUP = 8
GROUPS_PER_STEP = 4
MIN_CALLS, MAX_CALLS = 5, 40
COMPACTION_RATE, REJECTION_RATE, FAILURE_RATE = 0.3, 0.2, 0.05
POLICY = "all_captured"
RENDER_OPTIONS = hashlib.sha256(b"bench.render-options").hexdigest()
PREFIX_SEED = hashlib.sha256(b"grove.prefix.v1").hexdigest()
_POLICIES = PolicyRegistry.of()


def _hex(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class _Call:
    call_id: str
    parent: str | None
    prompt_delta: int
    generated: int
    cum_len: int


@dataclass
class Attempt:
    """One attempt's events (stream order), its decisions and what its projection rows need."""

    capture_key: str
    rollout_id: str
    prompt_group: str
    rollout_index: int
    events: list[Event] = field(default_factory=list)
    finalized: RolloutFinalized | None = None
    calls: int = 0


def _blob_bytes(prompt: int, generated: int, cache: dict[tuple[int, ...], int]) -> int:
    """The encoded size of a delta of this shape: its tensors' bytes plus the safetensors header,
    whose length depends only on how many digits its shapes and offsets have (cached by those)."""
    data = 4 * (prompt + 2 * generated)  # int32 prompt and generated ids, float32 logprobs
    numbers = (prompt, generated, 4 * generated, 8 * generated, data)  # shapes, offsets
    digits = tuple(len(str(n)) for n in numbers)
    if digits not in cache:
        delta = CallDelta(
            torch.zeros(prompt, dtype=torch.int32),
            torch.zeros(generated, dtype=torch.int32),
            torch.zeros(generated),
        )
        cache[digits] = len(encode_delta(delta)) - data
    return data + cache[digits]


class AttemptWriter:
    """Draws attempts; writes the blobs of full attempts to ``blobs``."""

    def __init__(self, seed: int, blobs: BlobStore) -> None:
        self.seed = seed
        self.blobs = blobs
        self.sizes: dict[tuple[int, ...], int] = {}

    def attempt(
        self, run: str, group: int, index: int, *, full: bool, finalize: bool = True
    ) -> Attempt:
        """The events of rollout ``index`` of group ``group`` up to its selection, and its
        finalization unless ``finalize`` is False (left to a projector); ``full`` writes its
        blobs and takes its finalization from the projector's own decision."""
        rng = random.Random(f"{self.seed}/{run}/{group}/{index}")
        group_id = f"{run}-g{group}"
        key = f"{group_id}-r{index}"
        attempt = Attempt(key, key, group_id, index)
        attempt.events.append(
            AttemptOpened(
                capture_key=key,
                rollout_id=key,
                prompt_group=group_id,
                rollout_index=index,
                policy_version=0,
                model_fingerprint=_hex("bench.model"),
                template_fingerprint=_hex("bench.template"),
                selection_policy=POLICY,
            )
        )
        n = rng.randint(MIN_CALLS, MAX_CALLS)
        special = rng.sample(range(1, n - 1), 3) if n >= 5 else [None, None, None]
        compaction = special[0] if rng.random() < COMPACTION_RATE else None
        rejected = special[1] if rng.random() < REJECTION_RATE else None
        failed = special[2] if rng.random() < FAILURE_RATE else None
        calls = self._calls(attempt, rng, n, compaction, rejected, failed, full)
        terminal = calls[-1]
        attempt.events += [AdmissionsClosed(), AttemptSettled()]
        state = fold_attempt(key, attempt.events)
        result = {"reward": round(rng.random(), 3), "terminal_response_id": f"resp-{terminal}"}
        selection = _POLICIES.select(POLICY, captured_calls(state), result)
        attempt.events.append(
            RolloutSelected(
                policy=selection.policy,
                call_ids=selection.call_ids,
                terminal_response_id=selection.terminal_response_id,
                reward=selection.reward,
                result=result,
            )
        )
        state = fold_attempt(key, attempt.events[-1:], state)
        if not finalize:
            return attempt
        if full:
            forest, _ = finalization_forest(state, self.blobs)
        else:
            forest = _structural_forest(state)
        attempt.finalized = finalization_event(key, forest)
        return attempt

    def _calls(
        self,
        attempt: Attempt,
        rng: random.Random,
        n: int,
        compaction: int | None,
        rejected: int | None,
        failed: int | None,
        full: bool,
    ) -> list[str]:
        """Append each call's events; returns the ids of the accepted (committed) calls."""
        key = attempt.capture_key
        index = AdmissionIndex()
        chain = [PREFIX_SEED]  # the prefix digest after each request item
        roles: list[str] = []
        context = 0  # tokens of the request so far
        new_tokens = 0  # tokens the request adds after its boundary
        by_id: dict[str, _Call] = {}
        chains: dict[str, str] = {}
        accepted: list[str] = []

        def add_item(role: str, tokens: int) -> None:
            nonlocal context, new_tokens
            chain.append(extend_prefix_digest(chain[-1], _hex(f"{key}/item{len(chain)}")))
            roles.append(role)
            context += tokens
            new_tokens += tokens

        add_item("system", rng.randint(50, 150))
        add_item("user", rng.randint(150, 450))
        for c in range(n):
            call_id = f"c{c}"
            if c == compaction:  # the harness rewrites its history as a summary
                chain, roles, context, new_tokens = [PREFIX_SEED], [], 0, 0
                add_item("system", rng.randint(50, 150))
                add_item("user", rng.randint(150, 400))
            boundary_at = max((i + 1 for i, r in enumerate(roles) if r == "assistant"), default=0)
            decision = decide(
                RequestBoundary(
                    item_count=len(roles),
                    prefix_item_count=boundary_at,
                    prefix_digest=chain[boundary_at] if boundary_at else None,
                    canonical_prefix_digest=chain[boundary_at] if boundary_at else None,
                    echoed_ids=(),
                    suffix_only_observations=True,
                ),
                render_options_digest=RENDER_OPTIONS,
                index=index,
            )
            parent = decision.parent_call_id
            summary = ReplaySummary(
                normalization_version=3,
                item_count=len(roles),
                source_digest=chain[-1],
                canonical_source_digest=chain[-1],
                render_options_digest=RENDER_OPTIONS,
            )
            attempt.events.append(
                CallIntended(
                    call_id=call_id,
                    decision=decision.kind.value,
                    parent_call_id=parent,
                    root_reason=None if decision.reason is None else decision.reason.value,
                    replay_summary=summary,
                    prompt_tokens=context,
                    admission=decision.as_payload(),
                    policy_version=0,
                )
            )
            attempt.calls += 1
            if c == failed:
                attempt.events.append(
                    CallFailed(call_id=call_id, reason="engine_error", detail="engine restarted")
                )
                continue
            prompt_delta = new_tokens if parent is not None else context
            generated = rng.randint(30, 300)
            prev = by_id[parent].cum_len if parent is not None else 0
            call = _Call(call_id, parent, prompt_delta, generated, prev + prompt_delta + generated)
            by_id[call_id] = call
            blob_key = staging_key(key, call_id)
            if full:
                draw = torch.Generator().manual_seed(rng.getrandbits(63))
                size = (prompt_delta + generated,)
                tokens = torch.randint(0, 150_000, size, dtype=torch.int32, generator=draw)
                delta = CallDelta(
                    tokens[:prompt_delta],
                    tokens[prompt_delta:],
                    -torch.rand(generated, generator=draw),
                )
                ref = self.blobs.put_delta(blob_key, delta)
                sha, size = ref.sha256, ref.size
                chains[call_id] = chain_digest(
                    chains.get(parent or ""), delta.prompt_delta, delta.generated
                )
            else:
                sha, size = _hex(blob_key), _blob_bytes(prompt_delta, generated, self.sizes)
                chains[call_id] = _hex(f"chain/{blob_key}")
            output = extend_prefix_digest(chain[-1], _hex(f"{key}/{call_id}/output"))
            committed = CallCommitted(
                call_id=call_id,
                parent_call_id=parent,
                prev_len=prev,
                delta_len=prompt_delta + generated,
                cum_len=call.cum_len,
                prompt_delta_len=prompt_delta,
                generated_len=generated,
                blob_key=blob_key,
                blob_sha256=sha,
                blob_bytes=size,
                chain_digest=chains[call_id],
                finish_reason="stop",
                response_id=f"resp-{call_id}",
                output_fingerprint=_hex(f"{key}/{call_id}/fingerprint"),
                replay_summary=summary.model_copy(
                    update={
                        "item_count": len(roles) + 1,
                        "source_digest": output,
                        "canonical_source_digest": output,
                    }
                ),
                policy_version=0,
            )
            attempt.events.append(committed)
            ids = frozenset({committed.response_id})
            if c == rejected:
                attempt.events.append(
                    CallFailed(
                        call_id=call_id, reason="rejected_by_harness", detail="verifier said no"
                    )
                )
                status = CallStatus.FAILED
            else:
                status = CallStatus.COMMITTED
                accepted.append(call_id)
            index.add(committed.replay_summary.candidate(call_id, status, ids))
            if status is CallStatus.COMMITTED:  # the next request: this output, a tool result
                chain.append(output)
                roles.append("assistant")
                context = call.cum_len
                new_tokens = 0
                add_item("tool", rng.randint(20, 200))
        return accepted


def _structural_forest(state: Any):
    """The finalization forest from the call structure alone (no blobs: tokens are zeros of the
    recorded lengths), with the projector's masking order: completion, then the forest rules."""
    assert state.selection is not None
    selected = list(state.selection.call_ids)
    records = []
    for call in state.calls.values():
        committed = call.committed
        if committed is None or call.call_id not in selected:
            records.append(
                CallRecord(call.call_id, call.parent_call_id, [], [], [], call.status.value)
            )
            continue
        records.append(
            CallRecord(
                call.call_id,
                call.parent_call_id,
                [0] * committed.prompt_delta_len,
                [0] * committed.generated_len,
                [0.0] * committed.generated_len,
                call.status.value,
                committed.finish_reason,
            )
        )
    terminal = next(
        c.call_id
        for c in state.calls.values()
        if c.committed and c.committed.response_id == state.selection.terminal_response_id
    )
    forest = build_forest(records, selected, terminal=terminal)
    mask = completion_mask_reason(captured_calls(state), selected) or forest.masked_reason
    if mask is not None and forest.masked_reason != mask:
        forest = masked_forest(forest, mask)
    return forest


# -- the ledger: interleaved groups, publications, bulk import -----------------------------------


@dataclass(frozen=True)
class Placed:
    """An event with its stream, stream version and the position it lands at."""

    stream_id: str
    stream_version: int
    position: int
    event: Event


def interleaved(attempts: Sequence[Attempt]) -> Iterator[tuple[Attempt, int, Event]]:
    """The group's events as concurrent rollouts write them: one event of each attempt in turn
    (with its stream version), then each attempt's finalization."""
    longest = max(len(a.events) for a in attempts)
    for i in range(longest):
        for attempt in attempts:
            if i < len(attempt.events):
                yield attempt, i + 1, attempt.events[i]
    for attempt in attempts:
        if attempt.finalized is not None:
            yield attempt, len(attempt.events) + 1, attempt.finalized


@dataclass
class LedgerBuilder:
    """Places the events of groups at consecutive positions after ``position``, and publishes
    every ``GROUPS_PER_STEP`` finalized groups on ``training_stream``."""

    training_stream: str
    position: int = 0
    steps: int = 0
    placed: list[Placed] = field(default_factory=list)
    _waiting: list[Attempt] = field(default_factory=list)
    _waiting_groups: int = 0

    def add_group(self, attempts: Sequence[Attempt]) -> None:
        """Place one group; publish when enough finalized groups wait."""
        for attempt, version, event in interleaved(attempts):
            self._place(attempt.capture_key, version, event)
        if all(a.finalized is not None for a in attempts):
            self._waiting += attempts
            self._waiting_groups += 1
            if self._waiting_groups == GROUPS_PER_STEP:
                self._publish()

    def _place(self, stream_id: str, version: int, event: Event) -> None:
        self.position += 1
        self.placed.append(Placed(stream_id, version, self.position, event))

    def _publish(self) -> None:
        rollouts = self._waiting
        event = BatchPublished(
            step=self.steps,
            rollout_ids=tuple(a.rollout_id for a in rollouts),
            row_ids=tuple(
                f"{a.rollout_id}/{i}"
                for a in rollouts
                for i in range(len(a.finalized.paths) if a.finalized else 0)
            ),
            ledger_position=LedgerPosition(position=self.position),
        )
        self.steps += 1
        self._place(self.training_stream, self.steps, event)
        self._waiting, self._waiting_groups = [], 0

    def take(self) -> list[Placed]:
        """The events placed since the last ``take``."""
        placed, self.placed = self.placed, []
        return placed
