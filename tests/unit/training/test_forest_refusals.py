"""What ``build_forest`` and ``CallRecord`` say when they refuse, in full: the rule, the call it
names and the detail (``training/forest.py``)."""

from __future__ import annotations

import math

import pytest
import torch

from grove.training.errors import ForestError
from grove.training.forest import CallRecord, MaskReason, build_forest
from tests.unit.training.test_forest import MASK_CASES, MaskCase, ids, tree

RECORD = {
    "call_id": "a",
    "parent_id": None,
    "prompt_tokens": [1],
    "generated_tokens": [2],
    "logprobs": [-0.1],
}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"call_id": ""},
            "Forest rule 'invalid_call_id' violated by the selection: call_id must be a "
            "non-empty string, got ''",
        ),
        (
            {"call_id": 7},
            "Forest rule 'invalid_call_id' violated by the selection: call_id must be a "
            "non-empty string, got 7",
        ),
        (
            {"parent_id": ""},
            "Forest rule 'invalid_call_id' violated by call 'a': parent_id must be None or a "
            "non-empty string, got ''",
        ),
        (
            {"parent_id": 3},
            "Forest rule 'invalid_call_id' violated by call 'a': parent_id must be None or a "
            "non-empty string, got 3",
        ),
        (
            {"status": "done"},
            "Forest rule 'unknown_status' violated by call 'a': status must be one of "
            "committed, failed, pending, got 'done'",
        ),
        (
            {"logprobs": [-0.1, -0.2]},
            "Forest rule 'logprobs_length' violated by call 'a': one logprob per generated "
            "token: got 2 logprobs for 1 generated tokens",
        ),
        (
            {
                "generated_tokens": [2, 3, 4, 5, 6],
                "logprobs": [math.nan, -0.1, math.inf, math.nan, math.inf],
            },
            "Forest rule 'nan_logprob' violated by call 'a': generation logprobs must not be NaN "
            "or +inf, got [nan, inf, nan]",
        ),
    ],
    ids=[
        "empty_id",
        "id_not_str",
        "empty_parent",
        "parent_not_str",
        "status",
        "length",
        "first_three_of_four_bad_values",
    ],
)
def test_a_malformed_record_is_refused_naming_the_call_and_what_is_wrong(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ForestError) as raised:
        CallRecord(**{**RECORD, **fields})  # type: ignore[arg-type]

    assert str(raised.value) == message


def test_a_record_with_minus_infinity_logprobs_is_accepted() -> None:
    record = CallRecord(**{**RECORD, "logprobs": [-math.inf]})  # type: ignore[arg-type]

    assert list(record.logprobs) == [-math.inf]


def test_array_fields_that_are_not_one_dimensional_are_refused_naming_the_call() -> None:
    with pytest.raises(ForestError) as raised:
        CallRecord.from_arrays("a", None, torch.ones(2, 2), torch.ones(1), torch.zeros(1))

    assert (raised.value.rule, raised.value.call_id) == ("invalid_input", "a")
    assert str(raised.value).startswith("Forest rule 'invalid_input' violated by call 'a': ")


def test_an_array_record_keeps_its_status_and_finish_reason() -> None:
    record = CallRecord.from_arrays(
        "a", "p", torch.tensor([1]), torch.tensor([2]), torch.tensor([-0.5]), "failed", "length"
    )

    assert (record.call_id, record.parent_id, record.status, record.finish_reason) == (
        "a",
        "p",
        "failed",
        "length",
    )
    assert (list(record.prompt_tokens), list(record.generated_tokens)) == ([1], [2])
    assert list(record.logprobs) == [-0.5]


DETAILS = {
    MaskReason.EMPTY_SELECTION: "violated by the selection: no call is selected",
    MaskReason.SELECTED_CALL_MISSING: (
        "violated by call 'ghost': selected, but no call record exists"
    ),
    MaskReason.SELECTED_CALL_PENDING: (
        "violated by call 'c1': selected, but its status is 'pending', not 'committed'"
    ),
    MaskReason.SELECTED_CALL_FAILED: (
        "violated by call 'c0': selected, but its status is 'failed', not 'committed'"
    ),
    MaskReason.SELECTION_NOT_CLOSED: (
        "violated by call 'c2': selected continuation whose parent 'c1' is not selected"
    ),
    MaskReason.TERMINAL_NOT_SELECTED: (
        "violated by call 'c1': the scored terminal is not among the 1 selected calls"
    ),
}


@pytest.mark.parametrize(
    "case", [MaskCase(*case) for case in MASK_CASES], ids=lambda case: case.reason.value
)
def test_strict_mode_says_which_rule_broke_where_and_why(case: MaskCase) -> None:
    with pytest.raises(ForestError) as raised:
        build_forest(case.calls, case.selected, case.terminal, strict=True)

    assert str(raised.value) == f"Forest rule '{case.reason.value}' {DETAILS[case.reason]}"


def test_a_selection_given_as_one_string_is_refused_quoting_it() -> None:
    with pytest.raises(ForestError) as raised:
        build_forest(tree([None]), "c0")

    assert str(raised.value) == (
        "Forest rule 'invalid_input' violated by the selection: selected is a sequence of call "
        "ids, got 'c0'"
    )


def test_a_call_that_is_not_a_record_is_refused_naming_its_type() -> None:
    with pytest.raises(ForestError) as raised:
        build_forest([{"call_id": "c0"}], ["c0"])  # type: ignore[list-item]

    assert str(raised.value) == (
        "Forest rule 'invalid_input' violated by the selection: calls must be CallRecords, got dict"
    )


def test_two_records_of_one_call_are_refused_naming_it() -> None:
    with pytest.raises(ForestError) as raised:
        build_forest([*tree([None]), *tree([None])], ["c0"])

    assert str(raised.value) == (
        "Forest rule 'duplicate_call_id' violated by call 'c0': two call records share this call_id"
    )


def test_a_parent_cycle_is_refused_drawing_the_cycle() -> None:
    calls = [
        CallRecord("r", None, [1], [2], [-0.1]),
        CallRecord("a", "b", [3], [4], [-0.1]),
        CallRecord("b", "a", [5], [6], [-0.1]),
    ]

    with pytest.raises(ForestError) as raised:
        build_forest(calls, ["r", "a", "b"])

    assert str(raised.value) == (
        "Forest rule 'parent_cycle' violated by call 'a': its parent chain returns to itself "
        "(a -> b -> a)"
    )


def test_a_root_without_prompt_is_refused_saying_what_a_root_stores() -> None:
    with pytest.raises(ForestError) as raised:
        build_forest([CallRecord("a", None, [], [2], [-0.1])], ["a"])

    assert str(raised.value) == (
        "Forest rule 'empty_root_prompt' violated by call 'a': a root must store its full, "
        "non-empty prompt"
    )


def test_a_selected_chain_stays_one_row_however_the_selection_is_ordered() -> None:
    forest = build_forest(tree([None, 0, 1]), ["c2", "c0", "c1"])

    assert forest.endpoints == ["c2"]
    assert [row.call_ids for row in forest.rows] == [ids(3)]
