"""Playing a step's rollouts through an in-process harness (``harness.target: module:function``).

Step ``s`` plays the tasks ``grove.jobs.tasks.step_tasks`` gives it, ``grpo.num_generations_per_
prompt`` rollouts each, ``harness.concurrency`` at a time. Rollout ``r`` of group ``g`` is the
attempt ``{run}-s{s}-g{g}-r{r}``, seeded with ``rollout_seed(seed, s, g, r)``. A rollout whose
attempt already posted its result (a resumed run) is not played again; an attempt an interrupted
run left open is abandoned and the rollout is played under the next key, ``…-a1``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from grove.client import GroveClient
from grove.config import GroveConfig
from grove.jobs.harness import Harness, RolloutSpec, play_rollout, rollout_seed
from grove.jobs.tasks import step_tasks, task_order
from ledger.attempt import AttemptLog
from ledger.store import EventStore

__all__ = ["StepPlayer", "fresh_key"]

MAX_ABANDONED = 100


def fresh_key(log: AttemptLog, rollout_id: str) -> str | None:
    """The capture key to play ``rollout_id`` under, or None when an attempt already completed
    it (``…-aN`` after N abandoned attempts)."""
    for attempt in range(MAX_ABANDONED):
        key = rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"
        state = log.load(key)
        if state.opened is None:
            return key
        if state.selection is not None:
            return None
    raise RuntimeError(f"rollout {rollout_id} was abandoned {MAX_ABANDONED} times")


class StepPlayer:
    """Plays the rollouts of one step at a time against the gateway at ``base_url``."""

    def __init__(
        self,
        config: GroveConfig,
        harness: Harness,
        tasks: list[dict],
        *,
        run_id: str,
        store: EventStore,
        base_url: str,
    ) -> None:
        self.config = config
        self.harness = harness
        self.tasks = tasks
        self.run_id = run_id
        self.log = AttemptLog(store)
        self.base_url = base_url
        data = config.data
        self.order = task_order(
            len(tasks), shuffle=data.shuffle, seed=data.shuffle_seed, epochs=data.epochs
        )

    def specs(self, step: int) -> list[RolloutSpec] | None:
        """The rollouts of ``step`` still to play; None once the task file is used up."""
        config = self.config
        tasks = step_tasks(self.order, step, config.grpo.num_prompts_per_step)
        if tasks is None:
            return None
        specs = []
        for g, task in enumerate(tasks):
            group = f"{self.run_id}-s{step}-g{g}"
            for r in range(config.grpo.num_generations_per_prompt):
                rollout_id = f"{group}-r{r}"
                key = fresh_key(self.log, rollout_id)
                if key is not None:
                    seed = rollout_seed(config.seed, step, g, r)
                    task_record = self.tasks[task]
                    specs.append(RolloutSpec(key, rollout_id, group, r, task_record, seed, step))
        return specs

    def play(self, step: int, advance: Callable[[], None]) -> bool:
        """Play ``step``'s rollouts, calling ``advance`` as each ends; False when the task file
        is used up (nothing played)."""
        specs = self.specs(step)
        if specs is None:
            return False
        config = self.config
        for _ in range(self._rollouts_per_step() - len(specs)):
            advance()  # completed before a resume
        token = config.engine.auth_token or "grove"
        with GroveClient(self.base_url, api_key=token) as grove, ThreadPoolExecutor(
            config.harness.concurrency
        ) as pool:  # fmt: skip
            futures = [
                pool.submit(
                    play_rollout,
                    grove,
                    self.harness,
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

    def groups_of(self, step: int, groups: Sequence[str]) -> list[str]:
        """Those of ``groups`` that belong to ``step``."""
        prefix = f"{self.run_id}-s{step}-g"
        return [g for g in groups if g.startswith(prefix)]

    def _rollouts_per_step(self) -> int:
        grpo = self.config.grpo
        return grpo.num_prompts_per_step * grpo.num_generations_per_prompt
