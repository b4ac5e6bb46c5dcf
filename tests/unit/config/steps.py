"""One training step, by hand: a ``TrainingRun`` built from a configuration, and its inputs.

``training_run`` builds the consuming side exactly as ``grove train`` does
(``grove.train.training_run.TrainingRun``: projector settings, optimizer, scheduler, trainer and
advantage settings, all from the configuration) on the embedded model, over an empty SQLite
ledger that a hand-made step never reads. ``published`` lays out hand-made rollouts the way the
projector publishes them (``assemble_batch`` with the run's own projector settings), so
``TrainingRun.train`` runs the product's whole step on them: outcomes, group decisions,
advantages, the trainer's step, the metrics.

Every rollout answers the prompt ``[5, 6, 7]`` with ``[8, 9, 10]``: one row of six tokens with
three owned generated tokens.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from grove.config import load_config
from grove.engines.models import EMBEDDED, load_model
from grove.ledger.events import LedgerPosition
from grove.ledger.store import EventStore
from grove.storage import open_blob_store
from grove.train.training_run import TrainingRun
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.forest import CallRecord, build_forest
from grove.training.projector import FinalizedRollout, PublishedBatch
from grove.training.rows import rollout_rows
from grove.training.trainer import StepBatch, causal_token_logprobs
from tests.unit.config.runs import merged

PROMPT = [5, 6, 7]
GENERATED = [8, 9, 10]
ROW = PROMPT + GENERATED

LEARNER = {
    "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": 4},
    "policy": {
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_micro_batch_size": 2,
    },
    "checkpointing": {"enabled": False},
}
"""The step's shape unless a test says otherwise: one prompt group of four rollouts."""

CHECKPOINTS = {"checkpointing": {"enabled": True}}
"""The override that turns checkpoints on (``LEARNER`` turns them off)."""


def training_run(directory: Path, *overrides: Mapping[str, Any]) -> TrainingRun:
    """``TrainingRun`` on the embedded model for ``LEARNER`` with ``overrides``."""
    data: dict[str, Any] = dict(LEARNER)
    for override in overrides:
        data = merged(data, override)
    config = load_config(data)
    loaded = load_model(EMBEDDED, dtype=config.model.dtype, seed=config.seed)
    directory.mkdir(parents=True, exist_ok=True)
    return TrainingRun(
        EventStore.open(f"sqlite:///{directory / 'ledger.db'}"),
        open_blob_store(str(directory / "blobs")),
        loaded.model,
        config,
        directory / "checkpoints",
        pad_token_id=int(loaded.tokenizer.pad_token_id),
    )


def own_logprobs(model: torch.nn.Module) -> list[float]:
    """The model's logprobs of ``GENERATED`` after ``PROMPT``: what its engine recorded."""
    with torch.no_grad():
        logprobs = causal_token_logprobs(model, torch.tensor([ROW]))  # (1, 6)
    return [float(v) for v in logprobs[0, len(PROMPT) :]]


def rollout(
    rollout_id: str,
    reward: float,
    logprobs: Sequence[float],
    *,
    group: str = "g0",
    finish_reason: str = "stop",
    masked: bool = False,
) -> FinalizedRollout:
    """One finalized rollout of one call; ``masked``: its selection left out the call's parent
    (``selection_not_closed``), so it has no row."""
    answer = CallRecord("c0", None, PROMPT, GENERATED, list(logprobs), finish_reason=finish_reason)
    if masked:
        child = CallRecord("c1", "c0", [4], [11], [-1.0])
        forest = build_forest([answer, child], ["c1"], terminal="c1")
    else:
        forest = build_forest([answer], ["c0"], terminal="c0")
    rows = tuple(rollout_rows(forest))
    return FinalizedRollout(
        rollout_id, rollout_id, group, reward, forest, LogicalRollout(rollout_id, group, rows)
    )


def published(training: TrainingRun, rollouts: Sequence[FinalizedRollout]) -> PublishedBatch:
    """``rollouts`` as the projector publishes them for the run's next step."""
    settings = training.projector.settings
    batch = assemble_batch(
        [r.rollout for r in rollouts],
        row_multiple=settings.row_multiple,
        pad_token_id=settings.pad_token_id,
    )
    return PublishedBatch(
        training.step, batch, tuple(rollouts), LedgerPosition(position=0), rebuilt=False
    )


def one_step(training: TrainingRun) -> None:
    """One whole step of ``training``: four rollouts of the model's own logprobs, rewards
    alternating 0 and 1, published and trained."""
    mine = own_logprobs(training.model)
    rollouts = [rollout(f"r{i}", float(i % 2), mine) for i in range(4)]
    training.train(published(training, rollouts))


def trainer_state(training: TrainingRun) -> list[torch.Tensor]:
    """Copies of the trainer's parameters, then of its optimizer's tensors, in their order."""
    params = [p.detach().clone() for p in training.model.parameters()]
    moments = [
        value.clone()
        for state in training.trainer.optimizer.state.values()
        for value in state.values()
        if isinstance(value, torch.Tensor)
    ]
    return params + moments


def ratio_batch(model: torch.nn.Module, *, ratio: float, advantage: float) -> StepBatch:
    """Four rows, one per logical rollout, whose every generated token has importance ratio
    ``ratio`` under ``model`` (its generation logprob is the model's own minus ``log(ratio)``),
    each with ``advantage``."""
    tokens = torch.tensor([ROW] * 4)  # (4, 6)
    with torch.no_grad():
        current = causal_token_logprobs(model, tokens)  # (4, 6)
    loss_mask = torch.zeros(4, len(ROW), dtype=torch.bool)
    loss_mask[:, len(PROMPT) :] = True
    return StepBatch(
        token_ids=tokens,
        loss_mask=loss_mask,
        generation_logprobs=current - math.log(ratio),
        advantages=torch.full((4,), advantage),
        owners=torch.arange(4),
        logical_rollouts=4,
    )


def rows_batch(rows: int, *, advantage: float = 1.0) -> StepBatch:
    """``rows`` rows of ``ROW``, one per logical rollout, each with ``advantage``; generation
    logprobs of -6 (about the embedded model's)."""
    loss_mask = torch.zeros(rows, len(ROW), dtype=torch.bool)
    loss_mask[:, len(PROMPT) :] = True
    return StepBatch(
        token_ids=torch.tensor([ROW] * rows),
        loss_mask=loss_mask,
        generation_logprobs=torch.full((rows, len(ROW)), -6.0),
        advantages=torch.full((rows,), advantage),
        owners=torch.arange(rows),
        logical_rollouts=rows,
    )


def forward_passes(model: torch.nn.Module) -> list[tuple[str, int]]:
    """A list that records every forward pass of ``model`` from now on, as (``train`` or
    ``eval``, rows in the pass)."""
    passes: list[tuple[str, int]] = []

    def record(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        passes.append(("train" if module.training else "eval", int(args[0].shape[0])))

    model.register_forward_hook(record)
    return passes
