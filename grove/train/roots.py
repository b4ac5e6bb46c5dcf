"""A training step's root calls: ``roots/<reason>`` and ``roots/unexplained`` (docs/metrics.md).

Every call of the step's attempts counts once, selected or not. A root is counted under the reason
its intent records. A root is *unexplained* when it is not its attempt's first call and its reason
is one of ``grove.ledger.admission.UNEXPLAINED_ROOT_REASONS`` (``template_not_append_compatible``,
``rendered_history_differs``): admission found the call it continues, and the template could not
extend that call's exact tokens, so nothing the harness did explains the new root. When more than
half of a step's calls are unexplained roots, the run warns: the template (or the client) makes
every turn re-render its whole context (``docs/normalization.md``, "Divergence diagnostics").

:func:`count_roots` is pure (folded attempt states in, counts out); :func:`root_metrics` reads
the step's attempts from the ledger.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from grove.ledger.admission import UNEXPLAINED_ROOT_REASONS
from grove.ledger.attempt import AttemptLog, AttemptState
from grove.ledger.store import EventStore
from grove.training.projector import PublishedBatch

__all__ = ["ROOTS_PREFIX", "UNEXPLAINED_ROOTS", "RootCounts", "count_roots", "root_metrics"]

ROOTS_PREFIX: Final = "roots/"
UNEXPLAINED_ROOTS: Final = "roots/unexplained"
_UNEXPLAINED: Final = frozenset(reason.value for reason in UNEXPLAINED_ROOT_REASONS)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RootCounts:
    """The root calls of a set of attempts.

    ``calls`` counts every intended call; ``by_reason`` the roots by recorded reason (reasons
    that did not occur are absent); ``unexplained`` the unexplained roots (module docstring).
    """

    calls: int
    by_reason: Mapping[str, int]
    unexplained: int

    def metrics(self) -> dict[str, float]:
        """``roots/<reason>`` for each reason that occurred, and ``roots/unexplained`` always."""
        counts = {f"{ROOTS_PREFIX}{reason}": float(n) for reason, n in self.by_reason.items()}
        return {**counts, UNEXPLAINED_ROOTS: float(self.unexplained)}

    def warning(self, step: int) -> str | None:
        """What to tell the user when more than half of the calls are unexplained roots."""
        if 2 * self.unexplained <= self.calls:
            return None
        return (
            f"step {step}: {self.unexplained} of its {self.calls} calls are unexplained roots "
            f"({', '.join(sorted(_UNEXPLAINED))}): the chat template cannot extend the parent "
            "call's exact tokens, so each such call re-renders its whole context; grove lineage "
            'shows where each one diverges and why (docs/normalization.md, "Divergence '
            'diagnostics"), and token_capture.strict refuses such calls'
        )


def count_roots(attempts: Iterable[AttemptState]) -> RootCounts:
    """Count the calls, the roots by reason and the unexplained roots of ``attempts``."""
    calls = unexplained = 0
    by_reason: dict[str, int] = {}
    for attempt in attempts:
        for position, call in enumerate(attempt.calls.values()):
            calls += 1
            intended = call.intended
            if intended.decision != "root":
                continue
            reason = str(intended.root_reason)
            by_reason[reason] = by_reason.get(reason, 0) + 1
            if position > 0 and reason in _UNEXPLAINED:
                unexplained += 1
    return RootCounts(calls, by_reason, unexplained)


def root_metrics(
    store: EventStore, published: PublishedBatch, warn: Callable[[str], None]
) -> dict[str, float]:
    """The step's root metrics, read from its attempts in the ledger; the warning, if one is due,
    goes to ``warn`` (the run's console) and to this module's logger."""
    log = AttemptLog(store)
    counts = count_roots(log.load(rollout.capture_key) for rollout in published.rollouts)
    message = counts.warning(published.step)
    if message is not None:
        logger.warning(message)
        warn(message)
    return counts.metrics()
