"""The main job, ``grove train CONFIG.yaml``: the user's model, harness and tasks, with GRPO.

One process holds everything (``docs/train.md``): the model (``model``: embedded or a local
Hugging Face directory) is the policy the trainer updates and the embedded engine samples from,
so every call after an optimizer step samples the new weights; the gateway (``engine``) captures
every call into the workspace's ledger and blob store; the projector turns settled, selected
attempts into forest rows; the trainer takes one GRPO step per batch of prompt groups and
checkpoints (``checkpointing``); each step's metrics go to ``WORKDIR/runs/RUN/`` (``logging``).

Rollouts come from an in-process harness (``harness.target: module:function``), which plays
``grpo.num_prompts_per_step`` tasks of the task file per step, ``grpo.num_generations_per_prompt``
rollouts each; or from agents anywhere (``harness.target: external``), which open attempts on the
gateway themselves — the run then trains on complete prompt groups in the order they complete.
A group whose rollout failed, hung or was masked too often, or whose calls lag in policy version,
is dropped; an in-process step replaces a few and otherwise shrinks under its drop budget
(``grove.train.step_batches``; ``docs/forest.md``, "Failures and drops").

``--resume`` continues the latest run (or ``--run``) from its last checkpoint: the trainer's state
is restored bitwise, a step's tasks and rollout seeds depend only on the configuration and the
step, and unseeded calls are sampled with a seed derived from their rollout
(``docs/gateway.md``, "Sampling"), so the resumed run reaches the weights of a run that was never
interrupted. Attempts of an interrupted step are abandoned (they never settle, so never train) and
its rollouts are played again under fresh capture keys.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

import numpy
import torch
from fastapi import FastAPI
from rich.console import Console

from grove.config import EXTERNAL, GroveConfig
from grove.engines.models import LoadedModel, load_model
from grove.engines.policy import PolicyEngine, open_policy_engine
from grove.ledger import migrate
from grove.ledger.store import EventStore
from grove.services.serve import ServerThread, build_gateway, gateway_options
from grove.storage import open_blob_store
from grove.train.distributed import (
    data_parallel_ranks,
    end_run,
    follow_main_rank,
    leading_ranks,
    share_training_state,
)
from grove.train.fork_groups import SourceRollout, fork_metrics
from grove.train.preflight import check_policy_model, preflight
from grove.train.progress import StepProgress
from grove.train.rollouts import StepPlayer
from grove.train.roots import root_metrics
from grove.train.run_log import RunLog
from grove.train.runs import RunDirectory, find_run, new_run
from grove.train.step_batches import OverdueAttempts, awaited_batch, fork_sources, played_batch
from grove.train.training_run import StepSummary, TrainingRun
from grove.training.cleanup import clean_step
from grove.training.projector import PublishedBatch
from grove.training.row_sharding import RankGroup
from grove.workspace import Workspace

__all__ = ["TrainSummary", "run_training"]

REPLACEMENT_GROUPS = "replacement_groups"  # the metric: replacement groups played for a step


@dataclass(frozen=True)
class TrainSummary:
    """The run's final line (``--json``)."""

    steps: int
    logical_rollouts: int
    rows: int
    max_tmpe: float
    max_gen_kl_error: float
    reward_first: float
    reward_last: float
    checkpoint: str | None
    run_id: str

    def as_dict(self) -> dict[str, Any]:
        """The summary as JSON-able values."""
        return asdict(self)


def run_training(
    config: GroveConfig,
    workspace: Workspace,
    *,
    source: str = "configuration",
    steps: int | None = None,
    resume: bool = False,
    run_id: str | None = None,
    console: Console | None = None,
) -> TrainSummary:
    """Train (or resume) up to ``steps`` optimizer steps (default ``grpo.max_num_steps``). Under
    ``torchrun`` rank 0 runs the job and every other rank trains its shard of each step
    (``grove/train/distributed.py``); every rank returns the run's summary."""
    with data_parallel_ranks(config) as ranks:
        if ranks.rank > 0:
            return follow_main_rank(config, ranks, TrainSummary)
        with leading_ranks(ranks):
            summary = _lead_training(
                config,
                workspace,
                ranks,
                source=source,
                steps=steps,
                resume=resume,
                run_id=run_id,
                console=console,
            )
            end_run(ranks, summary)
        return summary


def _lead_training(
    config: GroveConfig,
    workspace: Workspace,
    ranks: RankGroup,
    *,
    source: str,
    steps: int | None,
    resume: bool,
    run_id: str | None,
    console: Console | None,
) -> TrainSummary:
    """The job itself: one process's, or rank 0's under ``torchrun``."""
    checked = preflight(config, source)
    # Before anything is written: a schema absent (PostgreSQL), behind or ahead is refused.
    migrate.require_current(workspace.database_url, create_embedded=True)
    target = steps if steps is not None else config.grpo.max_num_steps
    if resume:
        run = find_run(workspace, config, run_id)
    else:
        run = new_run(workspace, config, source, run_id)
    _seed_everything(config.seed)
    loaded = load_model(
        config.model.path,
        dtype=config.model.dtype,
        seed=config.seed,
        warm_start_dir=workspace.workdir if config.model.warm_start else None,
        architecture=config.model.architecture,
    )
    check_policy_model(loaded.model, loaded.name, engine_kind=config.engine.kind)  # docs/moe.md
    store = EventStore.open(workspace.database_url)
    try:
        training = _training_run(config, workspace, store, loaded, run, ranks)
        if resume:
            restored = training.resume()
            if restored is not None and console is not None:
                console.print(f"resumed run {run.run_id} at step {training.step} ({restored})")
        share_training_state(ranks, training.trainer)
        policy = open_policy_engine(config, loaded, step=training.step)
        try:
            app = _gateway(config, workspace, loaded, policy)
            with ServerThread(app, host=config.engine.host, port=config.engine.port) as server:
                base_url = f"{server.base_url}/v1"
                run.record(gateway=base_url, model=loaded.name)
                if console is not None:
                    console.print(f"run {run.run_id}: gateway {base_url}, model {loaded.name}")
                player = None
                if checked.harness is not None:
                    player = StepPlayer(
                        config,
                        checked.harness,
                        checked.tasks,
                        run_id=run.run_id,
                        store=store,
                        base_url=base_url,
                        attempt_secret=run.attempt_secret(),
                    )
                loop = _Loop(config, training, policy, player, store)
                with RunLog(run.path, tensorboard=config.logging.tensorboard) as log:
                    history = loop.run(target, log, console)
        finally:
            policy.close()
    finally:
        store.close()
    return _summarize(history, training, run.run_id)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    numpy.random.seed(seed)
    torch.manual_seed(seed)


def _training_run(
    config: GroveConfig,
    workspace: Workspace,
    store: EventStore,
    loaded: LoadedModel,
    run: RunDirectory,
    ranks: RankGroup,
) -> TrainingRun:
    external = config.harness.target == EXTERNAL
    return TrainingRun(
        store,
        open_blob_store(workspace.blob_url),
        loaded.model,
        config,
        run.checkpoints,
        pad_token_id=_pad_token_id(loaded),
        run_id=run.run_id,
        capture_prefix="" if external else None,
        ranks=ranks,
    )


def _pad_token_id(loaded: LoadedModel) -> int:
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad)


def _gateway(
    config: GroveConfig, workspace: Workspace, loaded: LoadedModel, policy: PolicyEngine
) -> FastAPI:
    """The gateway on the run's engine, with every gateway key of ``config`` (the same
    ``gateway_options`` ``grove serve`` uses)."""
    return build_gateway(
        workspace,
        engine=policy.engine,
        tokenizer=loaded.tokenizer,
        model_name=loaded.name,
        max_context=min(policy.context_length, config.policy.max_total_sequence_length),
        **gateway_options(config),
    )


@dataclass
class _Loop:
    """The step loop: rollouts (played, or awaited from external agents), the optimizer step,
    the new weights published to the engine, the metrics logged."""

    config: GroveConfig
    training: TrainingRun
    policy: PolicyEngine
    player: StepPlayer | None
    store: EventStore
    overdue: OverdueAttempts | None = None  # external: attempts open without a result
    previous: PublishedBatch | None = None  # the last step's batch: grpo.forks picks from it

    def run(self, target: int, log: RunLog, console: Console | None) -> list[StepSummary]:
        """Steps until ``target`` (or until the task file is used up)."""
        training = self.training
        grpo = self.config.grpo
        per_step = grpo.num_prompts_per_step * grpo.num_generations_per_prompt
        total = max(target - training.step, 0) * per_step
        history: list[StepSummary] = []
        with StepProgress(console, total_rollouts=total) as progress:
            while training.step < target:
                published = self._next_batch(progress)
                if published is None:
                    progress.note(f"the task file is used up after {training.step} steps")
                    break
                with self.policy.updating():  # no call samples weights that are changing
                    summary = training.train(published)
                    self.policy.publish(summary.step)
                metrics = {**summary.metrics, **root_metrics(self.store, published, progress.note)}
                if self.player is not None:
                    replacements = _replacements(self.player, published)
                    metrics[REPLACEMENT_GROUPS] = float(replacements)
                if self.player is not None and self.config.grpo.forks.per_step:
                    metrics.update(_fork_metrics(self.player, published))
                self.previous = published
                log.log(summary.step, metrics)
                clean_step(
                    self.store,
                    training.projector.blobs,
                    published,
                    window_s=self.config.token_capture.pending_call_timeout_s,
                )
                history.append(summary)
                progress.step_done(summary)
        return history

    def _next_batch(self, progress: StepProgress) -> PublishedBatch | None:
        """The next step's batch (``grove.train.step_batches``); None once the task file is used
        up."""
        if self.player is not None:
            return played_batch(self.training, self.player, progress, self._fork_sources())
        timeout = self.config.async_rl.rollout_failure.rollout_timeout_s
        if timeout is not None and self.overdue is None:
            self.overdue = OverdueAttempts(timeout)
        return awaited_batch(self.training, self.overdue, progress)

    def _fork_sources(self) -> list[SourceRollout]:
        """The previous step's rollouts, which ``grpo.forks`` picks turns from (that step's
        batch rebuilt from the ledger when this process did not train it: a resumed run)."""
        step = self.training.step
        if not self.config.grpo.forks.per_step or step == 0:
            return []
        if self.previous is None or self.previous.step != step - 1:
            self.previous = self.training.projector.batch_for_step(step - 1)
        return [] if self.previous is None else fork_sources(self.previous)


def _fork_metrics(player: StepPlayer, published: PublishedBatch) -> dict[str, float]:
    """``forks/groups`` and ``forks/reward_variance`` of the step (``grove.train.fork_groups``)."""
    groups = player.forks_in(published.step, sorted({r.group_id for r in published.rollouts}))
    rewards = {g: [r.reward for r in published.rollouts if r.group_id == g] for g in groups}
    return fork_metrics(rewards)


def _replacements(player: StepPlayer, published: PublishedBatch) -> int:
    """Replacement groups played for the step: in its batch, or dropped themselves."""
    groups = {r.group_id for r in published.rollouts} | {d.group_id for d in published.dropped}
    return player.replacements_in(published.step, sorted(groups))


def _summarize(history: list[StepSummary], training: TrainingRun, run_id: str) -> TrainSummary:
    rewards = training.step_rewards()
    first, last = rewards[:3], rewards[-3:]
    latest = [h.checkpoint for h in history if h.checkpoint]
    return TrainSummary(
        steps=training.step,
        logical_rollouts=sum(h.logical_rollouts for h in history),
        rows=sum(h.rows for h in history),
        max_tmpe=max((h.max_tmpe for h in history), default=1.0),
        max_gen_kl_error=max((h.gen_kl_error for h in history), default=0.0),
        reward_first=sum(first) / len(first) if first else 0.0,
        reward_last=sum(last) / len(last) if last else 0.0,
        checkpoint=latest[-1] if latest else None,
        run_id=run_id,
    )
