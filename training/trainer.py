"""The trainer: one optimizer step per logical batch of forest rows, on any torch causal LM.

A step's batch counts logical rollouts (``policy.train_global_batch_size``); its rows may be more,
since a rollout whose context was rewritten has several rows, and padding rows make the row count a
multiple of the execution row multiple. The trainer therefore:

- runs the rows in fixed micro batches, each loss already divided by the whole step's retained
  token count, so the accumulated gradient is that of one pass over the batch;
- takes exactly one optimizer step per batch, however many rows or micro batches it has;
- advances the learning-rate scheduler by the batch's logical rollouts (``scheduler.step()`` once
  per rollout, so a schedule written in rollouts means rollouts), never by rows: splitting a
  rollout into more rows must not speed up the schedule (``docs/metrics.md``,
  ``scheduler_step_increment``).

The model is anything called as ``model(input_ids)`` that returns logits ``(R, T, V)`` or an object
with ``.logits`` (Hugging Face causal LMs). Rows are right-padded and no attention mask is passed:
in a causal model a row's later padding cannot change its earlier positions, and a padding row of
all-masked tokens could otherwise produce NaN attention.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from grove.training.advantages import LogicalAdvantages, broadcast_to_rows
from grove.training.batch import TrainingBatch
from grove.training.errors import BatchError
from grove.training.fsdp import UnshardedCopy, check_equal_passes
from grove.training.loss import (
    DEFAULT_CLIP,
    ClipRange,
    TokenDiagnostics,
    clipped_policy_gradient_loss,
    retained_token_mask,
    token_diagnostics,
)
from grove.training.metrics import OPTIMIZER_STEPS, SCHEDULER_STEP_INCREMENT
from grove.training.placement import CPU_FLOAT32, Placement
from grove.training.row_sharding import (
    SINGLE_PROCESS,
    RankGroup,
    shard_micro_batches,
    shard_rows,
)
from grove.training.rows import RowMedia

__all__ = [
    "LogprobFunction",
    "MicroBatchPlan",
    "RowLayout",
    "StepBatch",
    "StepReport",
    "Trainer",
    "causal_token_logprobs",
    "recompute_token_logprobs",
    "rollout_warmup_scheduler",
    "row_logprobs",
    "step_batch",
]


@dataclass(frozen=True, eq=False)
class StepBatch:
    """One optimizer step's rows (producer: ``step_batch`` from
    ``grove.training.batch.TrainingBatch`` and ``grove.training.advantages.LogicalAdvantages``;
    consumer: ``Trainer``).

    ``token_ids`` int64 ``(R, T)``, right-padded; ``loss_mask`` bool ``(R, T)``, True on owned
    generated tokens; ``generation_logprobs`` float ``(R, T)``, the engine's logprob of token ``t``
    at position ``t`` (any value where ``loss_mask`` is False); ``advantages`` float ``(R,)``, the
    owner's advantage broadcast to each of its rows; ``owners`` int64 ``(R,)``, the logical
    rollout index in ``[0, logical_rollouts)`` or -1 for execution padding; ``row_mask`` bool
    ``(R,)`` or None (all kept): False for rows a rollout decision excluded from loss (pooled
    TMPE threshold, overlong filtering). Padding rows carry no loss token and zero advantage.
    ``routes`` int ``(R, T, top_k)`` or None and ``media`` (per row) are the rows' routed experts
    and media, for a ``LogprobFunction`` that replays them.
    """

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    advantages: torch.Tensor
    owners: torch.Tensor
    logical_rollouts: int
    row_mask: torch.Tensor | None = None
    routes: torch.Tensor | None = None
    media: tuple[tuple[RowMedia, ...], ...] = ()

    def __post_init__(self) -> None:
        grid = tuple(self.token_ids.shape)
        if len(grid) != 2 or grid[0] == 0 or grid[1] == 0:
            raise BatchError(
                "step_batch_shape", f"token_ids must be a non-empty (R, T), got {grid}"
            )
        for name in ("loss_mask", "generation_logprobs"):
            if tuple(getattr(self, name).shape) != grid:
                raise BatchError(
                    "step_batch_shape",
                    f"{name} must match token_ids {grid}, got {tuple(getattr(self, name).shape)}",
                )
        for name in ("advantages", "owners", "row_mask"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (grid[0],):
                raise BatchError(
                    "step_batch_shape", f"{name} must be ({grid[0]},), got {tuple(value.shape)}"
                )
        if self.logical_rollouts < 1:
            raise BatchError(
                "logical_rollouts",
                f"a step needs at least one logical rollout, got {self.logical_rollouts}",
            )
        owners = self.owners.tolist()
        if any(owner < -1 or owner >= self.logical_rollouts for owner in owners):
            raise BatchError(
                "owner_index",
                f"owner indices must lie in [-1, {self.logical_rollouts}), "
                f"got {sorted(set(owners))}",
            )
        padding = self.owners < 0
        if bool(self.loss_mask[padding].any()) or bool(self.advantages[padding].any()):
            raise BatchError(
                "padding_rows",
                "padding rows (owner -1) must carry no loss token and zero advantage",
            )

    @property
    def rows(self) -> int:
        """Physical rows, padding included."""
        return int(self.token_ids.shape[0])

    @property
    def padding_rows(self) -> int:
        """Execution padding rows (owner -1)."""
        return int((self.owners < 0).sum())


@dataclass(frozen=True)
class StepReport:
    """What one optimizer step did (producer: ``Trainer.train_step``; consumer: logs, metrics).

    ``step`` is the optimizer step count after this step; ``learning_rate`` the rate this step
    used (first parameter group); ``grad_norm`` the global norm before clipping (None without
    clipping); ``scheduler_step_increment`` the rollouts the scheduler advanced (always
    ``logical_rollouts``, or 0 without a scheduler); ``optimizer_steps`` always 1.
    """

    step: int
    loss: float
    logical_rollouts: int
    rows: int
    padding_rows: int
    retained_tokens: int
    clipped_tokens: int
    learning_rate: float
    grad_norm: float | None
    scheduler_step_increment: int
    optimizer_steps: int
    diagnostics: TokenDiagnostics

    def metrics(self) -> dict[str, float]:
        """Flat scalar metrics for a logger; the batch's own counters (rows, padding, advantages)
        come from ``grove.training.metrics.step_metrics``, under the same names where they
        overlap."""
        return {
            "train/loss": self.loss,
            "train/learning_rate": self.learning_rate,
            "train/grad_norm": math.nan if self.grad_norm is None else self.grad_norm,
            "train/retained_tokens": float(self.retained_tokens),
            "train/clipped_tokens": float(self.clipped_tokens),
            "train/token_mult_prob_error": self.diagnostics.token_mult_prob_error,
            "train/max_token_mult_prob_error": self.diagnostics.max_token_mult_prob_error,
            "train/gen_kl_error": self.diagnostics.gen_kl_error,
            SCHEDULER_STEP_INCREMENT: float(self.scheduler_step_increment),
            OPTIMIZER_STEPS: float(self.optimizer_steps),
        }


def step_batch(batch: TrainingBatch, advantages: LogicalAdvantages) -> StepBatch:
    """The trainer's input from an assembled batch and its logical advantages: each row takes its
    owner's advantage, and rows of rollouts that train nothing (``advantages.trained`` False)
    are excluded by ``row_mask``."""
    if advantages.rollout_ids != batch.rollout_ids:
        raise BatchError(
            "rollout_order",
            "advantages and batch must list the same logical rollouts in the same order",
        )
    return StepBatch(
        token_ids=batch.input_ids,
        loss_mask=batch.loss_mask,
        generation_logprobs=batch.generation_logprobs,
        advantages=broadcast_to_rows(advantages.advantages, batch.parent_indices),
        owners=batch.parent_indices,
        logical_rollouts=batch.num_rollouts,
        row_mask=broadcast_to_rows(advantages.trained, batch.parent_indices),
        routes=batch.routes,
        media=batch.media,
    )


def causal_token_logprobs(model: torch.nn.Module, token_ids: torch.Tensor) -> torch.Tensor:
    """Per-token logprobs ``(R, T)`` of ``token_ids`` under ``model``, differentiable.

    Position ``t`` holds log p(token_t | tokens_<t), read from the logits at ``t - 1``; position 0
    has no prediction and holds 0.0. Computed in at least float32.
    """
    output = model(token_ids)
    logits = output.logits if hasattr(output, "logits") else output  # (R, T, V)
    if not isinstance(logits, torch.Tensor) or tuple(logits.shape[:2]) != tuple(token_ids.shape):
        raise BatchError(
            "model_output",
            "the model must return logits (R, T, V) for input_ids (R, T), or an object with "
            f".logits; got {type(logits).__name__} for input {tuple(token_ids.shape)}",
        )
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    predicted = logits[:, :-1].log_softmax(dim=-1)  # (R, T-1, V)
    logprobs = predicted.gather(-1, token_ids[:, 1:, None]).squeeze(-1)  # (R, T-1)
    return torch.nn.functional.pad(logprobs, (1, 0), value=0.0)  # (R, T)


LogprobFunction = Callable[[torch.nn.Module, StepBatch, slice], torch.Tensor]
"""How the trainer computes the differentiable logprobs ``(r, T)`` of a micro batch: the model,
the step's batch, and the slice of its rows. Model features that need more than token ids
(replayed routes, media, packed trees) supply their own."""


MicroBatchPlan = Callable[[StepBatch, int], list[slice]]
"""How the trainer splits a step's rows into micro batches, given the micro batch size: slices
that tile the rows in order (default: fixed slices of that many rows). A ``LogprobFunction`` that
shares work between rows supplies one that keeps those rows together
(``grove.training.tree_logprobs.owner_micro_batches``)."""


RowLayout = Callable[[StepBatch, int], tuple[StepBatch, list[slice]]]
"""How the trainer lays out a step whose micro batches are not runs of rows in their given
order, given the micro batch size: the step's rows reordered, and slices of them that tile
them in order, each data-parallel shard (``shard_rows`` of the reordered rows) a whole number
of them. It replaces the ``MicroBatchPlan``; the step's loss and diagnostics do not depend on
the row order (``grove.training.sequence_packing.TokenBudgetBins``: token-budget bins)."""


def _fixed_micro_batches(batch: StepBatch, micro_batch_size: int) -> list[slice]:
    return [
        slice(start, start + micro_batch_size) for start in range(0, batch.rows, micro_batch_size)
    ]


def _row_grid(model: torch.nn.Module, batch: StepBatch) -> torch.Tensor:
    """Zeros ``(R, T)`` in the dtype (at least float32) and device of the model's logprobs."""
    param = next(model.parameters())
    dtype = torch.promote_types(param.dtype, torch.float32)
    return torch.zeros(batch.token_ids.shape, dtype=dtype, device=param.device)


def row_logprobs(model: torch.nn.Module, batch: StepBatch, rows: slice) -> torch.Tensor:
    """The default ``LogprobFunction``: each row as its own causal sequence of token ids."""
    return causal_token_logprobs(model, batch.token_ids[rows])


@torch.no_grad()
def recompute_token_logprobs(
    model: torch.nn.Module, token_ids: torch.Tensor, *, micro_batch_size: int
) -> torch.Tensor:
    """The trainer's logprobs ``(R, T)`` of rows, in eval mode (no dropout), in micro batches of
    rows; the model's train/eval mode is restored afterwards."""
    if micro_batch_size < 1:
        raise BatchError(
            "micro_batch_size", f"micro batch size must be >= 1, got {micro_batch_size}"
        )
    was_training = model.training
    model.eval()
    try:
        parts = [
            causal_token_logprobs(model, token_ids[start : start + micro_batch_size])
            for start in range(0, token_ids.shape[0], micro_batch_size)
        ]
    finally:
        model.train(was_training)
    return torch.cat(parts)


def rollout_warmup_scheduler(
    optimizer: torch.optim.Optimizer, *, warmup_rollouts: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A scheduler whose clock is logical rollouts: the rate rises linearly to its peak over
    ``warmup_rollouts`` (factor ``(n + 1) / (warmup_rollouts + 1)`` after ``n`` rollouts), then
    stays there (``policy.lr_warmup_rollouts``)."""
    if warmup_rollouts < 0:
        raise BatchError("warmup_rollouts", f"warm-up must be >= 0 rollouts, got {warmup_rollouts}")
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, _WarmupFactor(warmup_rollouts), last_epoch=-1
    )


@dataclass(frozen=True)
class _WarmupFactor:
    warmup_rollouts: int

    def __call__(self, rollouts: int) -> float:
        return min(1.0, (rollouts + 1) / (self.warmup_rollouts + 1))


class Trainer:
    """Takes one optimizer step per ``StepBatch``; holds the step count a checkpoint records.

    With ``unsharded`` the model is sharded with FSDP2 (``grove.training.fsdp``): every step
    checks that the ranks run equal numbers of passes, and ends by refreshing rank 0's unsharded
    copy from the shards."""

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
        *,
        global_batch_rollouts: int,
        micro_batch_size: int,
        clip: ClipRange = DEFAULT_CLIP,
        max_grad_norm: float | None = 1.0,
        min_step_batch_fraction: float = 1.0,
        logprobs: LogprobFunction = row_logprobs,
        micro_batches: MicroBatchPlan | None = None,
        layout: RowLayout | None = None,
        ranks: RankGroup = SINGLE_PROCESS,
        placement: Placement = CPU_FLOAT32,
        unsharded: UnshardedCopy | None = None,
    ) -> None:
        if global_batch_rollouts < 1 or micro_batch_size < 1:
            raise BatchError(
                "trainer_settings",
                "global batch (rollouts) and micro batch (rows) must be >= 1, got "
                f"{global_batch_rollouts} and {micro_batch_size}",
            )
        if not 0.0 < min_step_batch_fraction <= 1.0:
            raise BatchError(
                "trainer_settings",
                f"min_step_batch_fraction must be in (0, 1], got {min_step_batch_fraction}",
            )
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.global_batch_rollouts = global_batch_rollouts
        self.micro_batch_size = micro_batch_size
        self.clip = clip
        self.max_grad_norm = max_grad_norm
        self.min_step_rollouts = math.ceil(min_step_batch_fraction * global_batch_rollouts)
        self.logprobs = logprobs
        self.micro_batches = micro_batches
        self.layout = layout
        self.ranks = ranks
        self.placement = placement  # the model is already there (build_trainer puts it there)
        self.unsharded = unsharded
        self.step = 0

    def _check_cardinality(self, batch: StepBatch) -> None:
        if batch.logical_rollouts > self.global_batch_rollouts:
            raise BatchError(
                "global_batch",
                f"a step holds at most policy.train_global_batch_size = "
                f"{self.global_batch_rollouts} logical rollouts, got {batch.logical_rollouts} "
                f"(in {batch.rows} rows)",
            )
        if batch.logical_rollouts < self.min_step_rollouts:
            raise BatchError(
                "min_step_batch_fraction",
                f"the step retains {batch.logical_rollouts} of {self.global_batch_rollouts} "
                f"logical rollouts, below the floor of {self.min_step_rollouts} "
                "(async_rl.rollout_failure.min_step_batch_fraction): training stops",
            )

    def train_step(self, batch: StepBatch) -> StepReport:
        """Forward and backward every micro batch of rows, then one optimizer step; the scheduler
        advances by ``batch.logical_rollouts``."""
        self._check_cardinality(batch)
        if self.layout is not None:
            batch, planned = self.layout(batch, self.micro_batch_size)
        else:
            plan = self.micro_batches or _fixed_micro_batches
            planned = plan(batch, self.micro_batch_size)
        if self.unsharded is not None:
            check_equal_passes(planned, shard_rows(batch.rows, self.ranks.world_size))
        batch = self.placement.move_batch(batch)  # docs/train.md, "Devices, precision and ..."
        retained = retained_token_mask(batch.loss_mask, batch.owners, batch.row_mask)
        step_tokens = int(retained.sum())
        learning_rate = float(self.optimizer.param_groups[0]["lr"])
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = 0.0
        clipped = 0
        # Data-parallel shards (training/row_sharding.py): a rank runs the micro batches that start
        # in its shard of the rows, one process those of every shard; gradients, loss and logprobs
        # are then summed over the shards.
        trained_logprobs = _row_grid(self.model, batch)  # (R, T): rows trained here, zero elsewhere
        for shard in self.ranks.own_shards(batch.rows):
            for rows in shard_micro_batches(planned, shard):
                with self.placement.autocast():  # the forward only: float32 loss below
                    trainer_logprobs = self.logprobs(self.model, batch, rows)
                result = clipped_policy_gradient_loss(
                    trainer_logprobs,
                    batch.generation_logprobs[rows],
                    batch.advantages[rows],
                    retained[rows],
                    step_retained_tokens=step_tokens,
                    clip=self.clip,
                )
                result.loss.backward()
                loss += float(result.loss.detach())
                clipped += result.clipped_tokens
                trained_logprobs[rows] = trainer_logprobs.detach()
            self.ranks.end_shard(self.model.parameters())
        self.ranks.sum_gradients(self.model.parameters())
        loss, summed_clipped = self.ranks.sum_values([loss, clipped])
        clipped = int(summed_clipped)
        grad_norm = None
        if self.max_grad_norm is not None:
            grad_norm = float(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)
            )
        self.optimizer.step()
        if self.scheduler is not None:
            for _ in range(batch.logical_rollouts):
                self.scheduler.step()
        if self.unsharded is not None:
            self.unsharded.refresh(self.model)  # the engine samples the new weights
        self.step += 1
        diagnostics = token_diagnostics(
            self.ranks.sum_tensor(trained_logprobs),
            batch.generation_logprobs,
            batch.loss_mask,
            batch.owners,
            logical_rollouts=batch.logical_rollouts,
            row_mask=batch.row_mask,
        )
        return StepReport(
            step=self.step,
            loss=loss,
            logical_rollouts=batch.logical_rollouts,
            rows=batch.rows,
            padding_rows=batch.padding_rows,
            retained_tokens=step_tokens,
            clipped_tokens=clipped,
            learning_rate=learning_rate,
            grad_norm=grad_norm,
            scheduler_step_increment=batch.logical_rollouts if self.scheduler is not None else 0,
            optimizer_steps=1,
            diagnostics=diagnostics,
        )
