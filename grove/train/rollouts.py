"""Playing a step's rollouts through an in-process harness (``harness.target: module:function``).

Step ``s`` plays the tasks ``grove.train.tasks.step_tasks`` gives it, ``grpo.num_generations_per_
prompt`` rollouts each, ``harness.concurrency`` at a time. Rollout ``r`` of group ``g`` is the
attempt ``{run}-s{s}-g{g}-r{r}``, seeded with ``rollout_seed(seed, s, g, r)``. A rollout whose
attempt already has a selection (a resumed run: its result was posted, or Grove abandoned it) is
not played again; an attempt an interrupted run left open is abandoned and the rollout is played
under the next key, ``…-a1``.

A rollout that fails — its harness raises, returns no finite reward, or its result is refused —
or whose harness has not returned its result ``async_rl.rollout_failure.rollout_timeout_s`` after
its attempt opened (the harness starts then), is abandoned (``grove.train.abandonment``): its
prompt group is dropped (``harness_failed``, ``rollout_timeout``), the run goes on. A timed-out
harness is not waited for: its thread is left to unwind (its calls are refused once admissions
close) and whatever it returns is never posted. Errors that are not the harness's (the ledger,
the gateway refusing or failing a request: ``grove.client.GroveClientError``, a ``GroveError``
whose exit status says whether to retry) and ``KeyboardInterrupt`` stop the run.

Replacement ``k`` of step ``s`` (``async_rl.rollout_failure.max_replacement_groups``) is group
``g = N + k``, where ``N`` is ``grpo.num_prompts_per_step``: the attempt ``{run}-s{s}-g{N+k}-r{r}``,
seeded with ``rollout_seed(seed, s, N + k, r)``, playing task ``replacement_task(...)`` — a draw
from the whole task file seeded by ``data.shuffle_seed``, ``s`` and ``k`` alone, so a resumed run
plays the same replacements whatever was dropped.

The K fork groups of step ``s`` (``grpo.forks``, ``grove.train.fork_groups``) take the places of
its last K task groups, whose tasks are not played. Fork group ``j`` is the attempts
``{run}-s{s}-f{j}-r{r}``, seeded with
``rollout_seed(seed, s, -(j + 1), r)``, each opened as a fork of the picked call and playing that
call's task with the conversation to continue in ``task["fork"]``.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from grove.client import GroveClient
from grove.config import GroveConfig
from grove.errors import JobError
from grove.ledger.attempt import AttemptLog
from grove.ledger.store import EventStore
from grove.train.abandonment import abandon_attempt
from grove.train.fork_groups import ForkPick, SourceRollout, fork_candidates, pick_forks
from grove.train.harness import (
    Harness,
    HarnessError,
    RolloutSpec,
    attempt_tokens,
    open_rollout,
    post_result,
    rollout_seed,
    run_harness,
)
from grove.train.tasks import step_tasks, task_order
from grove.training.groups import DropReason

__all__ = ["RolloutFailure", "StepPlayer", "fresh_key", "replacement_task"]

MAX_ABANDONED = 100
WAKE_S = 1.0  # the longest the scheduler sleeps between looks (so an interrupt is seen)


def fresh_key(log: AttemptLog, rollout_id: str) -> str | None:
    """The capture key to play ``rollout_id`` under, or None when an attempt already completed
    it: its result was selected, or Grove abandoned it (``…-aN`` after N abandoned attempts)."""
    for attempt in range(MAX_ABANDONED):
        key = rollout_id if attempt == 0 else f"{rollout_id}-a{attempt}"
        state = log.load(key)
        if state.opened is None:
            return key
        if state.selection is not None:
            return None
    raise JobError(
        f"rollout {rollout_id} was abandoned {MAX_ABANDONED} times (its attempts {rollout_id}, "
        f"{rollout_id}-a1, ...): Grove plays no further attempt of it"
    )


def replacement_task(tasks: int, *, seed: int, step: int, index: int) -> int:
    """The task (an index into the task file of ``tasks`` tasks) that replacement ``index`` of
    step ``step`` plays: the same in every run with the same ``data.shuffle_seed``."""
    digest = hashlib.sha256(f"grove-replacement/{seed}/{step}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % tasks


@dataclass(frozen=True)
class RolloutFailure:
    """A rollout Grove abandoned: why (``rollout_timeout`` or ``harness_failed``) and what
    happened, naming the rollout."""

    rollout_id: str
    prompt_group: str
    reason: DropReason
    detail: str


_PLAYING, _POSTING, _FAILED, _ABANDONED = "playing", "posting", "failed", "abandoned"


@dataclass(eq=False)
class _Slot:
    """One rollout in play: the handshake between its thread and the scheduler. It leaves
    ``playing`` once: to ``posting`` (the harness returned; its thread posts the result) or
    ``failed`` (the harness failed), both claimed by the thread, or to ``abandoned``, claimed by
    the scheduler when the deadline passes first. So a result is posted in time, or never."""

    spec: RolloutSpec
    deadline: float = float("inf")  # set by the thread once the attempt is open
    state: str = _PLAYING
    lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, new: str) -> bool:
        """Move from ``playing`` to ``new``; False when the other side got there first."""
        with self.lock:
            if self.state != _PLAYING:
                return False
            self.state = new
            return True


_Done = tuple[_Slot, str | None, BaseException | None]  # the slot, a failure, an error


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
        attempt_secret: str,
    ) -> None:
        self.config = config
        self.harness = harness
        self.tasks = tasks
        self.run_id = run_id
        self.log = AttemptLog(store)
        self.base_url = base_url
        self.token_for = attempt_tokens(attempt_secret)  # the same tokens after a resume
        data = config.data
        self.order = task_order(
            len(tasks), shuffle=data.shuffle, seed=data.shuffle_seed, epochs=data.epochs
        )
        self.failures: dict[str, RolloutFailure] = {}  # the first of each group of this step

    @property
    def groups_per_step(self) -> int:
        """``grpo.num_prompts_per_step``: replacements are numbered after the step's groups."""
        return self.config.grpo.num_prompts_per_step

    def group_id(self, step: int, group: int) -> str:
        """Group ``group`` of step ``step``."""
        return f"{self.run_id}-s{step}-g{group}"

    def specs(self, step: int, group: int, task: int) -> list[RolloutSpec]:
        """The rollouts of group ``group`` of ``step`` (playing ``task``) still to play."""
        config = self.config
        group_id = self.group_id(step, group)
        specs = []
        for r in range(config.grpo.num_generations_per_prompt):
            rollout_id = f"{group_id}-r{r}"
            key = fresh_key(self.log, rollout_id)
            if key is not None:
                seed = rollout_seed(config.seed, step, group, r)
                specs.append(
                    RolloutSpec(key, rollout_id, group_id, r, self.tasks[task], seed, step)
                )
        return specs

    def fork_group_id(self, step: int, fork: int) -> str:
        """Fork group ``fork`` of step ``step``."""
        return f"{self.run_id}-s{step}-f{fork}"

    def play(
        self, step: int, advance: Callable[[], None], sources: Sequence[SourceRollout] = ()
    ) -> list[str] | None:
        """Play ``step``'s groups, calling ``advance`` as each rollout ends: task groups, and
        fork groups of turns of ``sources`` (the previous step's batch) when ``grpo.forks`` asks;
        their ids, or None when the task file is used up (nothing played)."""
        tasks = step_tasks(self.order, step, self.groups_per_step)
        if tasks is None:
            return None
        self.failures = {}
        picks = self.fork_picks(step, sources)
        groups = list(enumerate(tasks[: len(tasks) - len(picks)]))
        specs = [spec for group, task in groups for spec in self.specs(step, group, task)]
        for fork, pick in enumerate(picks):
            specs += self.fork_specs(step, fork, pick)
        self._play_all(specs, len(tasks) * self.config.grpo.num_generations_per_prompt, advance)
        return [self.group_id(step, g) for g, _ in groups] + [
            self.fork_group_id(step, j) for j in range(len(picks))
        ]

    def fork_picks(self, step: int, sources: Sequence[SourceRollout]) -> list[ForkPick]:
        """The calls ``step`` forks (``grove.train.fork_groups``): none at step 0 or without
        ``grpo.forks.per_step``; only turns of task groups are candidates."""
        forks = self.config.grpo.forks
        if not forks.per_step or step == 0:
            return []
        from_tasks = [s for s in sources if self.task_of(s.group_id) is not None]
        candidates = fork_candidates(from_tasks, forks.pick)
        return pick_forks(candidates, count=forks.per_step, seed=self.config.seed, step=step)

    def fork_specs(self, step: int, fork: int, pick: ForkPick) -> list[RolloutSpec]:
        """The rollouts of fork group ``fork`` of ``step`` (forking ``pick``) still to play."""
        config = self.config
        group_id = self.fork_group_id(step, fork)
        task = self.task_of(pick.group_id)
        assert task is not None  # fork_picks keeps task groups only
        specs = []
        for r in range(config.grpo.num_generations_per_prompt):
            rollout_id = f"{group_id}-r{r}"
            key = fresh_key(self.log, rollout_id)
            if key is not None:
                seed = rollout_seed(config.seed, step, -(fork + 1), r)
                source = (pick.capture_key, pick.call_id)
                spec = RolloutSpec(
                    key, rollout_id, group_id, r, self.tasks[task], seed, step, fork_from=source
                )
                specs.append(spec)
        return specs

    def task_of(self, group_id: str) -> int | None:
        """The task (index into the task file) task group ``group_id`` of this run plays; None
        for a fork group or a group of another run."""
        step, sep, group = group_id.removeprefix(f"{self.run_id}-s").partition("-g")
        if not group_id.startswith(f"{self.run_id}-s") or not sep:
            return None
        if not (step.isdigit() and group.isdigit()):
            return None
        s, g = int(step), int(group)
        if g >= self.groups_per_step:
            data = self.config.data
            index = g - self.groups_per_step
            return replacement_task(len(self.tasks), seed=data.shuffle_seed, step=s, index=index)
        tasks = step_tasks(self.order, s, self.groups_per_step)
        return None if tasks is None else tasks[g]

    def forks_in(self, step: int, groups: Sequence[str]) -> list[str]:
        """The fork groups of ``step`` among ``groups``."""
        prefix = f"{self.run_id}-s{step}-f"
        return [g for g in groups if g.startswith(prefix) and g.removeprefix(prefix).isdigit()]

    def play_replacements(
        self, step: int, first: int, count: int, advance: Callable[[], None]
    ) -> list[str]:
        """Play replacements ``first`` to ``first + count - 1`` of ``step``; their group ids."""
        data = self.config.data
        groups = [
            (
                self.groups_per_step + k,
                replacement_task(len(self.tasks), seed=data.shuffle_seed, step=step, index=k),
            )
            for k in range(first, first + count)
        ]
        self._play_groups(step, groups, advance)
        return [self.group_id(step, g) for g, _ in groups]

    def replacements_in(self, step: int, groups: Sequence[str]) -> int:
        """How many of ``groups`` are replacement groups of ``step``."""
        prefix = f"{self.run_id}-s{step}-g"
        numbers = [g.removeprefix(prefix) for g in groups if g.startswith(prefix)]
        return sum(1 for n in numbers if n.isdigit() and int(n) >= self.groups_per_step)

    def _play_groups(
        self, step: int, groups: Sequence[tuple[int, int]], advance: Callable[[], None]
    ) -> None:
        rollouts = len(groups) * self.config.grpo.num_generations_per_prompt
        specs = [spec for group, task in groups for spec in self.specs(step, group, task)]
        self._play_all(specs, rollouts, advance)

    def _play_all(
        self, specs: Sequence[RolloutSpec], rollouts: int, advance: Callable[[], None]
    ) -> None:
        """Play ``specs``, the rollouts of ``rollouts`` not completed before a resume."""
        for _ in range(rollouts - len(specs)):
            advance()  # completed before a resume
        for failure in self._play_specs(specs, advance):
            self.failures.setdefault(failure.prompt_group, failure)

    def _play_specs(
        self, specs: Sequence[RolloutSpec], advance: Callable[[], None]
    ) -> list[RolloutFailure]:
        """Play ``specs``, ``harness.concurrency`` at a time; the rollouts abandoned."""
        config = self.config
        timeout = config.async_rl.rollout_failure.rollout_timeout_s
        waiting = deque(specs)
        running: set[_Slot] = set()
        done: queue.Queue[_Done] = queue.Queue()
        failures: list[RolloutFailure] = []
        api_key = config.engine.auth_token or "grove"
        with GroveClient(self.base_url, api_key=api_key, token_for=self.token_for) as grove:
            while waiting or running:
                while waiting and len(running) < config.harness.concurrency:
                    spec = waiting.popleft()
                    slot = _Slot(spec)
                    running.add(slot)
                    threading.Thread(
                        target=self._play_one,
                        args=(grove, slot, timeout, done),
                        name=f"rollout {spec.rollout_id}",
                        daemon=True,  # a hung harness never keeps the process alive
                    ).start()
                failures += self._next_ended(running, done, advance)
        return failures

    def _next_ended(
        self, running: set[_Slot], done: queue.Queue[_Done], advance: Callable[[], None]
    ) -> list[RolloutFailure]:
        """Wait for the next rollout to end or run out of time; the rollouts abandoned."""
        wait = min(WAKE_S, max(0.0, min(s.deadline for s in running) - time.monotonic()))
        failures = []
        try:
            slot, failure, error = done.get(timeout=wait)
        except queue.Empty:
            pass
        else:
            if slot in running:  # else the scheduler abandoned it already
                running.discard(slot)
                if error is not None:
                    raise error
                if failure is not None:
                    failures += self._abandon(slot.spec, DropReason.HARNESS_FAILED, failure)
                advance()
        now = time.monotonic()
        for slot in [s for s in running if s.deadline <= now]:
            if not slot.claim(_ABANDONED):
                slot.deadline = float("inf")  # it returned in time: its thread reports
                continue
            running.discard(slot)
            timeout = self.config.async_rl.rollout_failure.rollout_timeout_s
            detail = (
                f"rollout {slot.spec.rollout_id}: the harness did not return its result within "
                f"{timeout:g} s (async_rl.rollout_failure.rollout_timeout_s)"
            )
            failures += self._abandon(slot.spec, DropReason.ROLLOUT_TIMEOUT, detail)
            advance()
        return failures

    def _abandon(self, spec: RolloutSpec, reason: DropReason, detail: str) -> list[RolloutFailure]:
        """Abandon the rollout's attempt (``grove.train.abandonment``); nothing when its result
        was recorded after all (a post that failed on the way back)."""
        if not abandon_attempt(self.log, spec.capture_key, reason):
            return []
        return [RolloutFailure(spec.rollout_id, spec.prompt_group, reason, detail)]

    def _play_one(
        self, grove: GroveClient, slot: _Slot, timeout: float | None, done: queue.Queue[_Done]
    ) -> None:
        """A rollout's thread: open the attempt, run the harness (its ``timeout`` counts from
        here), post its result in time."""
        spec = slot.spec
        config = self.config
        try:
            attempt = open_rollout(
                grove,
                spec,
                forest_mode=config.token_capture.forest_training,
                selection_policy=config.token_capture.selection_policy,
            )
            if timeout is not None:
                slot.deadline = time.monotonic() + timeout
            result = run_harness(attempt, self.harness, spec, config.harness.options)
            if slot.claim(_POSTING):
                post_result(attempt, spec, result)
        except HarnessError as error:
            ours = slot.state == _POSTING or slot.claim(_FAILED)
            done.put((slot, str(error) if ours else None, None))
        except BaseException as error:  # not the harness's failure: the run stops
            done.put((slot, None, error))
        else:
            done.put((slot, None, None))
