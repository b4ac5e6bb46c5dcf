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

``--resume`` continues the latest run (or ``--run``) from its last checkpoint: the trainer's state
is restored bitwise, a step's tasks and rollout seeds depend only on the configuration and the
step, and unseeded calls are sampled with a seed derived from their rollout
(``docs/gateway.md``, "Sampling"), so the resumed run reaches the weights of a run that was never
interrupted. Attempts of an interrupted step are abandoned (they never settle, so never train) and
its rollouts are played again under fresh capture keys.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import numpy
import torch
from rich.console import Console

from capture.embedded import EmbeddedEngine
from grove.client import GroveClient
from grove.config import EXTERNAL, GroveConfig
from grove.jobs.harness import RolloutSpec, play_rollout, rollout_seed
from grove.jobs.models import LoadedModel, load_model
from grove.jobs.preflight import Preflight, preflight
from grove.jobs.progress import StepProgress
from grove.jobs.run_log import RunLog
from grove.jobs.runs import RunDirectory, find_run, new_run
from grove.jobs.serve import ServerThread, build_gateway
from grove.jobs.tasks import step_tasks, task_order
from grove.jobs.training_run import StepSummary, TrainingRun
from grove.workspace import Workspace
from ledger.attempt import AttemptLog
from ledger.store import EventStore
from storage import open_blob_store
from training.projector import PublishedBatch

__all__ = ["TrainSummary", "run_training"]

POLL_INTERVAL_S = 0.5  # how often an external run looks for complete prompt groups


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
    """Train (or resume) up to ``steps`` optimizer steps (default ``grpo.max_num_steps``)."""
    checked = preflight(config, source)
    target = steps if steps is not None else config.grpo.max_num_steps
    run = find_run(workspace, config, run_id) if resume else new_run(
        workspace, config, source, run_id
    )  # fmt: skip
    _seed_everything(config.seed)
    loaded = load_model(config.model.path, dtype=config.model.dtype, seed=config.seed)
    store = EventStore.open(workspace.database_url)
    try:
        training = _training_run(config, workspace, store, loaded, run)
        if resume:
            restored = training.resume()
            if restored is not None and console is not None:
                console.print(f"resumed run {run.run_id} at step {training.step} ({restored})")
        with _gateway(config, workspace, loaded) as server, RunLog(
            run.path, tensorboard=config.logging.tensorboard
        ) as log:  # fmt: skip
            base_url = f"{server.base_url}/v1"
            run.record(gateway=base_url, model=loaded.name)
            if console is not None:
                console.print(f"run {run.run_id}: gateway {base_url}, model {loaded.name}")
            history = _train(config, checked, training, run, store, base_url, log, target, console)
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
    )


def _pad_token_id(loaded: LoadedModel) -> int:
    tokenizer = loaded.tokenizer
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return int(pad)


@contextmanager
def _gateway(
    config: GroveConfig, workspace: Workspace, loaded: LoadedModel
) -> Iterator[ServerThread]:
    """The gateway on the policy's own weights, served in a thread for the run's duration."""
    tokenizer = loaded.tokenizer
    engine = EmbeddedEngine(loaded.model, stop_token_ids=[tokenizer.eos_token_id], seed=config.seed)
    context = int(loaded.model.config.max_position_embeddings)
    app = build_gateway(
        workspace,
        engine=engine,
        tokenizer=tokenizer,
        model_name=loaded.name,
        auth_token=config.engine.auth_token,
        max_context=min(context, config.policy.max_total_sequence_length),
        default_max_tokens=config.engine.default_max_tokens,
        settle_timeout_s=config.token_capture.pending_call_timeout_s,
    )
    with ServerThread(app, host=config.engine.host, port=config.engine.port) as server:
        yield server


def _train(
    config: GroveConfig,
    checked: Preflight,
    training: TrainingRun,
    run: RunDirectory,
    store: EventStore,
    base_url: str,
    log: RunLog,
    target: int,
    console: Console | None,
) -> list[StepSummary]:
    """Steps until ``target``; each step's rollouts, then its optimizer step and metrics."""
    history: list[StepSummary] = []
    per_step = config.grpo.num_prompts_per_step * config.grpo.num_generations_per_prompt
    play = _player(config, checked, run, store, base_url)
    with StepProgress(console, total_rollouts=(target - training.step) * per_step) as progress:
        while training.step < target:
            if play is not None and not play(training.step, progress.advance):
                progress.note(f"the task file is used up after {training.step} steps")
                break
            published = _next_batch(training, play is None, progress)
            summary = training.train(published)
            log.log(summary.step, {**summary.metrics, **_root_counts(store, published)})
            history.append(summary)
            progress.step_done(summary)
    return history


def _player(
    config: GroveConfig, checked: Preflight, run: RunDirectory, store: EventStore, base_url: str
) -> Callable[[int, Callable[[], None]], bool] | None:
    """For an in-process harness, a function that plays a step's rollouts (False when the task
    file is used up); None for external agents."""
    harness = checked.harness
    if harness is None:
        return None
    groups, per_group = config.grpo.num_prompts_per_step, config.grpo.num_generations_per_prompt
    data = config.data
    order = task_order(len(checked.tasks), shuffle=data.shuffle, seed=data.shuffle_seed,
                       epochs=data.epochs)  # fmt: skip
    log = AttemptLog(store)
    token = config.engine.auth_token or "grove"

    def play(step: int, advance: Callable[[], None]) -> bool:
        tasks = step_tasks(order, step, groups)
        if tasks is None:
            return False
        specs = []
        for g, task in enumerate(tasks):
            group = f"{run.run_id}-s{step}-g{g}"
            for r in range(per_group):
                rollout_id = f"{group}-r{r}"
                key = _fresh_key(log, rollout_id)
                if key is None:  # a resumed run: this rollout already completed
                    advance()
                    continue
                seed = rollout_seed(config.seed, step, g, r)
                specs.append(RolloutSpec(key, rollout_id, group, r, checked.tasks[task], seed))
        with GroveClient(base_url, api_key=token) as grove, ThreadPoolExecutor(
            config.harness.concurrency
        ) as pool:  # fmt: skip
            futures = [
                pool.submit(
                    play_rollout,
                    grove,
                    harness,
                    spec,
                    config.harness.options,
                    forest_mode=config.token_capture.forest_training,
                    selection_policy=config.token_capture.selection_policy,
                )
                for spec in specs
            ]
            for future in futures:
                future.result()
                advance()
        return True

    return play


def _fresh_key(log: AttemptLog, rollout_id: str) -> str | None:
    """The capture key to play ``rollout_id`` under, or None when an attempt already completed it.

    An attempt left open by an interrupted run is abandoned; the next key is ``…-aN``.
    """
    for attempt in range(100):
        key = rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"
        state = log.load(key)
        if state.opened is None:
            return key
        if state.selection is not None:
            return None
    raise RuntimeError(f"rollout {rollout_id} was abandoned 100 times")


def _next_batch(training: TrainingRun, external: bool, progress: StepProgress) -> PublishedBatch:
    """The next step's batch; an external run waits for agents to complete prompt groups."""
    while True:
        published = training.next_batch()
        if published is not None:
            return published
        if not external:
            raise RuntimeError(
                f"step {training.step}: the harness played every rollout, yet no complete "
                "prompt group reached the projector"
            )
        progress.waiting(training.step)
        time.sleep(POLL_INTERVAL_S)


def _root_counts(store: EventStore, published: PublishedBatch) -> dict[str, float]:
    """``roots/<reason>``: the step's root calls by the reason admission gave."""
    log = AttemptLog(store)
    counts: dict[str, float] = {}
    for rollout in published.rollouts:
        for call in log.load(rollout.capture_key).calls.values():
            if call.intended.decision == "root":
                name = f"roots/{call.intended.root_reason}"
                counts[name] = counts.get(name, 0.0) + 1.0
    return counts


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
