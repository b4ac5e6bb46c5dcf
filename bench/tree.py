"""Tree-packed training: one optimizer step on token trees against the same step row by row.

Usage: ``python -m bench.tree [--quick] [--json]``

The embedded model (``grove.capture.embedded.build_model``: Qwen2-style, hidden 64, 2 layers,
516-token vocabulary, ``sdpa`` attention) takes one training step (forward, backward, AdamW) on one
logical rollout's forest, with ``policy.train_micro_batch_size`` 8, in four shapes:

- ``branching``: a 1,000-token parent call (900 prompt + 100 generated) and 8 branches from it,
  each a 20-token observation and 80 generated tokens (8 rows of 1,100 tokens);
- ``resampling``: a chain of four calls (400-token prompt, then 50-token observations, 100
  generated each) whose fifth call was rejected and resampled: 4 retries with the same
  observation, all selected (``all_captured``; 4 rows of 1,100 tokens);
- ``compaction``: a two-call history (600 + 100, then 50 + 100) compacted into a new root
  (300-token summary + 100 generated) with 4 branches of 50 + 100 (one row of 850, four of 550);
- ``chains``: 8 rollouts, each one 1,100-token chain of five calls with its own prompt (nothing
  shared).

Per shape: ``rows_tokens`` (the rows' real tokens, without padding) and ``tree_tokens`` (the
tokens of the trees ``grove.training.tree_logprobs`` runs), ``rows_over_tree_tokens``; wall time per
step of ``Trainer.train_step`` with ``row_logprobs`` and with ``tree_logprobs`` (and
``owner_micro_batches``), the median over rounds that alternate the two, and
``rows_over_tree_time``. Aim: >= 3x fewer tokens and >= 2x less time on ``branching``; chains no
more than 1.1x slower. Torch runs on one thread, so other work on a shared machine disturbs the
two sides alike.
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time
from collections.abc import Callable

import torch

from grove.capture.embedded import build_model, build_tokenizer
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.forest import CallRecord, build_forest
from grove.training.rows import rollout_rows
from grove.training.trainer import StepBatch, Trainer, row_logprobs
from grove.training.tree_logprobs import micro_batch_trees, owner_micro_batches, tree_logprobs

MICRO_BATCH = 8


class _Tokens:
    """Distinct token ids from the vocabulary's middle, drawn from a seeded generator."""

    def __init__(self, seed: int) -> None:
        self.generator = torch.Generator().manual_seed(seed)

    def __call__(self, count: int) -> list[int]:
        return torch.randint(10, 500, (count,), generator=self.generator).tolist()


def _call(
    tokens: _Tokens, call_id: str, parent: str | None, prompt: int, generated: int
) -> CallRecord:
    return CallRecord(call_id, parent, tokens(prompt), tokens(generated), [-1.0] * generated)


def _branching(tokens: _Tokens) -> list[list[CallRecord]]:
    calls = [_call(tokens, "p", None, 900, 100)]
    observation = tokens(20)
    for branch in range(8):
        generated = tokens(80)
        calls.append(CallRecord(f"b{branch}", "p", observation, generated, [-1.0] * 80))
    return [calls]


def _resampling(tokens: _Tokens) -> list[list[CallRecord]]:
    calls = [_call(tokens, "c0", None, 400, 100)]
    calls += [_call(tokens, f"c{i}", f"c{i - 1}", 50, 100) for i in range(1, 4)]
    observation = tokens(50)
    for retry in range(4):
        calls.append(CallRecord(f"r{retry}", "c3", observation, tokens(100), [-1.0] * 100))
    return [calls]


def _compaction(tokens: _Tokens) -> list[list[CallRecord]]:
    calls = [_call(tokens, "a0", None, 600, 100), _call(tokens, "a1", "a0", 50, 100)]
    calls.append(_call(tokens, "s", None, 300, 100))
    observation = tokens(50)
    for branch in range(4):
        calls.append(CallRecord(f"b{branch}", "s", observation, tokens(100), [-1.0] * 100))
    return [calls]


def _chains(tokens: _Tokens) -> list[list[CallRecord]]:
    rollouts = []
    for _ in range(8):
        calls = [_call(tokens, "c0", None, 400, 100)]
        calls += [_call(tokens, f"c{i}", f"c{i - 1}", 50, 100) for i in range(1, 5)]
        rollouts.append(calls)
    return rollouts


SHAPES: dict[str, Callable[[_Tokens], list[list[CallRecord]]]] = {
    "branching": _branching,
    "resampling": _resampling,
    "compaction": _compaction,
    "chains": _chains,
}


def _step_batch(rollouts: list[list[CallRecord]]) -> StepBatch:
    logical = []
    for index, calls in enumerate(rollouts):
        forest = build_forest(calls, [c.call_id for c in calls], strict=True)
        logical.append(LogicalRollout(f"r{index}", f"g{index}", tuple(rollout_rows(forest))))
    batch = assemble_batch(logical, row_multiple=1)
    owners = batch.parent_indices
    return StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=torch.where(owners % 2 == 0, 1.0, -1.0),
        owners=owners,
        logical_rollouts=len(rollouts),
    )


def _trainer(model: torch.nn.Module, batch: StepBatch, *, tree: bool) -> Trainer:
    return Trainer(
        model,
        torch.optim.AdamW(model.parameters(), lr=1e-5),
        global_batch_rollouts=batch.logical_rollouts,
        micro_batch_size=MICRO_BATCH,
        logprobs=tree_logprobs if tree else row_logprobs,
        micro_batches=owner_micro_batches if tree else None,
    )


def _tree_tokens(batch: StepBatch) -> int:
    return sum(
        layout.tokens
        for rows in owner_micro_batches(batch, MICRO_BATCH)
        for layout in micro_batch_trees(batch, rows)[0]
    )


def measure(shape: str, model: torch.nn.Module, rounds: int) -> dict[str, float]:
    """One shape's tokens and step times, rows and tree, in alternating rounds."""
    batch = _step_batch(SHAPES[shape](_Tokens(seed=len(shape))))
    rows_trainer = _trainer(copy.deepcopy(model), batch, tree=False)
    tree_trainer = _trainer(copy.deepcopy(model), batch, tree=True)
    times: dict[str, list[float]] = {"rows": [], "tree": []}
    for round_index in range(rounds + 1):  # the first round warms up and is not counted
        order = [("rows", rows_trainer), ("tree", tree_trainer)]
        for name, trainer in order if round_index % 2 else order[::-1]:
            start = time.perf_counter()
            trainer.train_step(batch)
            if round_index:
                times[name].append(time.perf_counter() - start)
    rows_tokens = sum(_row_lengths(batch))
    tree_tokens = _tree_tokens(batch)
    rows_s, tree_s = statistics.median(times["rows"]), statistics.median(times["tree"])
    return {
        "rows": batch.rows,
        "rows_tokens": rows_tokens,
        "tree_tokens": tree_tokens,
        "rows_over_tree_tokens": round(rows_tokens / tree_tokens, 3),
        "rows_step_s": round(rows_s, 4),
        "tree_step_s": round(tree_s, 4),
        "rows_over_tree_time": round(rows_s / tree_s, 3),
    }


def _row_lengths(batch: StepBatch) -> list[int]:
    """Real tokens per row: rows are right-padded, and every row ends with a loss token here."""
    columns = torch.arange(1, batch.loss_mask.shape[1] + 1)
    return torch.where(batch.loss_mask, columns, 0).amax(dim=1).tolist()


def run(rounds: int) -> dict[str, dict[str, float]]:
    """Every shape, on one model, ``rounds`` rounds (``--quick``: 3, else 7)."""
    torch.set_num_threads(1)
    model = build_model(build_tokenizer(), seed=0).train()
    return {shape: measure(shape, model, rounds) for shape in SHAPES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds instead of 7")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    arguments = parser.parse_args()
    result = run(3 if arguments.quick else 7)
    if arguments.json:
        print(json.dumps(result))
        return
    for shape, figures in result.items():
        print(shape)
        for name, value in figures.items():
            print(f"  {name:24} {value}")


if __name__ == "__main__":
    main()
