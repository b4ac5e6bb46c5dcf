"""Records over tensors (``CallRecord.from_arrays``) build the same forest and rows as lists."""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch

from grove.training.errors import ForestError
from grove.training.forest import CallRecord, ForestRow, RecordRule, build_forest
from grove.training.rows import CallExtras, rollout_rows

CALLS = {
    # call id: (parent, prompt tokens, generated tokens, logprobs)
    "a": (None, [1, 2, 3], [4, 5], [-0.5, -0.25]),
    "b": ("a", [6], [7, 8, 9], [-1.0, -0.125, -2.0]),
    "c": ("a", [10, 11], [12], [-3.0]),
}


def _list_records() -> list[CallRecord]:
    return [CallRecord(c, p, pt, gt, lp) for c, (p, pt, gt, lp) in CALLS.items()]


def _array_records() -> list[CallRecord]:
    return [
        CallRecord.from_arrays(
            c,
            p,
            torch.tensor(pt, dtype=torch.int32),
            torch.tensor(gt, dtype=torch.int32),
            torch.tensor(lp, dtype=torch.float32),
        )
        for c, (p, pt, gt, lp) in CALLS.items()
    ]


def _extras() -> dict[str, CallExtras]:
    return {
        c: CallExtras(
            prompt_tokens=torch.tensor(pt, dtype=torch.int32),
            generated_tokens=torch.tensor(gt, dtype=torch.int32),
            logprobs=torch.tensor(lp, dtype=torch.float32),
        )
        for c, (_, pt, gt, lp) in CALLS.items()
    }


def test_forest_of_array_records_equals_forest_of_list_records() -> None:
    from_lists = build_forest(_list_records(), ["a", "b", "c"], terminal="c")
    from_arrays = build_forest(_array_records(), ["a", "b", "c"], terminal="c")
    assert from_arrays == from_lists
    assert from_arrays.rows[1].token_ids == [1, 2, 3, 4, 5, 10, 11, 12]
    assert from_arrays.rows[1].loss_mask == [0, 0, 0, 0, 0, 0, 0, 1]
    assert from_arrays.rows[1].logprobs == [0.0] * 7 + [-3.0]


def test_array_record_fields_read_as_lists() -> None:
    record = _array_records()[1]
    assert record.prompt_tokens == [6]
    assert list(record.generated_tokens) == [7, 8, 9]
    assert record.logprobs[2] == -2.0
    assert len(record.logprobs) == 3


def test_row_length_is_known_before_its_lists_are_built() -> None:
    row = build_forest(_array_records(), ["a", "b"]).rows[0]
    assert row.length == 9
    assert row.token_ids == [1, 2, 3, 4, 5, 6, 7, 8, 9]


def test_row_tensors_from_call_tensors_equal_row_tensors_from_lists() -> None:
    forest = build_forest(_array_records(), ["a", "b", "c"])
    from_tensors = rollout_rows(forest, _extras())
    from_lists = rollout_rows(build_forest(_list_records(), ["a", "b", "c"]))
    for got, expected in zip(from_tensors, from_lists, strict=True):
        assert torch.equal(got.token_ids, expected.token_ids)
        assert torch.equal(got.loss_mask, expected.loss_mask)
        assert torch.equal(got.generation_logprobs, expected.generation_logprobs)
    assert from_tensors[1].loss_mask.tolist() == [False] * 7 + [True]


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_array_record_with_nan_or_positive_inf_logprob_raises(bad: float) -> None:
    with pytest.raises(ForestError) as caught:
        CallRecord.from_arrays(
            "a", None, torch.tensor([1]), torch.tensor([2, 3]), torch.tensor([-1.0, bad])
        )
    assert caught.value.rule == RecordRule.NAN_LOGPROB


def test_array_record_whose_float32_sum_overflows_is_accepted() -> None:
    big = torch.tensor([3e38, 3e38], dtype=torch.float32)  # float32 sum is +inf, values finite
    record = CallRecord.from_arrays("a", None, torch.tensor([1]), torch.tensor([2, 3]), big)
    assert record.logprobs == big.tolist()


def test_array_record_with_one_logprob_too_few_raises() -> None:
    with pytest.raises(ForestError) as caught:
        CallRecord.from_arrays(
            "a", None, torch.tensor([1]), torch.tensor([2, 3]), torch.tensor([-1.0])
        )
    assert caught.value.rule == RecordRule.LOGPROBS_LENGTH


def test_forest_row_is_frozen_and_pickles() -> None:
    row = build_forest(_array_records(), ["a"]).rows[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.call_ids = ["x"]  # type: ignore[misc]
    assert pickle.loads(pickle.dumps(row)) == row
    assert row == ForestRow(
        [1, 2, 3, 4, 5], [0, 0, 0, 1, 1], [0.0] * 3 + [-0.5, -0.25], ["a"], ["a"], row.segments
    )
