"""The main job: a recency-compaction agent learns a toy task with GRPO on the embedded defaults.

Everything runs in this process on the workspace: the gateway (HTTP on 127.0.0.1, a free port)
captures every model call of the agent (``examples/recency_agent.py``, on the official ``openai``
client) into the SQLite ledger and the local blob store; the projector turns settled, selected
attempts into forest rows; the trainer takes one GRPO step per batch of prompt groups on the same
model the engine samples from (on-policy), and checkpoints after each step.

A run has an id; its attempts' capture keys start with it and its batches go to its own training
stream, so runs can share a workdir. ``--resume`` continues the latest run from its last
checkpoint up to ``--steps``: generation is seeded per call and the trainer's state is restored
bitwise, so the resumed run reaches the state of a run that was never interrupted. Attempts of a
step that was interrupted mid-way are abandoned (they never settle, so they never train) and the
step's rollouts are played again under fresh capture keys with the same seeds.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from capture.embedded import EMBEDDED_MODEL_NAME, EmbeddedEngine, build_model, build_tokenizer
from examples.recency_agent import TASKS, AgentSettings, RecencyAgent
from grove.config import GroveConfig
from grove.jobs.serve import ServerThread, build_gateway
from grove.jobs.training_run import StepSummary, TrainingRun
from grove.workspace import Workspace
from ledger.attempt import AttemptLog
from ledger.store import EventStore
from storage import open_blob_store

__all__ = ["DEMO_CONFIG", "DemoSummary", "run_demo"]

DEMO_CONFIG: dict[str, Any] = {
    "seed": 0,
    "token_capture": {"enabled": True, "forest_training": True},
    "grpo": {"num_prompts_per_step": 2, "num_generations_per_prompt": 4},
    "policy": {
        "train_global_batch_size": 8,
        "train_micro_batch_size": 4,
        "logprob_micro_batch_size": 4,
        "learning_rate": 2e-2,
        "max_grad_norm": 1.0,
    },
}
RUN_FILE = "demo-run.json"


@dataclass(frozen=True)
class DemoSummary:
    """The demo's final line (``--json``)."""

    steps: int
    logical_rollouts: int
    rows: int
    max_tmpe: float
    max_gen_kl_error: float
    reward_first: float
    reward_last: float
    checkpoint: str | None
    run_id: str


def _run_id(workspace: Workspace, resume: bool) -> str:
    path = workspace.workdir / RUN_FILE
    if resume:
        if not path.exists():
            raise SystemExit(
                f"--resume: no demo run in {workspace.workdir} (no {RUN_FILE}); run without "
                "--resume to start one"
            )
        return json.loads(path.read_text())["run_id"]
    run_id = f"demo{uuid.uuid4().hex[:8]}"
    workspace.workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"run_id": run_id}))
    return run_id


def _step_table(rows: list[StepSummary]) -> Table:
    table = Table(title="GRPO steps")
    for column in ("step", "reward", "rollouts", "rows", "masked", "loss", "max TMPE", "gen KL"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            str(r.step),
            f"{r.reward:.3f}",
            str(r.logical_rollouts),
            str(r.rows),
            str(r.masked),
            f"{r.loss:+.2e}",
            f"{r.max_tmpe:.6f}",
            f"{r.gen_kl_error:.2e}",
        )
    return table


def run_demo(
    workspace: Workspace,
    *,
    steps: int = 10,
    resume: bool = False,
    console: Console | None = None,
) -> DemoSummary:
    """Run (or resume) the demo up to ``steps`` optimizer steps; returns its summary."""
    started = time.monotonic()
    config = GroveConfig.model_validate({**DEMO_CONFIG, "grpo": {**DEMO_CONFIG["grpo"]}})
    run_id = _run_id(workspace, resume)
    torch.manual_seed(config.seed)
    tokenizer = build_tokenizer()
    model = build_model(tokenizer, seed=config.seed)
    engine = EmbeddedEngine(model, stop_token_ids=[tokenizer.eos_token_id], seed=config.seed)
    app = build_gateway(workspace, engine=engine, tokenizer=tokenizer, settle_timeout_s=30)
    store = EventStore.open(workspace.database_url)
    run = TrainingRun(
        store,
        open_blob_store(workspace.blob_url),
        model,
        config,
        workspace.checkpoints / run_id,
        pad_token_id=tokenizer.pad_token_id,
        run_id=run_id,
    )
    if resume and run.resume() is not None and console is not None:
        console.print(f"resumed run {run_id} at step {run.step}")
    history: list[StepSummary] = []
    groups, per_group = config.grpo.num_prompts_per_step, config.grpo.num_generations_per_prompt
    try:
        with ServerThread(app) as server:
            agent = RecencyAgent(
                f"{server.base_url}/v1", model=EMBEDDED_MODEL_NAME, settings=AgentSettings()
            )
            with _progress(console) as progress:
                task = progress.add_task("rollouts", total=(steps - run.step) * groups * per_group)
                while run.step < steps:
                    _play_step(agent, AttemptLog(store), run_id, run.step, groups, per_group,
                               lambda: progress.advance(task))  # fmt: skip
                    published = run.next_batch()
                    if published is None:
                        raise RuntimeError(f"step {run.step}: no complete prompt groups to train")
                    summary = run.train(published)
                    history.append(summary)
                    if console is not None:
                        progress.console.print(_step_line(summary))
            agent.close()
    finally:
        store.close()
    if console is not None and history:
        console.print(_step_table(history))
        console.print(f"{len(history)} steps in {time.monotonic() - started:.0f} s")
    return _summarize(history, run_id, run)


def _play_step(
    agent: RecencyAgent,
    log: AttemptLog,
    run_id: str,
    step: int,
    groups: int,
    per_group: int,
    advance: Callable[[], None],
) -> None:
    """Play every rollout of ``step`` that the ledger does not already hold complete."""
    for g in range(groups):
        group = f"{run_id}-s{step}-g{g}"
        task = TASKS[(step * groups + g) % len(TASKS)]
        for r in range(per_group):
            rollout_id = f"{group}-r{r}"
            key = _fresh_key(log, rollout_id)
            if key is not None:
                seed_key = f"s{step}-g{g}-r{r}"  # the same in every run: runs are comparable
                agent.play(
                    key, rollout_id=rollout_id, group=group, index=r, task=task, seed_key=seed_key
                )
            advance()


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


def _step_line(s: StepSummary) -> str:
    return (
        f"step {s.step:>3}  reward {s.reward:.3f}  rollouts {s.logical_rollouts}  rows {s.rows}  "
        f"masked {s.masked}  loss {s.loss:+.2e}  max TMPE {s.max_tmpe:.6f}  "
        f"gen KL {s.gen_kl_error:.2e}" + ("  (rebuilt)" if s.rebuilt else "")
    )


class _Quiet:
    """A stand-in for ``rich.progress.Progress`` when nothing is shown."""

    console = Console(quiet=True)

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, *args: object, **kwargs: object) -> int:
        return 0

    def advance(self, task: int) -> None:
        return None


def _progress(console: Console | None) -> Progress | _Quiet:
    if console is None:
        return _Quiet()
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


def _summarize(history: list[StepSummary], run_id: str, run: TrainingRun) -> DemoSummary:
    rewards = run.step_rewards()
    first, last = rewards[:3], rewards[-3:]
    latest = [h.checkpoint for h in history if h.checkpoint]
    return DemoSummary(
        steps=run.step,
        logical_rollouts=sum(h.logical_rollouts for h in history),
        rows=sum(h.rows for h in history),
        max_tmpe=max((h.max_tmpe for h in history), default=1.0),
        max_gen_kl_error=max((h.gen_kl_error for h in history), default=0.0),
        reward_first=sum(first) / len(first) if first else 0.0,
        reward_last=sum(last) / len(last) if last else 0.0,
        checkpoint=latest[-1] if latest else None,
        run_id=run_id,
    )


def summary_json(summary: DemoSummary) -> str:
    """The final line of JSON."""
    return json.dumps(asdict(summary))
