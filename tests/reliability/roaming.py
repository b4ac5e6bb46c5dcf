"""A harness with no gateway stickiness: each of its requests goes to a gateway drawn at random.

``RoamingHarness`` plays the rollouts of ``harness.Harness`` (the same seeded agent, so the same
attempt plays the same calls whichever gateways serve it), but every request it sends — opening
the attempt, each model call, each rejection, the result — is sent to one of ``Gateways`` drawn by
its own routing generator. ``served`` lists, in order, the gateway of each model call, so a test
can tell which continuations reached a gateway that had not served their parent.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

import httpx
import openai

from .harness import Harness

__all__ = ["Gateways", "RoamingHarness"]


@dataclass(frozen=True)
class Gateways:
    """One ``openai`` client and one ``httpx`` client per gateway (both thread-safe)."""

    models: tuple[openai.OpenAI, ...]
    attempts: tuple[httpx.Client, ...]

    @classmethod
    def connect(cls, base_urls: Sequence[str]) -> Gateways:
        """Clients of the gateways at ``base_urls``."""
        return cls(
            tuple(
                openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
                for url in base_urls
            ),
            tuple(httpx.Client(base_url=f"{url}/v1", timeout=120) for url in base_urls),
        )

    def close(self) -> None:
        """Close every client."""
        for model in self.models:
            model.close()
        for http in self.attempts:
            http.close()


class RoamingHarness(Harness):
    """``Harness`` whose every request goes to a gateway of ``gateways`` drawn at random (from a
    generator of its own, so the agent's draws do not depend on the routing)."""

    def __init__(self, gateways: Gateways, *, seed: int, route_seed: int) -> None:
        self.gateways = gateways
        self.route = random.Random(route_seed)
        self.served: list[int] = []  # the gateway of each model call, in order
        super().__init__("unused", seed=seed)

    def connect(self, base_url: str) -> None:
        """Nothing to connect: the clients are ``gateways``'."""

    @property
    def client(self) -> openai.OpenAI:  # type: ignore[override]
        """The ``openai`` client of a gateway drawn for this model call."""
        drawn = self.route.randrange(len(self.gateways.models))
        self.served.append(drawn)
        return self.gateways.models[drawn]

    @property
    def http(self) -> httpx.Client:  # type: ignore[override]
        """The ``httpx`` client of a gateway drawn for this request."""
        return self.gateways.attempts[self.route.randrange(len(self.gateways.attempts))]

    def close(self) -> None:
        """Nothing to close: ``gateways`` owns the clients."""
