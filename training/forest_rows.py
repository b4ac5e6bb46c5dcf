"""Forest rows: one root-to-endpoint path's tokens, loss mask and logprobs, built on first read.

``build_forest`` (``training/forest.py``) decides each row's calls and segments; the row's three
token lists are concatenations of its calls' deltas, which for a projected rollout are decoded
blob tensors (``CallRecord.from_arrays``). ``row_of_path`` therefore keeps the path and builds
the lists only when one of them is first read: the projector's row tensors need only
``length`` and ``segments`` (``training/rows.py``), so most rows are never turned into Python
lists at all. Once built, a row holds its lists and drops the path.

A row is frozen (assignment raises), compares, hashes and pickles by its fields, like the
dataclass it stands for; a lazily built row equals the row built eagerly from the same lists.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, NamedTuple

from grove.training.array_values import as_list

if TYPE_CHECKING:
    from grove.training.forest import CallRecord

__all__ = ["ForestRow", "RowSegment", "row_of_path"]


class RowSegment(NamedTuple):
    """Where one call's delta lies in a row: ``[start, generated_start)`` are its prompt (or
    observation) tokens, ``[generated_start, end)`` its generated tokens; ``owned`` when this row
    trains that generated span."""

    call_id: str
    start: int
    generated_start: int
    end: int
    owned: bool


class ForestRow:
    """One path (physical row) from a root to an endpoint (producer: ``build_forest``; consumer:
    ``grove.training.rows``, metrics, the projector's ``rollout.finalized`` event).

    ``token_ids``, ``loss_mask`` (0/1) and ``logprobs`` have equal lengths. ``logprobs`` holds the
    generation logprob where ``loss_mask`` is 1 and 0.0 elsewhere (prompts, observations, rewritten
    inputs, and generated spans owned by an earlier row). ``call_ids`` runs root to endpoint;
    ``owned_call_ids`` is the subsequence whose generated spans this row owns; ``segments`` has one
    entry per call in ``call_ids``, in order, tiling the row. A row from ``build_forest`` builds
    its three token lists on first read of any of them (``length`` and ``segments`` need none).
    """

    __slots__ = (
        "_logprobs",
        "_loss_mask",
        "_path",
        "_token_ids",
        "call_ids",
        "owned_call_ids",
        "segments",
    )
    _token_ids: list[int]
    _loss_mask: list[int]
    _logprobs: list[float]
    _path: list[CallRecord] | None  # None once built (or for a row given its lists)
    call_ids: list[str]
    owned_call_ids: list[str]
    segments: list[RowSegment]

    def __init__(
        self,
        token_ids: list[int],
        loss_mask: list[int],
        logprobs: list[float],
        call_ids: list[str],
        owned_call_ids: list[str],
        segments: list[RowSegment],
    ) -> None:
        for name, value in (
            ("_token_ids", token_ids),
            ("_loss_mask", loss_mask),
            ("_logprobs", logprobs),
            ("_path", None),
            ("call_ids", call_ids),
            ("owned_call_ids", owned_call_ids),
            ("segments", segments),
        ):
            object.__setattr__(self, name, value)

    @property
    def token_ids(self) -> list[int]:
        """Token ids, root to endpoint."""
        self._build()
        return self._token_ids

    @property
    def loss_mask(self) -> list[int]:
        """1 on the generated tokens this row owns, 0 elsewhere."""
        self._build()
        return self._loss_mask

    @property
    def logprobs(self) -> list[float]:
        """The generation logprob where ``loss_mask`` is 1, 0.0 elsewhere."""
        self._build()
        return self._logprobs

    @property
    def length(self) -> int:
        """Tokens in the row (without building its lists)."""
        return self.segments[-1].end if self.segments else len(self.token_ids)

    def _build(self) -> None:
        path = self._path
        if path is None:
            return
        token_ids: list[int] = []
        for call in path:
            token_ids += as_list(call.prompt_tokens)
            token_ids += as_list(call.generated_tokens)
        loss_mask = [0] * len(token_ids)
        logprobs = [0.0] * len(token_ids)
        for call, segment in zip(path, self.segments, strict=True):
            if segment.owned:
                loss_mask[segment.generated_start : segment.end] = [1] * (
                    segment.end - segment.generated_start
                )
                logprobs[segment.generated_start : segment.end] = as_list(call.logprobs)
        object.__setattr__(self, "_token_ids", token_ids)
        object.__setattr__(self, "_loss_mask", loss_mask)
        object.__setattr__(self, "_logprobs", logprobs)
        object.__setattr__(self, "_path", None)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _fields(self) -> tuple[object, ...]:
        return (
            self.token_ids,
            self.loss_mask,
            self.logprobs,
            self.call_ids,
            self.owned_call_ids,
            self.segments,
        )

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        token_ids, loss_mask, logprobs, call_ids, owned, segments = self._fields()
        return (
            f"ForestRow(token_ids={token_ids!r}, loss_mask={loss_mask!r}, logprobs={logprobs!r}, "
            f"call_ids={call_ids!r}, owned_call_ids={owned!r}, segments={segments!r})"
        )

    def __reduce__(self) -> tuple[object, ...]:
        return (ForestRow, self._fields())


def row_of_path(
    path: list[CallRecord], owned_call_ids: list[str], segments: list[RowSegment]
) -> ForestRow:
    """The row of ``path`` (root first), whose token lists are built from it on first read;
    ``segments`` has one entry per call of ``path``, tiling the row."""
    row = ForestRow([], [], [], [call.call_id for call in path], owned_call_ids, segments)
    object.__setattr__(row, "_path", path)
    return row
