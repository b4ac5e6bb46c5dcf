"""Routes with a layer axis, ``(delta tokens, layers, top_k)``, from the blob to the batch; a
route missing inside a row masks its rollout ``route_missing``."""

from __future__ import annotations

import pytest
import torch

from grove.storage import CallDelta, decode_delta, encode_delta
from grove.training.batch import LogicalRollout, assemble_batch
from grove.training.errors import RowError
from grove.training.forest import CallRecord, MaskReason, build_forest
from grove.training.rows import ROUTE_MISSING_SENTINEL, CallExtras, rollout_rows

S = ROUTE_MISSING_SENTINEL


def layered(*values: int) -> torch.Tensor:
    """``(len(values), 2, 2)``: layer 0 routes token ``v`` to experts ``v, v + 1``, layer 1 to
    ``v + 2, v + 3``."""
    return torch.tensor([[[v, v + 1], [v + 2, v + 3]] for v in values], dtype=torch.int16)


def chain() -> list[CallRecord]:
    """a (prompt [1, 2], generates [3]) -> b (observation [4], generates [5, 6])."""
    return [
        CallRecord("a", None, [1, 2], [3], [-0.5]),
        CallRecord("b", "a", [4], [5, 6], [-0.25, -0.75]),
    ]


def test_layered_routes_round_trip_through_the_codec_exactly() -> None:
    delta = CallDelta.from_lists([1, 2], [3], [-0.5], routes=layered(0, 10, 20))
    decoded = decode_delta(encode_delta(delta))
    assert decoded == delta
    assert decoded.routes is not None and tuple(decoded.routes.shape) == (3, 2, 2)


def test_layered_routes_keep_every_layer_and_the_sentinel_only_at_the_rows_end() -> None:
    extras = {
        "a": CallExtras(routes=layered(0, 10, 20)),
        "b": CallExtras(routes=layered(30, 40, 50)),
    }
    (row,) = rollout_rows(build_forest(chain(), ["a", "b"]), extras)
    assert row.routes is not None and row.routes.dtype == torch.int32
    assert row.routes.tolist() == [
        *layered(0, 10, 20, 30, 40).tolist(),
        [[S, S], [S, S]],  # b's final token: the trace boundary
    ]


def test_a_route_missing_inside_a_row_raises_a_row_error_that_masks_route_missing() -> None:
    a_routes = layered(0, 10, 20)
    a_routes[2, 1] = S  # a's final generated token, layer 1: never observed
    extras = {"a": CallExtras(routes=a_routes), "b": CallExtras(routes=layered(30, 40, 50))}
    with pytest.raises(RowError, match=r"route_missing.*'a'.*its token 2 \(row position 2\)") as e:
        rollout_rows(build_forest(chain(), ["a", "b"]), extras)
    assert e.value.mask_reason == MaskReason.ROUTE_MISSING == "route_missing"


def test_a_missing_route_at_the_rows_final_token_is_the_boundary_and_allowed() -> None:
    b_routes = layered(30, 40, 50)
    b_routes[2] = S  # b's final token, as an engine that never ran it reports it
    extras = {"a": CallExtras(routes=layered(0, 10, 20)), "b": CallExtras(routes=b_routes)}
    (row,) = rollout_rows(build_forest(chain(), ["a", "b"]), extras)
    assert row.routes is not None and row.routes[-1].tolist() == [[S, S], [S, S]]


def test_calls_with_another_layer_count_in_one_row_raise() -> None:
    extras = {
        "a": CallExtras(routes=layered(0, 10, 20)),
        "b": CallExtras(routes=layered(30, 40, 50)[:, :1]),
    }
    with pytest.raises(RowError, match=r"\(layers, top_k\) \(1, 2\) differs from \(2, 2\)"):
        rollout_rows(build_forest(chain(), ["a", "b"]), extras)


def test_layered_routes_are_padded_with_the_sentinel_in_the_batch() -> None:
    extras = {
        "a": CallExtras(routes=layered(0, 10, 20)),
        "b": CallExtras(routes=layered(30, 40, 50)),
    }
    rows = tuple(rollout_rows(build_forest(chain(), ["a", "b"]), extras))
    short = tuple(rollout_rows(build_forest(chain()[:1], ["a"]), {"a": extras["a"]}))
    batch = assemble_batch(
        [LogicalRollout("r0", "g0", rows), LogicalRollout("r1", "g0", short)], row_multiple=3
    )
    assert batch.routes is not None and tuple(batch.routes.shape) == (3, 6, 2, 2)
    assert batch.routes[1, 3:].tolist() == [[[S, S], [S, S]]] * 3  # right padding
    assert batch.routes[2].tolist() == [[[S, S], [S, S]]] * 6  # an execution padding row
    assert tuple(batch.packed().routes.shape) == (10, 2, 2)  # type: ignore[union-attr]
