"""The training side's errors, one tree.

::

    TrainingError
    ├── ForestError             a forest rule violated (strict mode) or malformed call records
    ├── SelectionError          selection evidence missing, contradictory, duplicated or
    │                           ambiguous, or a policy result that breaks the policy contract
    ├── SelectionPolicyError    a selection policy name that cannot be resolved
    ├── RowError                per-call routes or media that do not fit the forest's calls
    ├── RouteReplayError        (``route_replay.py``) routes that cannot be replayed on the model
    ├── BatchError              rows that cannot be laid out as one training batch
    ├── AdvantageError          advantage inputs or settings outside their rules
    └── CheckpointError         (``checkpoint.py``) a checkpoint that cannot be written or resumed:
                                CheckpointExists, CheckpointFileMissing, CheckpointDigestMismatch,
                                CheckpointSchemaError, CheckpointIncompatible

The errors defined here are also ``ValueError``: each one reports bad input, and nothing was
trained or written. Each message states the rule, then the identifiers and got-versus-expected
values, which are also kept as attributes (``rule`` always; the call, policy or rollout it names
where there is one).
"""

from __future__ import annotations

from grove_errors import GroveError

__all__ = [
    "AdvantageError",
    "BatchError",
    "ForestError",
    "RouteReplayError",
    "RowError",
    "SelectionError",
    "SelectionPolicyError",
    "TrainingError",
]


class TrainingError(GroveError):
    """Root of every error the training side raises, a branch of Grove's one tree
    (``GroveError``); ``rule`` names the rule that was broken."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = str(rule)
        super().__init__(message)


class ForestError(TrainingError, ValueError):
    """A forest rule violated by ``call_id`` (None when the rule concerns no single call)."""

    def __init__(self, rule: str, call_id: str | None, detail: str) -> None:
        self.call_id = call_id
        self.detail = detail
        where = f"call {call_id!r}" if call_id is not None else "the selection"
        super().__init__(rule, f"Forest rule {str(rule)!r} violated by {where}: {detail}")


class SelectionError(TrainingError, ValueError):
    """Selection evidence that cannot identify the accepted calls, or a broken policy result."""

    def __init__(
        self,
        rule: str,
        detail: str,
        *,
        call_id: str | None = None,
        response_id: str | None = None,
        item_index: int | None = None,
    ) -> None:
        self.call_id = call_id
        self.response_id = response_id
        self.item_index = item_index
        self.detail = detail
        super().__init__(rule, f"Selection rule {str(rule)!r} violated: {detail}")


class SelectionPolicyError(TrainingError, ValueError):
    """A selection policy ``spec`` that names no usable policy; raised while validating config."""

    def __init__(self, spec: str, rule: str, detail: str) -> None:
        self.spec = spec
        self.detail = detail
        super().__init__(rule, f"Selection policy {spec!r} cannot be resolved ({rule!s}): {detail}")


class RowError(TrainingError, ValueError):
    """Routes or media of ``call_id`` that do not fit its tokens; the projector masks the rollout
    with ``mask_reason`` (a ``grove.training.forest.MaskReason``: ``blob_invalid`` unless given,
    e.g. ``route_missing``)."""

    def __init__(
        self, rule: str, call_id: str, detail: str, *, mask_reason: str = "blob_invalid"
    ) -> None:
        self.call_id = call_id
        self.detail = detail
        self.mask_reason = mask_reason
        super().__init__(rule, f"Row rule {str(rule)!r} violated by call {call_id!r}: {detail}")


class RouteReplayError(TrainingError, ValueError):
    """Captured routes that the learner cannot replay on its model: missing, of another shape
    than the model's MoE layers and ``top_k``, or naming experts it does not have."""

    def __init__(self, rule: str, detail: str) -> None:
        self.detail = detail
        super().__init__(rule, f"Route replay rule {str(rule)!r} violated: {detail}")


class BatchError(TrainingError, ValueError):
    """Rows that cannot be laid out as one batch (bad row multiple, empty group, ...)."""

    def __init__(self, rule: str, detail: str) -> None:
        self.detail = detail
        super().__init__(rule, f"Batch rule {str(rule)!r} violated: {detail}")


class AdvantageError(TrainingError, ValueError):
    """Advantage settings or inputs outside their rules."""

    def __init__(self, rule: str, detail: str) -> None:
        self.detail = detail
        super().__init__(rule, f"Advantage rule {str(rule)!r} violated: {detail}")
