"""``grove train`` with ``harness.target: external``, run in a thread, and an agent for it.

``ExternalRun`` runs the main job's own function, ``run_training``, on the embedded model with
one prompt group of two rollouts per step, in a background thread of the test process, its
gateway on a free port. The test is the agent: ``rollout`` plays one rollout through
``grove.client`` — open the attempt ``{group}-r{index}``, one chat call of up to 4 tokens, post
the result (reward ``index``) — and ``wait_for_steps`` waits until the run has logged that many
steps (the engine then serves the weights of that many optimizer steps).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from grove.client import Attempt, GroveClient
from grove.config import load_config
from grove.train.job import TrainSummary, run_training
from grove.workspace import Workspace
from tests.unit.config.runs import merged

RUN_ID = "ext"
WAIT_S = 120.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ExternalRun:
    """An external run of ``steps`` steps in ``directory`` with ``overrides``, as a context."""

    def __init__(self, directory: Path, *overrides: Mapping[str, Any], steps: int) -> None:
        self.port = _free_port()
        data: dict[str, Any] = {
            "harness": {"target": "external"},
            "engine": {"port": self.port},
            "token_capture": {"forest_training": True, "pending_call_timeout_s": 10},
            "grpo": {"num_prompts_per_step": 1, "num_generations_per_prompt": 2},
            "policy": {"train_global_batch_size": 2, "train_micro_batch_size": 2},
            "logging": {"tensorboard": False},
        }
        for override in overrides:
            data = merged(data, override)
        self.workspace = Workspace.resolve(directory / "work")
        self.steps = steps
        self.config = load_config(data)
        self.summary: TrainSummary | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._train, name="external run", daemon=True)
        self.grove = GroveClient(f"http://127.0.0.1:{self.port}/v1")

    def _train(self) -> None:
        try:
            self.summary = run_training(
                self.config, self.workspace, steps=self.steps, run_id=RUN_ID
            )
        except BaseException as error:  # handed to the test by finish()
            self.error = error

    def __enter__(self) -> ExternalRun:
        self.thread.start()
        deadline = time.monotonic() + WAIT_S
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    break
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError(f"the run's gateway did not start: {self.error!r}")
            time.sleep(0.1)
        self.model = self.grove.model()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.grove.close()

    def open(self, group: str, index: int) -> Attempt:
        """Open the attempt ``{group}-r{index}``."""
        key = f"{group}-r{index}"
        return self.grove.open_attempt(key, rollout_id=key, prompt_group=group, rollout_index=index)

    def call(self, attempt: Attempt) -> dict[str, Any]:
        """One chat call of ``attempt``; the answer as a returned-history message."""
        with attempt.openai() as llm:
            completion = llm.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": "Hi."}], max_tokens=4
            )
        message = completion.choices[0].message
        return {"role": "assistant", "content": message.content or "", "response_id": completion.id}

    def rollout(self, group: str, index: int) -> None:
        """Play rollout ``index`` of ``group``: open, one call, post the result."""
        attempt = self.open(group, index)
        answer = self.call(attempt)
        output = [{"role": "user", "content": "Hi."}, answer]
        attempt.post_result({"output": output, "reward": float(index)})

    def metrics(self) -> list[dict[str, float]]:
        """Each logged step's metrics."""
        path = self.workspace.workdir / "runs" / RUN_ID / "metrics.jsonl"
        lines = path.read_text().splitlines() if path.exists() else []
        return [json.loads(line)["metrics"] for line in lines]

    def wait_for_steps(self, steps: int) -> None:
        """Wait until the run has logged ``steps`` steps."""
        deadline = time.monotonic() + WAIT_S
        while len(self.metrics()) < steps:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise AssertionError(f"the run did not reach step {steps}: {self.error!r}")
            time.sleep(0.1)

    def finish(self) -> TrainSummary:
        """Wait for the run to end; its summary (its error, raised)."""
        self.thread.join(WAIT_S)
        if self.error is not None:
            raise self.error
        assert self.summary is not None, "the run did not end"
        return self.summary
