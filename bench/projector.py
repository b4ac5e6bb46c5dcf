"""Forest projection: materializing training batches from a blob store, against raw blob reads.

Usage: ``python -m bench.projector [--quick] [--json]``

Workload: 64 prompt groups x 8 rollouts x 20 calls (``--quick``: 8 groups) in a local blob
store. A root prompt has 256 tokens, each continuation adds a 64-token observation, and each call
generates 128 tokens with their logprobs. Even rollouts are one 20-call chain (one row); odd
rollouts rewrite their context at call 10 (a new root storing a 256-token summary) and reject
call 15 in favour of its retry, call 16 (two rows, 19 selected calls).

- ``projector_tokens_per_s``: row tokens materialized per second by the projection path: for
  every selected call, a verified ``BlobStore.get_delta``, a ``CallRecord`` over the delta's
  tensors (``CallRecord.from_arrays``, as the projector builds them: no Python lists) and a
  ``CallExtras`` (the same tensors); then ``build_forest``, ``rollout_rows`` and, per prompt
  group, ``assemble_batch`` (row multiple 8).
- ``raw_read_tokens_per_s``: the same row tokens over the time of reading the same blobs without
  projection — ``BlobStore.get_delta`` alone (size and sha256 verified, decoded), as every Grove
  read is — in the same run, in alternating rounds; ``projector_over_raw_read`` is the ratio of
  the two (aim >= 0.7): what projection adds to reading.
- ``fsspec_read_tokens_per_s`` / ``projector_over_fsspec_read``: the same against plain fsspec
  ``cat_file`` of the same blobs' bytes (no verification, no decoding), to show where time goes.
- ``stepwise_over_forest_tokens``: over the 20-call chains (no compaction), the tokens a trainer
  processes when every call is one sample (its whole context plus its generation) over the
  tokens of the forest rows (expect about 10).

Times are the bench process's CPU time (user + system): the blobs sit in the page cache after the
first pass, so every pass is CPU-bound, and CPU time is not inflated by other processes on a
shared machine the way wall time is. Each pass's time is, per prompt group, the median over
rounds, summed over groups; the passes alternate group by group in a rotating order. Torch runs
on one intra-op thread, as in a data-loading worker (PyTorch's ``DataLoader`` sets the same):
projection works on many small tensors, where inter-thread hand-offs cost more than they save.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from bench.support.report import print_figures
from grove.storage import BlobRef, BlobStore, CallDelta, open_blob_store, staging_key
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.forest import CallRecord, Forest, build_forest
from grove.training.rows import CallExtras, rollout_rows

ROLLOUTS_PER_GROUP = 8
CALLS = 20
ROOT_PROMPT_TOKENS = 256
OBSERVATION_TOKENS = 64
GENERATED_TOKENS = 128
ROW_MULTIPLE = 8
REWRITE_AT = 10
REJECTED = 15


@dataclass(frozen=True)
class StoredCall:
    call_id: str
    parent_id: str | None
    ref: BlobRef


@dataclass(frozen=True)
class StoredRollout:
    rollout_id: str
    group_id: str
    calls: tuple[StoredCall, ...]
    selected: tuple[str, ...]
    compacted: bool

    @property
    def selected_set(self) -> frozenset[str]:
        return frozenset(self.selected)


def write_workload(store: BlobStore, groups: int) -> list[list[StoredRollout]]:
    """Put every call's delta blob and return the rollouts, grouped."""
    generator = torch.Generator().manual_seed(0)
    workload = []
    for g in range(groups):
        group = []
        for r in range(ROLLOUTS_PER_GROUP):
            compacted = r % 2 == 1
            capture_key = f"g{g}-r{r}"
            calls = []
            for c in range(CALLS):
                root = c == 0 or (compacted and c == REWRITE_AT)
                parent = None if root else f"c{c - 1}"
                if compacted and c == REJECTED + 1:
                    parent = f"c{REJECTED - 1}"  # the retry continues what the rejected call did
                prompt = ROOT_PROMPT_TOKENS if root else OBSERVATION_TOKENS
                delta = CallDelta(
                    torch.randint(0, 150_000, (prompt,), dtype=torch.int32, generator=generator),
                    torch.randint(
                        0, 150_000, (GENERATED_TOKENS,), dtype=torch.int32, generator=generator
                    ),
                    -torch.rand(GENERATED_TOKENS, generator=generator),
                )
                ref = store.put_delta(staging_key(capture_key, f"c{c}"), delta)
                calls.append(StoredCall(f"c{c}", parent, ref))
            selected = tuple(
                call.call_id for call in calls if not (compacted and call.call_id == f"c{REJECTED}")
            )
            group.append(StoredRollout(capture_key, f"g{g}", tuple(calls), selected, compacted))
        workload.append(group)
    return workload


def selected_refs(workload: list[list[StoredRollout]]) -> list[BlobRef]:
    return [
        call.ref
        for group in workload
        for rollout in group
        for call in rollout.calls
        if call.call_id in rollout.selected
    ]


def project(store: BlobStore, workload: list[list[StoredRollout]]) -> list[Forest]:
    """The projection path: verified reads, forests, row tensors, padded group batches."""
    forests = []
    for group in workload:
        logical = []
        for rollout in group:
            records, extras = [], {}
            selected = rollout.selected_set
            for call in rollout.calls:
                if call.call_id not in selected:
                    continue
                delta = store.get_delta(call.ref)
                records.append(
                    CallRecord.from_arrays(
                        call.call_id,
                        call.parent_id,
                        delta.prompt_delta,
                        delta.generated,
                        delta.logprobs,
                    )
                )
                extras[call.call_id] = CallExtras(
                    prompt_tokens=delta.prompt_delta,
                    generated_tokens=delta.generated,
                    logprobs=delta.logprobs,
                )
            forest = build_forest(records, rollout.selected, terminal=rollout.selected[-1])
            forests.append(forest)
            rows = tuple(rollout_rows(forest, extras))
            logical.append(LogicalRollout(rollout.rollout_id, rollout.group_id, rows))
        assemble_batch(logical, row_multiple=ROW_MULTIPLE)
    return forests


def raw_read(store: BlobStore, refs: list[BlobRef]) -> None:
    """Read and verify the blobs, without projecting them."""
    for ref in refs:
        store.get_delta(ref)


def fsspec_read(store: BlobStore, refs: list[BlobRef]) -> None:
    """Read the blobs' bytes only."""
    fs = store.fs
    for ref in refs:
        fs.cat_file(store.path(ref.key))


def token_counts(workload: list[list[StoredRollout]], forests: list[Forest]) -> dict[str, int]:
    """Row tokens of every rollout; stepwise and forest tokens of the uncompacted chains."""
    rollouts = [rollout for group in workload for rollout in group]
    row_tokens = sum(len(row.token_ids) for forest in forests for row in forest.rows)
    stepwise = forest_tokens = 0
    for rollout, forest in zip(rollouts, forests, strict=True):
        if rollout.compacted:
            continue
        for row in forest.rows:
            forest_tokens += len(row.token_ids)
            # one sample per call: its context and generation, i.e. the row prefix up to its end
            stepwise += sum(segment.end for segment in row.segments if segment.owned)
    return {"row_tokens": row_tokens, "stepwise_tokens": stepwise, "forest_tokens": forest_tokens}


def pass_times(
    passes: dict[str, Callable[[list[StoredRollout]], object]],
    workload: list[list[StoredRollout]],
    rounds: int,
) -> dict[str, float]:
    """Seconds per pass over the whole workload: per prompt group, the median over rounds of
    each pass's time on that group, summed. The passes alternate group by group in a rotating
    order, so that load from elsewhere on the machine falls on all of them alike."""
    names = list(passes)
    times = {name: [[] for _ in workload] for name in names}
    for round_index in range(rounds):
        gc.collect()
        for index, group in enumerate(workload):
            shift = (round_index + index) % len(names)
            for name in names[shift:] + names[:shift]:
                start = time.process_time()
                passes[name](group)
                times[name][index].append(time.process_time() - start)
    return {name: sum(statistics.median(t) for t in per_group) for name, per_group in times.items()}


def run(quick: bool) -> dict[str, object]:
    torch.set_num_threads(1)
    groups = 8 if quick else 64
    rounds = 3 if quick else 5
    with tempfile.TemporaryDirectory(prefix="grove-bench-projector-") as directory:
        store = open_blob_store(directory)
        workload = write_workload(store, groups)
        refs = selected_refs(workload)
        forests = project(store, workload)  # also warms the page cache
        counts = token_counts(workload, forests)
        times = pass_times(
            {
                "projector": lambda group: project(store, [group]),
                "raw_read": lambda group: raw_read(store, selected_refs([group])),
                "fsspec_read": lambda group: fsspec_read(store, selected_refs([group])),
            },
            workload,
            rounds,
        )
    rows = sum(len(forest.rows) for forest in forests)
    rate = {name: counts["row_tokens"] / seconds for name, seconds in times.items()}
    return {
        "groups": groups,
        "rollouts_per_group": ROLLOUTS_PER_GROUP,
        "calls_per_rollout": CALLS,
        "blobs_read_per_pass": len(refs),
        "rows": rows,
        "row_tokens": counts["row_tokens"],
        "rounds": rounds,
        "projector_tokens_per_s": round(rate["projector"]),
        "raw_read_tokens_per_s": round(rate["raw_read"]),
        "fsspec_read_tokens_per_s": round(rate["fsspec_read"]),
        "projector_over_raw_read": round(times["raw_read"] / times["projector"], 3),
        "projector_over_fsspec_read": round(times["fsspec_read"] / times["projector"], 3),
        "stepwise_over_forest_tokens": round(
            counts["stepwise_tokens"] / counts["forest_tokens"], 3
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 prompt groups, 3 rounds")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    arguments = parser.parse_args()
    print_figures(run(arguments.quick), as_json=arguments.json)


if __name__ == "__main__":
    main()
