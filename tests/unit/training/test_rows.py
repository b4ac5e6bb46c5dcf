"""Row tensors: exact tokens, masks and logprobs; route sentinels; media re-ownership."""

from __future__ import annotations

import pytest
import torch

from grove.training.errors import RowError
from grove.training.forest import CallRecord, MaskReason, build_forest
from grove.training.rows import ROUTE_MISSING_SENTINEL, CallExtras, MediaItem, rollout_rows


def image(media_id: str, start: int, end: int) -> MediaItem:
    return MediaItem(media_id, "image", start, end, height=4, width=4, pixels=torch.ones(3, 4, 4))


def routes(*values: int) -> torch.Tensor:
    """``(len(values), 2)``: expert ``v`` and ``v + 1`` for each delta token."""
    return torch.tensor([[v, v + 1] for v in values], dtype=torch.int16)


def chain_with_rewrite() -> list[CallRecord]:
    """a -> b, then a rewrite root c (as with media: A, then A + B, then only B)."""
    return [
        CallRecord("a", None, [1, 2], [3], [-0.5]),
        CallRecord("b", "a", [4, 5], [6, 7], [-0.25, -0.75]),
        CallRecord("c", None, [8, 9, 10], [11], [-1.0]),
    ]


def test_rows_hold_exact_tokens_masks_and_logprobs() -> None:
    (first, second) = rollout_rows(build_forest(chain_with_rewrite(), ["a", "b", "c"]))

    assert first.token_ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert first.token_ids.dtype == torch.int64
    assert first.loss_mask.tolist() == [False, False, True, False, False, True, True]
    assert first.generation_logprobs.tolist() == [0.0, 0.0, -0.5, 0.0, 0.0, -0.25, -0.75]
    assert first.generation_logprobs.dtype == torch.float32
    assert first.call_ids == ("a", "b")
    assert first.owned_call_ids == ("a", "b")
    assert second.token_ids.tolist() == [8, 9, 10, 11]
    assert first.routes is None and first.media == ()


def test_masked_forest_has_no_rows() -> None:
    forest = build_forest(chain_with_rewrite(), ["b"])

    assert forest.masked_reason == MaskReason.SELECTION_NOT_CLOSED
    assert rollout_rows(forest) == []


def test_missing_route_sentinel_goes_only_at_a_paths_final_token() -> None:
    # a's final generated token (3) is prefilled again by its continuation b, so its captured
    # route stays; only each path's last token (b's 7, c's 11) was never run: the sentinel
    extras = {
        "a": CallExtras(routes=routes(10, 20, 30)),
        "b": CallExtras(routes=routes(40, 50, 60, 70)),
        "c": CallExtras(routes=routes(80, 90, 100, 110)),
    }

    first, second = rollout_rows(build_forest(chain_with_rewrite(), ["a", "b", "c"]), extras)

    s = ROUTE_MISSING_SENTINEL
    assert first.routes is not None and second.routes is not None
    assert first.routes.dtype == torch.int32
    assert first.routes.tolist() == [
        [10, 11],
        [20, 21],
        [30, 31],  # a's final generated token, inside the path: its captured route
        [40, 41],
        [50, 51],
        [60, 61],
        [s, s],  # the trace boundary
    ]
    # the new root keeps its own prefill routes; only its final token is unknown
    assert second.routes.tolist() == [[80, 81], [90, 91], [100, 101], [s, s]]


def test_missing_route_sentinel_on_branches_marks_each_paths_end_not_the_shared_ancestor() -> None:
    calls = [
        CallRecord("a", None, [1], [2], [-1.0]),
        CallRecord("b", "a", [3], [4], [-1.0]),
        CallRecord("c", "a", [5], [6], [-1.0]),
    ]
    extras = {name: CallExtras(routes=routes(i, i)) for i, name in enumerate("abc")}

    rows = rollout_rows(build_forest(calls, ["a", "b", "c"]), extras)

    assert [row.routes.tolist() for row in rows] == [  # type: ignore[union-attr]
        [[0, 1], [0, 1], [1, 2], [-1, -1]],
        [[0, 1], [0, 1], [2, 3], [-1, -1]],
    ]


def test_missing_route_sentinel_goes_at_a_paths_last_token_even_when_it_is_a_prompt_token() -> None:
    calls = [CallRecord("a", None, [1, 2], [3], [-1.0]), CallRecord("b", "a", [4], [], [])]
    extras = {"a": CallExtras(routes=routes(1, 2, 3)), "b": CallExtras(routes=routes(4))}

    (row,) = rollout_rows(build_forest(calls, ["a", "b"]), extras)

    assert row.routes is not None
    assert row.routes.tolist() == [[1, 2], [2, 3], [3, 4], [-1, -1]]


def test_routes_on_only_some_calls_of_a_row_raise() -> None:
    extras = {"a": CallExtras(routes=routes(1, 2, 3))}

    with pytest.raises(RowError, match=r"routes_incomplete.*'b'") as raised:
        rollout_rows(build_forest(chain_with_rewrite(), ["a", "b"]), extras)

    assert raised.value.call_id == "b"


@pytest.mark.parametrize(
    "bad",
    [
        torch.zeros(2, 2, dtype=torch.int32),  # one token short
        torch.zeros(3, dtype=torch.int32),  # not (tokens, top_k)
        torch.zeros(3, 2, dtype=torch.float32),  # not integer
        torch.zeros(3, 2, dtype=torch.bool),
    ],
)
def test_routes_of_the_wrong_shape_or_dtype_raise(bad: torch.Tensor) -> None:
    with pytest.raises(RowError, match=r"routes_shape.*'a'"):
        rollout_rows(build_forest(chain_with_rewrite(), ["a"]), {"a": CallExtras(routes=bad)})


def test_routes_with_changing_top_k_raise() -> None:
    extras = {
        "a": CallExtras(routes=routes(1, 2, 3)),
        "b": CallExtras(routes=torch.zeros(4, 3, dtype=torch.int32)),
    }

    with pytest.raises(RowError, match=r"routes_shape.*'b'.*top_k 3 differs from 2"):
        rollout_rows(build_forest(chain_with_rewrite(), ["a", "b"]), extras)


def test_media_is_placed_in_row_coordinates_and_re_owned_by_a_new_root() -> None:
    extras = {
        "a": CallExtras(media=(image("A", 0, 1),)),
        "b": CallExtras(media=(image("B", 1, 2),)),
        "c": CallExtras(media=(image("B", 0, 2),)),  # the rewrite root stores B in full again
    }

    first, second = rollout_rows(build_forest(chain_with_rewrite(), ["a", "b", "c"]), extras)

    assert [(m.item.media_id, m.token_start, m.token_end, m.owned) for m in first.media] == [
        ("A", 0, 1, True),
        ("B", 4, 5, True),
    ]
    assert [
        (m.item.media_id, m.call_id, m.token_start, m.token_end, m.owned) for m in second.media
    ] == [("B", "c", 0, 2, True)]


def test_media_of_a_shared_ancestor_is_carried_but_owned_once() -> None:
    calls = [
        CallRecord("a", None, [1, 2], [3], [-1.0]),
        CallRecord("b", "a", [4], [5], [-1.0]),
        CallRecord("c", "a", [6], [7], [-1.0]),
    ]
    extras = {"a": CallExtras(media=(image("A", 0, 2),))}

    rows = rollout_rows(build_forest(calls, ["a", "b", "c"]), extras)

    assert [[(m.item.media_id, m.owned) for m in row.media] for row in rows] == [
        [("A", True)],
        [("A", False)],
    ]
    assert rows[1].media[0].item.pixels is extras["a"].media[0].pixels


@pytest.mark.parametrize(
    "media",
    [
        (image("A", 0, 3),),  # past the 2 new prompt tokens of call a
        (image("A", 1, 1),),  # empty span
        (image("A", 1, 2), image("B", 0, 1)),  # out of order
        (image("A", 0, 2), image("B", 1, 2)),  # overlapping
    ],
)
def test_media_spans_outside_or_across_the_prompt_delta_raise(media: tuple[MediaItem, ...]) -> None:
    with pytest.raises(RowError, match=r"media_span.*'a'"):
        rollout_rows(build_forest(chain_with_rewrite(), ["a"]), {"a": CallExtras(media=media)})


def test_media_with_empty_geometry_raises() -> None:
    flat = MediaItem("A", "image", 0, 1, height=0, width=4)

    with pytest.raises(RowError, match=r"media_geometry.*'a'.*height 0"):
        rollout_rows(build_forest(chain_with_rewrite(), ["a"]), {"a": CallExtras(media=(flat,))})


def with_token_tensors(calls: list[CallRecord]) -> dict[str, CallExtras]:
    """Each call's delta as the blob decodes it: int32 tokens, float32 logprobs."""
    return {
        call.call_id: CallExtras(
            prompt_tokens=torch.tensor(call.prompt_tokens, dtype=torch.int32),
            generated_tokens=torch.tensor(call.generated_tokens, dtype=torch.int32),
            logprobs=torch.tensor(call.logprobs, dtype=torch.float32),
        )
        for call in calls
    }


def branching_calls() -> list[CallRecord]:
    return [
        CallRecord("a", None, [1, 2], [3, 4], [-0.5, -1.5]),
        CallRecord("b", "a", [5], [6], [-0.25]),
        CallRecord("c", "a", [], [7, 8], [-2.0, -3.0]),
        CallRecord("d", None, [9], [10], [-4.0]),
    ]


def test_rows_from_call_tensors_equal_rows_from_lists() -> None:
    calls = branching_calls()
    forest = build_forest(calls, ["a", "b", "c", "d"])

    from_lists = rollout_rows(forest)
    from_tensors = rollout_rows(forest, with_token_tensors(calls))

    assert len(from_tensors) == len(from_lists) == 3
    for got, expected in zip(from_tensors, from_lists, strict=True):
        for field in ("token_ids", "loss_mask", "generation_logprobs"):
            got_tensor, expected_tensor = getattr(got, field), getattr(expected, field)
            assert got_tensor.dtype == expected_tensor.dtype
            assert torch.equal(got_tensor, expected_tensor)
    assert from_tensors[1].generation_logprobs.tolist() == [0.0, 0.0, 0.0, 0.0, -2.0, -3.0]


def test_rows_fall_back_to_lists_when_a_call_lacks_tensors() -> None:
    calls = branching_calls()
    extras = with_token_tensors(calls)
    extras["b"] = CallExtras()
    forest = build_forest(calls, ["a", "b", "c", "d"])

    rows = rollout_rows(forest, extras)

    assert rows[0].token_ids.tolist() == [1, 2, 3, 4, 5, 6]
    assert rows[0].generation_logprobs.tolist() == [0.0, 0.0, -0.5, -1.5, 0.0, -0.25]


def test_call_tensors_that_disagree_with_the_record_raise() -> None:
    calls = branching_calls()
    extras = with_token_tensors(calls)
    extras["b"] = CallExtras(
        prompt_tokens=torch.tensor([5], dtype=torch.int32),
        generated_tokens=torch.tensor([6, 6], dtype=torch.int32),
        logprobs=torch.tensor([-0.25, -0.25]),
    )

    with pytest.raises(RowError, match=r"tokens_shape.*'b'.*\(2,\) generated.*1 generated token"):
        rollout_rows(build_forest(calls, ["a", "b"]), extras)


def test_call_tensors_of_a_float_token_dtype_raise() -> None:
    calls = branching_calls()
    extras = with_token_tensors(calls)
    extras["a"] = CallExtras(
        prompt_tokens=torch.tensor([1.0, 2.0]),
        generated_tokens=torch.tensor([3, 4]),
        logprobs=torch.tensor([-0.5, -1.5]),
    )

    with pytest.raises(RowError, match=r"tokens_shape.*'a'.*torch.float32 \(2,\) prompt"):
        rollout_rows(build_forest(calls, ["a"]), extras)
