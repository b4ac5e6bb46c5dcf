"""Row tensors: a forest's rows as torch tensors, with routed experts and media placed per row.

The forest (``grove.training.forest``) fixes each row's calls and token layout; this module adds
what the blob of each call carries besides tokens, given as plain data (``CallExtras``): the
projector reads and verifies blobs, this module never touches storage. When the projector also
passes each call's token tensors, rows are concatenated from them rather than converted from the
forest's Python lists (the same values, several times faster).

- Routed experts: a call's ``routes`` has one ``(layers, top_k)`` (or ``(top_k,)``) entry per
  delta token (its prompt delta, then its generated tokens), as the codec stores them. Within a
  path, a call's final generated token is run through the model again when its continuation is
  prefilled (the embedded engine runs it at once, ``docs/moe.md``), so its route is observed
  and the row keeps the route the call's blob stores there. Only a path's final token — a
  trace boundary: the endpoint's last token, whose route shapes no logprob of the row — gets
  ``ROUTE_MISSING_SENTINEL``, and the learner's router replay routes that token itself
  (``grove.training.route_replay``). A sentinel anywhere else in a row (a route the engine did not
  observe inside a segment) is a ``RowError`` that masks the rollout ``route_missing``: replay
  cannot reproduce the engine's function there. Every other token keeps its captured route.
- Media: every row carries the media of every call on its path, with its span moved to row
  coordinates, since each row is a separate attention context. A media item is ``owned`` by the
  first row that contains its call (the loss-ownership rule); a rewrite's new root stores its
  media in full, so the first row of a new root re-owns everything it shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, cast

import numpy
import torch

from grove.training.errors import RowError
from grove.training.forest import Forest, ForestRow, RowSegment

__all__ = [
    "ROUTE_MISSING_SENTINEL",
    "CallExtras",
    "MediaItem",
    "RowMedia",
    "RowTensors",
    "rollout_rows",
    "row_tensors",
]

ROUTE_MISSING_SENTINEL: Final = -1
"""Routed-expert id meaning "no observed route": the learner routes the token itself."""
_NUMPY: Final = {torch.int64: numpy.int64, torch.float32: numpy.float32}


@dataclass(frozen=True, eq=False)
class MediaItem:
    """One media occurrence in a call's new prompt tokens (producer: the projector, from the
    blob's media descriptor and pixels). ``[token_start, token_end)`` is a non-empty span of the
    call's prompt delta; ``frames`` is 1 for an image; ``pixels`` is the processor output."""

    media_id: str
    kind: str
    token_start: int
    token_end: int
    height: int
    width: int
    frames: int = 1
    pixels: torch.Tensor | None = None
    digest: str | None = None


@dataclass(frozen=True, eq=False)
class CallExtras:
    """What a call's blob carries, as tensors (producer: the projector, from the decoded delta).

    ``routes``: integer ``(P + G, layers, top_k)`` or ``(P + G, top_k)``, or None when no routes
    were captured. ``media``: the
    media of its new prompt tokens, spans ordered. ``prompt_tokens`` ``(P,)``,
    ``generated_tokens`` ``(G,)`` (integer) and ``logprobs`` ``(G,)`` (float) are optional and
    hold the same values as the call's ``CallRecord``: when every call of a row has them, the row
    is assembled from them instead of from the forest's Python lists, several times faster.
    """

    routes: torch.Tensor | None = None
    media: tuple[MediaItem, ...] = ()
    prompt_tokens: torch.Tensor | None = None
    generated_tokens: torch.Tensor | None = None
    logprobs: torch.Tensor | None = None


@dataclass(frozen=True, eq=False)
class RowMedia:
    """A media item placed in a row: ``[token_start, token_end)`` in row coordinates; ``owned``
    in the first row that contains ``call_id``."""

    call_id: str
    item: MediaItem
    token_start: int
    token_end: int
    owned: bool


@dataclass(frozen=True, eq=False)
class RowTensors:
    """One forest row as tensors (producer: ``rollout_rows``; consumer: ``grove.training.batch``).

    ``token_ids`` int64 ``(T,)``; ``loss_mask`` bool ``(T,)``, True on owned generated tokens;
    ``generation_logprobs`` float32 ``(T,)``, 0.0 where ``loss_mask`` is False; ``routes`` int32
    ``(T, layers, top_k)`` (``(T, top_k)`` when the calls stored no layer axis) or None;
    ``media`` in row order. ``call_ids`` runs root to endpoint.
    """

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    generation_logprobs: torch.Tensor
    routes: torch.Tensor | None
    media: tuple[RowMedia, ...]
    call_ids: tuple[str, ...]
    owned_call_ids: tuple[str, ...]

    @property
    def length(self) -> int:
        """Tokens in the row."""
        return int(self.token_ids.shape[0])


def rollout_rows(
    forest: Forest, extras: Mapping[str, CallExtras] | None = None
) -> list[RowTensors]:
    """The forest's rows as tensors, in row order (empty for a masked forest).

    ``extras`` maps call ids to their routes and media; calls without an entry have neither.
    Raises ``RowError`` when routes or media do not fit their call's tokens; the projector
    decides this before it records the rollout's finalization and masks it ``blob_invalid``.
    """
    extras = extras or {}
    return [row_tensors(row, extras) for row in forest.rows]


def row_tensors(row: ForestRow, extras: Mapping[str, CallExtras]) -> RowTensors:
    """One forest row as tensors, with its calls' routes and media placed (see the module)."""
    call_tensors = _call_tensors(row.segments, extras)
    if call_tensors is not None:
        token_ids, loss_mask, logprobs = _assembled(row.segments, call_tensors)
    else:
        token_ids = _tensor(row.token_ids, torch.int64)
        loss_mask = _tensor(row.loss_mask, torch.bool)
        logprobs = _tensor(row.logprobs, torch.float32)
    return RowTensors(
        token_ids=token_ids,
        loss_mask=loss_mask,
        generation_logprobs=logprobs,
        routes=_row_routes(row.segments, extras),
        media=tuple(placed for segment in row.segments for placed in _row_media(segment, extras)),
        call_ids=tuple(row.call_ids),
        owned_call_ids=tuple(row.owned_call_ids),
    )


_TokenTensors = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _call_tensors(
    segments: Sequence[RowSegment], extras: Mapping[str, CallExtras]
) -> list[_TokenTensors] | None:
    """Each call's (prompt, generated, logprobs) tensors, or None unless every call has them."""
    found = []
    for segment in segments:
        source = extras.get(segment.call_id)
        if source is None:
            return None
        prompt, generated, logprobs = source.prompt_tokens, source.generated_tokens, source.logprobs
        if prompt is None or generated is None or logprobs is None:
            return None
        found.append((prompt, generated, logprobs))
    return found


def _assembled(
    segments: Sequence[RowSegment], call_tensors: list[_TokenTensors]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, loss mask and logprobs of a row from its calls' token tensors, checked
    against the segments' lengths (the forest's lists are never read)."""
    token_pieces: list[torch.Tensor] = []
    logprob_pieces: list[torch.Tensor] = []
    mask_pieces: list[torch.Tensor] = []
    flags: dict[tuple[int, bool], torch.Tensor] = {}  # one mask piece per length and value
    zeros: dict[int, torch.Tensor] = {}  # one zero tensor per length: slicing costs more
    for segment, (prompt, generated, logprobs) in zip(segments, call_tensors, strict=True):
        expected = (segment.generated_start - segment.start, segment.end - segment.generated_start)
        got = (prompt.shape, generated.shape, logprobs.shape)
        if (
            got != ((expected[0],), (expected[1],), (expected[1],))
            or not _is_integer(prompt)
            or not _is_integer(generated)
            or not logprobs.dtype.is_floating_point
        ):
            raise RowError(
                "tokens_shape",
                segment.call_id,
                f"its token tensors are {prompt.dtype} {tuple(got[0])} prompt, {generated.dtype} "
                f"{tuple(got[1])} generated and {logprobs.dtype} {tuple(got[2])} logprobs; its "
                f"record has {expected[0]} prompt and {expected[1]} generated tokens",
            )
        token_pieces += [prompt, generated]
        for length in expected:
            if length not in zeros:
                zeros[length] = torch.zeros(length, dtype=torch.float32)
        logprob_pieces += [zeros[expected[0]], logprobs if segment.owned else zeros[expected[1]]]
        for length, value in ((expected[0], False), (expected[1], segment.owned)):
            if (length, value) not in flags:
                flags[length, value] = torch.full((length,), value, dtype=torch.bool)
            mask_pieces.append(flags[length, value])
    loss_mask = torch.cat(mask_pieces)
    token_ids = torch.cat(token_pieces).to(torch.int64)
    return token_ids, loss_mask, torch.cat(logprob_pieces).to(torch.float32)


def _tensor(values: list[int] | list[float], dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor of a Python list through numpy (several times faster than ``torch.tensor``
    on a list)."""
    if dtype == torch.bool:
        return (
            torch.frombuffer(bytearray(cast("list[int]", values)), dtype=torch.bool)  # 0/1
            if values
            else torch.empty(0, dtype=torch.bool)
        )
    return torch.from_numpy(numpy.fromiter(values, dtype=_NUMPY[dtype], count=len(values)))


def _row_routes(
    segments: Sequence[RowSegment], extras: Mapping[str, CallExtras]
) -> torch.Tensor | None:
    """Concatenated per-call routes, with the sentinel at the path's final token only."""
    routes = [extras[s.call_id].routes if s.call_id in extras else None for s in segments]
    if all(r is None for r in routes):
        return None
    top_k: tuple[int, ...] | None = None
    pieces = []
    for segment, call_routes in zip(segments, routes, strict=True):
        if call_routes is None:
            raise RowError(
                "routes_incomplete",
                segment.call_id,
                "other calls of its row carry routed experts but this call has none; a row is "
                "replayed with routes for every token or for none",
            )
        expected = segment.end - segment.start
        if (
            call_routes.ndim not in (2, 3)
            or call_routes.shape[0] != expected
            or not _is_integer(call_routes)
        ):
            raise RowError(
                "routes_shape",
                segment.call_id,
                f"routes must be an integer (delta tokens, [layers,] top_k) tensor: expected "
                f"({expected}, ..., top_k), got {call_routes.dtype} {tuple(call_routes.shape)}",
            )
        if top_k is None:
            top_k = tuple(call_routes.shape[1:])
        elif tuple(call_routes.shape[1:]) != top_k:
            raise RowError(
                "routes_shape",
                segment.call_id,
                f"{_route_shape(tuple(call_routes.shape[1:]))} differs from "
                f"{_route_shape(top_k, named=False)} of earlier calls in its row",
            )
        pieces.append(call_routes.to(torch.int32))
    row_routes = torch.cat(pieces)  # (T, [layers,] top_k)
    _check_no_missing_route(row_routes, segments)
    if row_routes.shape[0]:
        row_routes[-1] = ROUTE_MISSING_SENTINEL  # the trace boundary: never run, no route
    return row_routes


def _route_shape(shape: tuple[int, ...], *, named: bool = True) -> str:
    """``top_k 2``, or ``(layers, top_k) (3, 2)``: a route's shape as messages name it (without
    the name when ``named`` is False)."""
    value = str(shape[0]) if len(shape) == 1 else str(shape)
    name = "top_k" if len(shape) == 1 else "(layers, top_k)"
    return f"{name} {value}" if named else value


def _check_no_missing_route(row_routes: torch.Tensor, segments: Sequence[RowSegment]) -> None:
    """A ``RowError`` (``route_missing``) when a token before the row's final one has the
    sentinel in any layer: a route the engine did not observe inside a segment."""
    if row_routes.shape[0] < 2:
        return
    missing = (row_routes[:-1] == ROUTE_MISSING_SENTINEL).flatten(1).any(-1)  # (T - 1,)
    if not bool(missing.any()):
        return
    position = int(missing.nonzero()[0, 0])
    segment = next(s for s in segments if s.start <= position < s.end)
    raise RowError(
        "route_missing",
        segment.call_id,
        f"the route of its token {position - segment.start} (row position {position}) is "
        f"missing (ROUTE_MISSING_SENTINEL); only a row's final token may lack one, so the "
        "learner cannot replay the function the engine sampled from",
        mask_reason="route_missing",
    )


def _is_integer(tensor: torch.Tensor) -> bool:
    dtype = tensor.dtype
    return not (dtype.is_floating_point or dtype.is_complex or dtype == torch.bool)


def _row_media(segment: RowSegment, extras: Mapping[str, CallExtras]) -> list[RowMedia]:
    """The call's media moved to row coordinates, after checking spans against its prompt."""
    if segment.call_id not in extras:
        return []
    prompt_length = segment.generated_start - segment.start
    placed: list[RowMedia] = []
    previous_end = 0
    for item in extras[segment.call_id].media:
        if not (previous_end <= item.token_start < item.token_end <= prompt_length):
            raise RowError(
                "media_span",
                segment.call_id,
                f"media {item.media_id!r} spans [{item.token_start}, {item.token_end}); spans "
                f"must be non-empty, ordered, disjoint and inside the {prompt_length} new "
                f"prompt tokens (previous span ends at {previous_end})",
            )
        if item.height < 1 or item.width < 1 or item.frames < 1:
            raise RowError(
                "media_geometry",
                segment.call_id,
                f"media {item.media_id!r} has height {item.height}, width {item.width}, frames "
                f"{item.frames}; each must be at least 1",
            )
        previous_end = item.token_end
        placed.append(
            RowMedia(
                call_id=segment.call_id,
                item=item,
                token_start=segment.start + item.token_start,
                token_end=segment.start + item.token_end,
                owned=segment.owned,
            )
        )
    return placed
