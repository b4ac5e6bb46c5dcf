"""The engine a training run samples from, and how each optimizer step's weights reach it.

``open_policy_engine`` gives the gateway its engine for the run's model. After every optimizer
step the run calls ``publish(step)``: the next rollouts must sample the new weights. The embedded
engine samples in the training process from the trainer's own parameters, so the weights are
already there and publishing only advances the policy version.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from capture.embedded import EmbeddedEngine
from capture.engine import Engine
from grove.config import GroveConfig
from grove.jobs.models import LoadedModel

__all__ = ["EmbeddedPolicy", "PolicyEngine", "open_policy_engine"]


class PolicyEngine(Protocol):
    """An engine serving the run's policy: ``engine`` for the gateway, ``policy_version`` the
    optimizer steps its weights include, ``context_length`` its longest sequence."""

    engine: Engine
    policy_version: int

    @property
    def context_length(self) -> int:
        """Prompt and generation together, at most."""
        ...

    def publish(self, step: int) -> None:
        """Serve the weights of optimizer step ``step`` before the next rollout starts."""
        ...

    def updating(self) -> AbstractContextManager[None]:
        """A block in which the trainer changes its weights and publishes them: no generation
        samples from weights that are changing (an engine that samples the trainer's own
        parameters holds generations off for the whole block)."""
        ...

    def close(self) -> None:
        """Release what the engine holds (processes, connections)."""
        ...


class EmbeddedPolicy:
    """In-process sampling on the trainer's own parameters (``capture/embedded.py``)."""

    def __init__(self, loaded: LoadedModel, *, seed: int, policy_version: int = 0) -> None:
        tokenizer = loaded.tokenizer
        self.engine = EmbeddedEngine(
            loaded.model,
            stop_token_ids=[tokenizer.eos_token_id],
            seed=seed,
            policy_version=policy_version,
        )
        self.policy_version = policy_version
        self._context = int(loaded.model.config.max_position_embeddings)

    @property
    def context_length(self) -> int:
        """The model's position embeddings."""
        return self._context

    def publish(self, step: int) -> None:
        """The engine already samples the trainer's parameters: only the version advances,
        between generations, so each generation reports the version of its weights."""
        with self.engine.updating():
            self.engine.policy_version = step
            self.policy_version = step

    @contextmanager
    def updating(self) -> Iterator[None]:
        """The engine's own: no generation runs while the trainer changes the parameters."""
        with self.engine.updating():
            yield

    def close(self) -> None:
        """Nothing to release."""


def open_policy_engine(config: GroveConfig, loaded: LoadedModel, *, step: int) -> PolicyEngine:
    """The engine of the run's configuration, serving the weights of optimizer step ``step``."""
    return EmbeddedPolicy(loaded, seed=config.seed, policy_version=step)
