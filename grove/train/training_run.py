"""One training run: the projector's batches through GRPO into optimizer steps and checkpoints.

For each step the projector hands over a published batch (or rebuilds it after a restart) from
the prompt groups its group rules keep (``grove.training.groups``); a group of the batch that the
rules drop after all (a batch published by an earlier Grove, or laid out by hand) is taken out of
it, never trained with advantage 0. The drop budget (``async_rl.rollout_failure.
min_step_batch_fraction``) is checked before a step is published and again before it trains: a
step that retains too few logical rollouts — or none — stops training before the optimizer.
Then the trainer's recomputed logprobs give each rollout's pooled token multiplicative probability
error (used by ``grpo.seq_logprob_error_threshold``), advantages are computed per logical rollout,
the trainer takes one optimizer step, and a schema-5 checkpoint records the model, optimizer,
scheduler, generators, step and the projector's ledger position.
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

import torch

from grove.config import GroveConfig
from grove.ledger.store import EventStore
from grove.storage import BlobStore
from grove.training.activation_checkpointing import enable_activation_checkpointing
from grove.training.advantages import (
    AdvantageConfig,
    GroupDecision,
    MaskedRewardPolicy,
    RolloutOutcome,
    compute_advantages,
    group_decisions,
    pooled_logprob_error,
)
from grove.training.batch import TrainingBatch
from grove.training.checkpoint import (
    CheckpointMetadata,
    ResumeExpectation,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from grove.training.data_parallel import ShardedRanks
from grove.training.errors import BatchError
from grove.training.fsdp import UnshardedCopy, shard_model
from grove.training.loss import ClipRange, RowSequenceErrors, row_sequence_errors
from grove.training.media_checks import media_rules
from grove.training.media_logprobs import MediaLogprobs
from grove.training.metrics import length_metrics, rollout_lengths, step_metrics
from grove.training.placement import Placement, resolve_device
from grove.training.projector import Projector, ProjectorSettings, PublishedBatch
from grove.training.route_replay import logprob_function, recompute_logprobs
from grove.training.row_sharding import RankGroup, SingleProcess
from grove.training.sequence_packing import (
    TokenBudgetBins,
    packed_logprobs,
    recompute_packed_logprobs,
)
from grove.training.trainer import (
    LogprobFunction,
    StepBatch,
    StepReport,
    Trainer,
    rollout_warmup_scheduler,
    step_batch,
)
from grove.training.tree_logprobs import owner_micro_batches, tree_logprobs

if TYPE_CHECKING:
    from transformers import Qwen2VLConfig

__all__ = [
    "StepSummary",
    "TrainingRun",
    "advantage_config",
    "build_trainer",
    "checkpoint_due",
    "placement",
    "trainer_logprobs",
]


@dataclass(frozen=True)
class StepSummary:
    """One optimizer step: the figures the terminal shows, and every metric of the step
    (``docs/metrics.md``) for the run's metrics log."""

    step: int
    reward: float
    logical_rollouts: int
    rows: int
    masked: int
    dropped_groups: int
    loss: float
    max_tmpe: float
    gen_kl_error: float
    rebuilt: bool
    checkpoint: str | None
    metrics: dict[str, float]


def advantage_config(config: GroveConfig) -> AdvantageConfig:
    """The advantage settings named by the configuration's ``grpo`` and ``token_capture`` keys."""
    grpo = config.grpo
    return AdvantageConfig(
        advantage_clip_low=grpo.advantage_clip_low,
        advantage_clip_high=grpo.advantage_clip_high,
        masked_reward_policy=MaskedRewardPolicy(grpo.masked_reward_policy),
        min_valid_fraction_per_group=config.token_capture.min_valid_fraction_per_group,
        seq_logprob_error_threshold=grpo.seq_logprob_error_threshold,
        overlong_filtering=grpo.overlong_filtering,
        normalize_std=grpo.normalize_rewards,
        leave_one_out_baseline=grpo.use_leave_one_out_baseline,
    )


def trainer_logprobs(config: GroveConfig, model: torch.nn.Module) -> LogprobFunction:
    """How the trainer computes ``model``'s logprobs: ``tree_logprobs`` with
    ``policy.tree_packing``; ``MediaLogprobs`` for the vision-language model
    (``model.architecture: vlm``: each row with its captured images, the vision tokens masked as
    the engine masks them, ``docs/media.md``); else plain rows, MoE routes replayed."""
    if config.policy.sequence_packing.enabled:
        return packed_logprobs  # each bin one sequence of rows (docs/train.md)
    if config.policy.tree_packing:
        return tree_logprobs
    if config.model.architecture == "vlm":
        vlm = cast("Qwen2VLConfig", model.config)  # architecture vlm: the embedded Qwen2-VL
        return MediaLogprobs(
            image_token_id=int(vlm.image_token_id),
            excluded_token_ids=[
                int(vlm.vision_start_token_id),
                int(vlm.vision_end_token_id),
                int(vlm.image_token_id),
                int(vlm.video_token_id),
            ],
        )
    return logprob_function(model)


def placement(config: GroveConfig) -> Placement:
    """The learner's device and precision (``policy.device``, ``policy.precision``; ``auto`` is
    the CPU for the vision-language model); raises ``grove.training.placement.DeviceUnavailable``
    for ``cuda`` without CUDA."""
    device = config.policy.device
    if config.model.architecture == "vlm":
        device = "cpu"  # the embedded vision-language model runs on the CPU (cuda is refused)
    return Placement(resolve_device(device), config.policy.precision)


def build_trainer(
    config: GroveConfig, model: torch.nn.Module, *, ranks: RankGroup | None = None
) -> Trainer:
    """The trainer of ``model`` with the configuration's optimizer (AdamW), scheduler (warm-up in
    logical rollouts), batches and loss; every data-parallel rank builds the same one. Without
    ``ranks`` one process trains the shards of all ``policy.data_parallel_size`` ranks.

    On ``ShardedRanks`` (``policy.dtensor_cfg.enabled`` under ``torchrun``) the trainer trains
    an FSDP2-sharded model: rank 0 shards a copy and keeps ``model`` whole for its engine
    (``UnshardedCopy``, refreshed after every step), the other ranks shard ``model`` itself."""
    policy = config.policy
    placed = placement(config)
    # In place, before the optimizer exists, so its state is created on the device; the embedded
    # engine samples these same parameters, so it follows (docs/train.md, "Devices, ...").
    model.to(placed.device)
    ranks = ranks if ranks is not None else SingleProcess(policy.data_parallel_size)
    trained, unsharded = model, None
    if isinstance(ranks, ShardedRanks):
        main = ranks.rank == 0
        trained = copy.deepcopy(model) if main else model
        unsharded = UnshardedCopy(model if main else None, _adamw(config, model) if main else None)
    if policy.dtensor_cfg.activation_checkpointing:
        enable_activation_checkpointing(trained)
    if unsharded is not None:
        shard_model(trained)  # docs/train.md, "Sharded training with FSDP2"
    optimizer = _adamw(config, trained)
    scheduler = rollout_warmup_scheduler(optimizer, warmup_rollouts=policy.lr_warmup_rollouts)
    return Trainer(
        trained,
        optimizer,
        scheduler,
        global_batch_rollouts=policy.train_global_batch_size,
        micro_batch_size=policy.train_micro_batch_size,
        clip=ClipRange(low=config.loss_fn.ratio_clip_min, high=config.loss_fn.ratio_clip_max),
        max_grad_norm=policy.max_grad_norm,
        min_step_batch_fraction=config.async_rl.rollout_failure.min_step_batch_fraction,
        ranks=ranks,
        logprobs=trainer_logprobs(config, model),
        micro_batches=owner_micro_batches if policy.tree_packing else None,
        layout=TokenBudgetBins(policy.sequence_packing.train_mb_tokens, policy.data_parallel_size)
        if policy.sequence_packing.enabled
        else None,
        placement=placed,
        unsharded=unsharded,
    )


def _adamw(config: GroveConfig, model: torch.nn.Module) -> torch.optim.AdamW:
    policy = config.policy
    return torch.optim.AdamW(
        model.parameters(), lr=policy.learning_rate, weight_decay=policy.weight_decay
    )


def checkpoint_due(config: GroveConfig, step: int) -> bool:
    """Whether the run checkpoints after optimizer step ``step`` (``checkpointing``)."""
    checkpointing = config.checkpointing
    return checkpointing.enabled and step % checkpointing.save_period == 0


class TrainingRun:
    """The consuming side of one run: projector, trainer, checkpoints.

    With ``run_id`` the run publishes on the stream ``training-{run_id}`` and follows only
    attempts whose capture keys start with ``capture_prefix`` (default ``{run_id}-``; empty:
    every attempt), so several runs can share one ledger. ``ranks`` are the data-parallel ranks
    it leads (``grove/train/distributed.py``): each step's batch is broadcast to them before it
    trains.
    """

    HORIZON_WAIT_S = 30.0  # how long a step waits for events held behind the reader's horizon

    def __init__(
        self,
        store: EventStore,
        blobs: BlobStore,
        model: torch.nn.Module,
        config: GroveConfig,
        checkpoint_dir: Path,
        *,
        pad_token_id: int = 0,
        run_id: str = "",
        capture_prefix: str | None = None,
        ranks: RankGroup | None = None,
    ) -> None:
        self.config = config
        self.model = model
        self.checkpoint_dir = checkpoint_dir
        policy = config.policy
        self.projector = Projector(
            store,
            blobs,
            ProjectorSettings(
                rollouts_per_group=config.grpo.num_generations_per_prompt,
                groups_per_step=config.grpo.num_prompts_per_step,
                row_multiple=policy.execution_row_multiple,
                pad_token_id=pad_token_id,
                training_stream=f"training-{run_id}" if run_id else "training",
                capture_prefix=(f"{run_id}-" if run_id else "")
                if capture_prefix is None
                else capture_prefix,
                forest_training=config.token_capture.forest_training,
                max_row_tokens=policy.max_total_sequence_length,
                min_valid_fraction=config.token_capture.min_valid_fraction_per_group,
                max_policy_lag=config.async_rl.max_policy_lag,
                media_rules=media_rules(model.config)
                if config.model.architecture == "vlm"
                else None,
            ),
        )
        self.trainer = build_trainer(config, model, ranks=ranks)
        self.advantages = advantage_config(config)

    @property
    def step(self) -> int:
        """Optimizer steps taken (the next step to train)."""
        return self.trainer.step

    def resume(self) -> Path | None:
        """Restore the latest checkpoint under the checkpoint directory, if any."""
        path = latest_checkpoint(self.checkpoint_dir)
        if path is None:
            return None
        meta = load_checkpoint(
            path,
            model=self.model,
            optimizer=self._whole_optimizer(),
            scheduler=self.trainer.scheduler,
            expect=ResumeExpectation(
                forest_mode=self.config.token_capture.forest_training,
                execution_row_multiple=self.config.policy.execution_row_multiple,
                config_digest=self.config.digest(),
                data_parallel_size=self.config.policy.data_parallel_size,
            ),
        )
        self.trainer.step = meta.step
        return path

    def step_rewards(self) -> list[float]:
        """Mean reward per trained step of this run, from the ledger."""
        return self.projector.step_rewards()[: self.trainer.step]

    def next_batch(self) -> PublishedBatch | None:
        """The batch of the next step: rebuilt when it was published already, else published
        from the first ``grpo.num_prompts_per_step`` complete prompt groups the group rules keep,
        once the ledger holds that many (None until then)."""
        self._catch_up()
        return self.projector.batch_for_step(self.trainer.step)

    def published_batch(self) -> PublishedBatch | None:
        """The batch of the next step when it was published already (a resumed run), else None."""
        self._catch_up()
        if self.projector.published_steps <= self.trainer.step:
            return None
        return self.projector.batch_for_step(self.trainer.step)

    def group_decisions(self, groups: Sequence[str]) -> list[GroupDecision]:
        """Whether each of ``groups`` may train in the next step; every one must be complete (an
        in-process harness played all of their rollouts)."""
        self._catch_up()
        step = self.trainer.step
        decisions = [self.projector.group_decision(g, step) for g in groups]
        incomplete = [g for g, d in zip(groups, decisions, strict=True) if d is None]
        if incomplete:
            raise BatchError(
                "incomplete_groups",
                f"step {step}: the harness played every rollout of prompt groups {incomplete}, "
                "yet the projector holds fewer finalized rollouts than each needs; the ledger "
                "is behind or inconsistent (grove lineage shows the attempts)",
            )
        return [d for d in decisions if d is not None]

    def publish(self, decisions: Sequence[GroupDecision]) -> PublishedBatch:
        """Publish the next step from the kept groups of ``decisions`` (every group played for
        it), unless the dropped ones leave fewer logical rollouts than the drop budget allows."""
        step = self.trainer.step
        kept = [d for d in decisions if d.kept]
        dropped = [d for d in decisions if not d.kept]
        self._check_drop_budget(step, sum(d.rollouts for d in kept), dropped)
        published = self.projector.batch_for_step(step, groups=[d.group_id for d in kept])
        if published is None:
            raise BatchError(
                "incomplete_groups",
                f"step {step}: the projector could not publish prompt groups "
                f"{[d.group_id for d in kept]}, though each was decided complete",
            )
        return published

    def train(self, published: PublishedBatch) -> StepSummary:
        """One optimizer step on ``published`` and its checkpoint."""
        if published.step != self.trainer.step:
            raise BatchError(
                "step", f"batch of step {published.step} offered at step {self.trainer.step}"
            )
        started = time.perf_counter()
        published, decisions = self._kept_groups(published)
        outcomes, recomputed = self._outcomes(published)
        advantages = compute_advantages(outcomes, self.advantages)
        # Every data-parallel rank trains its shard of the same step (one process: all of it).
        batch = self.trainer.ranks.broadcast(step_batch(published.batch, advantages))
        rows = self._row_errors(batch, recomputed)
        report = self.trainer.train_step(batch)
        metrics = {
            **report.metrics(),
            **(rows.metrics() if rows is not None else {}),
            **step_metrics(
                outcomes=outcomes,
                decisions=decisions,
                advantages=advantages,
                batch=published.batch,
            ),
            **length_metrics([rollout_lengths(r.forest) for r in published.rollouts]),
            **_reward_metrics(outcomes),
            "logical_rollouts": float(published.batch.num_rollouts),
            "throughput/tokens_per_s": _row_tokens(published.batch)
            / max(time.perf_counter() - started, 1e-9),
        }
        checkpoint = self._checkpoint(published)
        return _summary(published, outcomes, decisions, report, checkpoint, metrics)

    def _catch_up(self) -> None:
        self.projector.store.wait_for_horizon(self.HORIZON_WAIT_S)
        self.projector.poll()

    def _kept_groups(self, published: PublishedBatch) -> tuple[PublishedBatch, list[GroupDecision]]:
        """``published`` without the groups the rules drop after all, and every group decision of
        the step (the batch's, then those dropped before it was published); stops training when
        what is left is below the drop budget."""
        decisions = group_decisions(
            published.outcomes, self.advantages.min_valid_fraction_per_group
        )
        kept = [d for d in decisions if d.kept]
        dropped = [*published.dropped, *(d for d in decisions if not d.kept)]
        self._check_drop_budget(published.step, sum(d.rollouts for d in kept), dropped)
        if len(kept) < len(decisions):
            groups = {d.group_id for d in kept}
            rollouts = tuple(r for r in published.rollouts if r.group_id in groups)
            batch = self.projector.assemble(rollouts)
            published = replace(published, batch=batch, rollouts=rollouts)
        return published, [*kept, *dropped]

    def _check_drop_budget(
        self, step: int, kept_rollouts: int, dropped: Sequence[GroupDecision]
    ) -> None:
        """Stop training when the step retains fewer logical rollouts than
        ``async_rl.rollout_failure.min_step_batch_fraction`` allows (a step that retains no group
        never reaches the optimizer), naming each dropped group and why."""
        floor = self.trainer.min_step_rollouts
        if kept_rollouts >= floor:
            return
        named = ", ".join(
            f"{d.group_id} ({d.reason}" + (f": {d.detail})" if d.detail else ")") for d in dropped
        )
        raise BatchError(
            "min_step_batch_fraction",
            f"step {step}: dropped prompt groups {named} leave {kept_rollouts} of "
            f"{self.trainer.global_batch_rollouts} logical rollouts, below the floor of {floor} "
            "(async_rl.rollout_failure.min_step_batch_fraction): training stops. Lower the "
            "fraction to tolerate drops, allow replacements "
            "(async_rl.rollout_failure.max_replacement_groups), or see why the rollouts were "
            "dropped (grove lineage)",
        )

    def _outcomes(
        self, published: PublishedBatch
    ) -> tuple[list[RolloutOutcome], torch.Tensor | None]:
        """Each rollout's outcome, with its pooled logprob error when
        ``grpo.seq_logprob_error_threshold`` is set, and the rows' recomputed logprobs
        ``(R, T)`` it was judged from (None without a threshold)."""
        outcomes = published.outcomes
        if self.advantages.seq_logprob_error_threshold is None:
            return outcomes, None
        batch = published.batch
        placed = self.trainer.placement
        if isinstance(self.trainer.logprobs, MediaLogprobs):
            recomputed = self._media_logprobs(batch.input_ids, batch.media)
        elif self.config.policy.sequence_packing.enabled:
            recomputed = recompute_packed_logprobs(
                self.model,
                batch.input_ids,
                batch.loss_mask,
                tokens=self.config.policy.sequence_packing.logprob_mb_tokens,
            ).cpu()
        else:
            routes = None if batch.routes is None else batch.routes.to(placed.device)
            with placed.autocast():
                recomputed = recompute_logprobs(
                    self.model,
                    batch.input_ids.to(placed.device),
                    routes,
                    micro_batch_size=self.config.policy.logprob_micro_batch_size,
                ).cpu()
        errors = pooled_logprob_error(
            batch.generation_logprobs,
            recomputed,
            batch.loss_mask,
            batch.token_owners(),
            batch.num_rollouts,
        ).tolist()
        judged = [
            replace(o, logprob_error=None if math.isnan(e) else e)
            for o, e in zip(outcomes, errors, strict=True)
        ]
        return judged, recomputed

    def _row_errors(
        self, batch: StepBatch, recomputed: torch.Tensor | None
    ) -> RowSequenceErrors | None:
        """The step's per-row sequence errors against ``grpo.seq_logprob_error_threshold``, from
        the logprobs the rollouts were judged by (None without a threshold)."""
        threshold = self.advantages.seq_logprob_error_threshold
        if recomputed is None or threshold is None:
            return None
        return row_sequence_errors(
            recomputed,
            batch.generation_logprobs,
            batch.loss_mask,
            batch.owners,
            row_mask=batch.row_mask,
            threshold=threshold,
        )

    @torch.no_grad()
    def _media_logprobs(self, token_ids: torch.Tensor, media: tuple) -> torch.Tensor:
        """The rows' logprobs ``(R, T)`` with their images (``MediaLogprobs``), in eval mode."""
        rows = token_ids.shape[0]
        zeros = torch.zeros(token_ids.shape)
        batch = StepBatch(
            token_ids=token_ids,
            loss_mask=zeros.bool(),
            generation_logprobs=zeros,
            advantages=torch.zeros(rows),
            owners=torch.zeros(rows, dtype=torch.long),
            logical_rollouts=1,
            media=media,
        )
        size = self.config.policy.logprob_micro_batch_size
        was_training = self.model.training
        self.model.eval()
        try:
            parts = [
                self.trainer.logprobs(self.model, batch, slice(start, start + size))
                for start in range(0, rows, size)
            ]
        finally:
            self.model.train(was_training)
        return torch.cat(parts)

    def _whole_optimizer(self) -> torch.optim.Optimizer:
        """The optimizer a checkpoint is written from and restored into: the trainer's, or for
        a sharded model rank 0's plain one over the whole model (``UnshardedCopy``; the shards
        are scattered from it by ``share_training_state``)."""
        unsharded = self.trainer.unsharded
        if unsharded is None:
            return self.trainer.optimizer
        if unsharded.optimizer is None:
            raise BatchError("unsharded_copy", "only rank 0 restores or writes checkpoints")
        return unsharded.optimizer

    def _checkpoint(self, published: PublishedBatch) -> str | None:
        if not checkpoint_due(self.config, self.trainer.step):
            return None
        unsharded = self.trainer.unsharded
        if unsharded is not None:  # every rank gathers (distributed.follow_main_rank)
            unsharded.gather_optimizer(self.trainer.model, self.trainer.optimizer)
        try:
            return self._save(published)
        finally:
            if unsharded is not None:
                unsharded.clear()

    def _save(self, published: PublishedBatch) -> str:
        position = published.position
        path = save_checkpoint(
            self.checkpoint_dir,
            model=self.model,
            optimizer=self._whole_optimizer(),
            scheduler=self.trainer.scheduler,
            metadata=CheckpointMetadata(
                step=self.trainer.step,
                forest_mode=self.config.token_capture.forest_training,
                execution_row_multiple=self.config.policy.execution_row_multiple,
                data_parallel_size=self.config.policy.data_parallel_size,
                selection_policy=self.config.token_capture.selection_policy,
                config_digest=self.config.digest(),
                projector_position={
                    "published_step": published.step,
                    "transaction_id": position.transaction_id,
                    "position": position.position,
                },
            ),
        )
        return str(path)


def _reward_metrics(outcomes: list[RolloutOutcome]) -> dict[str, float]:
    rewards = torch.tensor([o.reward for o in outcomes], dtype=torch.float64)
    std = float(rewards.std(correction=0)) if len(outcomes) > 1 else 0.0
    return {"reward/mean": float(rewards.mean()), "reward/std": std}


def _row_tokens(batch: TrainingBatch) -> float:
    """Tokens of the real rows (padding rows and right padding left out)."""
    real = batch.parent_indices >= 0
    return float(batch.attention_mask[real].sum())


def _summary(
    published: PublishedBatch,
    outcomes: list[RolloutOutcome],
    decisions: list[GroupDecision],
    report: StepReport,
    checkpoint: str | None,
    metrics: dict[str, float],
) -> StepSummary:
    rewards = [o.reward for o in outcomes]
    batch = published.batch
    return StepSummary(
        step=report.step,
        reward=sum(rewards) / len(rewards),
        logical_rollouts=batch.num_rollouts,
        rows=batch.num_rows - batch.num_padding_rows,
        masked=sum(o.masked_reason is not None for o in outcomes),
        dropped_groups=sum(not d.kept for d in decisions),
        loss=report.loss,
        max_tmpe=report.diagnostics.max_token_mult_prob_error,
        gen_kl_error=report.diagnostics.gen_kl_error,
        rebuilt=published.rebuilt,
        checkpoint=checkpoint,
        metrics=metrics,
    )
