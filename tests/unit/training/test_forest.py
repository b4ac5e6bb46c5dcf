"""build_forest: the documented shapes, ownership, every mask reason and every record rule."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest

from grove.training.errors import ForestError, TrainingError
from grove.training.forest import (
    MASK_REASONS,
    CallRecord,
    MaskReason,
    RecordRule,
    build_forest,
)


def tree(parents: list[int | None], **overrides: dict[str, object]) -> list[CallRecord]:
    """Call ``i`` has parent ``parents[i]``, prompt ``[100 + i]``, generation ``[200 + i]``."""
    calls = []
    for index, parent in enumerate(parents):
        fields: dict[str, object] = {
            "call_id": f"c{index}",
            "parent_id": None if parent is None else f"c{parent}",
            "prompt_tokens": [100 + index],
            "generated_tokens": [200 + index],
            "logprobs": [-(index + 1) / 10],
        }
        fields.update(overrides.get(f"c{index}", {}))
        calls.append(CallRecord(**fields))
    return calls


def ids(count: int) -> list[str]:
    return [f"c{i}" for i in range(count)]


# --- the documented shapes (docs/forest.md) ---------------------------------------------------


def test_twenty_chained_calls_give_one_row_owning_every_generation() -> None:
    forest = build_forest(tree([None, *range(19)]), ids(20))

    assert forest.masked_reason is None
    assert forest.endpoints == ["c19"]
    (row,) = forest.rows
    assert row.call_ids == ids(20)
    assert row.owned_call_ids == ids(20)
    assert row.token_ids == [t for i in range(20) for t in (100 + i, 200 + i)]
    assert row.loss_mask == [0, 1] * 20


def test_rewrite_at_call_ten_gives_two_rows() -> None:
    parents: list[int | None] = [None, *range(19)]
    parents[10] = None  # call 10 is a new root: the harness rewrote its context
    forest = build_forest(tree(parents), ids(20))

    assert forest.endpoints == ["c9", "c19"]
    assert [row.call_ids for row in forest.rows] == [ids(10), ids(20)[10:]]
    assert forest.rows[1].token_ids[:2] == [110, 210]


def test_two_children_of_one_parent_give_two_rows_and_train_the_parent_once() -> None:
    forest = build_forest(tree([None, 0, 0]), ids(3))

    assert [row.call_ids for row in forest.rows] == [["c0", "c1"], ["c0", "c2"]]
    assert [row.owned_call_ids for row in forest.rows] == [["c0", "c1"], ["c2"]]
    assert forest.rows[0].loss_mask == [0, 1, 0, 1]
    assert forest.rows[1].loss_mask == [0, 0, 0, 1]
    assert forest.rows[1].token_ids == [100, 200, 102, 202]


def test_branching_tree_of_six_gives_three_rows() -> None:
    forest = build_forest(tree([None, 0, 0, 1, 1, 2]), ids(6))

    assert forest.endpoints == ["c3", "c4", "c5"]
    assert [row.call_ids for row in forest.rows] == [
        ["c0", "c1", "c3"],
        ["c0", "c1", "c4"],
        ["c0", "c2", "c5"],
    ]
    assert [row.owned_call_ids for row in forest.rows] == [["c0", "c1", "c3"], ["c4"], ["c2", "c5"]]


# --- ordering, ownership, logprobs ---------------------------------------------------------------


def test_selection_order_sets_row_order_and_ownership() -> None:
    forest = build_forest(tree([None, 0, 0]), ["c0", "c2", "c1"])

    assert forest.endpoints == ["c2", "c1"]
    assert [row.owned_call_ids for row in forest.rows] == [["c0", "c2"], ["c1"]]


def test_selected_call_whose_children_are_all_left_out_is_an_endpoint() -> None:
    forest = build_forest(tree([None, 0, 1, 1]), ["c0", "c1"])

    assert forest.endpoints == ["c1"]
    assert forest.rows[0].call_ids == ["c0", "c1"]


def test_unselected_calls_never_appear_in_rows() -> None:
    forest = build_forest(tree([None, 0, 0]), ["c0", "c2"])

    assert [row.call_ids for row in forest.rows] == [["c0", "c2"]]
    assert 201 not in forest.rows[0].token_ids


def test_logprobs_are_generation_logprobs_on_owned_tokens_and_zero_elsewhere() -> None:
    forest = build_forest(tree([None, 0, 0]), ids(3))

    assert forest.rows[0].logprobs == [0.0, -0.1, 0.0, -0.2]
    assert forest.rows[1].logprobs == [0.0, 0.0, 0.0, -0.3]


def test_segments_tile_each_row_and_mark_ownership() -> None:
    calls = [
        CallRecord("a", None, [1, 2, 3], [4, 5], [-1.0, -1.0]),
        CallRecord("b", "a", [6], [7, 8, 9], [-1.0] * 3),
        CallRecord("c", "a", [], [10], [-1.0]),
    ]
    forest = build_forest(calls, ["a", "b", "c"])

    assert [
        (s.call_id, s.start, s.generated_start, s.end, s.owned) for s in forest.rows[0].segments
    ] == [
        ("a", 0, 3, 5, True),
        ("b", 5, 6, 9, True),
    ]
    assert [
        (s.call_id, s.start, s.generated_start, s.end, s.owned) for s in forest.rows[1].segments
    ] == [
        ("a", 0, 3, 5, False),
        ("c", 5, 5, 6, True),
    ]


def test_build_is_deterministic_and_ignores_record_order() -> None:
    calls = tree([None, 0, 0, 1, None, 4])
    selection = ["c4", "c0", "c2", "c1", "c3", "c5"]

    first = build_forest(calls, selection)
    again = build_forest(list(reversed(calls)), selection)

    assert first == again


def test_length_limited_selected_generation_marks_forest_truncated() -> None:
    calls = tree([None, 0, 0], c2={"finish_reason": "length"})

    assert build_forest(calls, ids(3)).truncated is True
    assert build_forest(calls, ["c0", "c1"]).truncated is False


def test_negative_infinity_logprob_is_accepted() -> None:
    forest = build_forest([CallRecord("a", None, [1], [2], [-math.inf])], ["a"])

    assert forest.rows[0].logprobs == [0.0, -math.inf]


def test_terminal_among_selected_calls_is_kept() -> None:
    forest = build_forest(tree([None, 0]), ids(2), terminal="c0")

    assert forest.terminal == "c0"
    assert forest.trainable is True


# --- mask reasons (non-strict) and their strict errors ----------------------------------------

MASK_CASES = [
    (MaskReason.EMPTY_SELECTION, tree([None]), [], None, None),
    (MaskReason.SELECTED_CALL_MISSING, tree([None]), ["c0", "ghost"], None, "ghost"),
    (
        MaskReason.SELECTED_CALL_PENDING,
        tree([None, 0], c1={"status": "pending", "generated_tokens": [], "logprobs": []}),
        ids(2),
        None,
        "c1",
    ),
    (MaskReason.SELECTED_CALL_FAILED, tree([None, 0], c0={"status": "failed"}), ids(2), None, "c0"),
    (MaskReason.SELECTION_NOT_CLOSED, tree([None, 0, 1]), ["c0", "c2"], None, "c2"),
    (MaskReason.TERMINAL_NOT_SELECTED, tree([None, 0]), ["c0"], "c1", "c1"),
]


@dataclass(frozen=True)
class MaskCase:
    reason: MaskReason
    calls: list[CallRecord]
    selected: list[str]
    terminal: str | None
    culprit: str | None


@pytest.mark.parametrize(
    "case", [MaskCase(*case) for case in MASK_CASES], ids=lambda case: case.reason.value
)
def test_broken_rule_masks_the_rollout_with_its_reason(case: MaskCase) -> None:
    forest = build_forest(case.calls, case.selected, case.terminal)

    assert forest.masked_reason == case.reason
    assert forest.rows == []
    assert forest.endpoints == []
    assert forest.trainable is False


@pytest.mark.parametrize(
    "case", [MaskCase(*case) for case in MASK_CASES], ids=lambda case: case.reason.value
)
def test_strict_mode_raises_forest_error_naming_call_and_rule(case: MaskCase) -> None:
    with pytest.raises(ForestError, match=f"'{case.reason.value}'") as raised:
        build_forest(case.calls, case.selected, case.terminal, strict=True)

    assert raised.value.rule == case.reason
    assert raised.value.call_id == case.culprit
    if case.culprit is not None:
        assert f"'{case.culprit}'" in str(raised.value)


def test_mask_reasons_cover_every_case_above_plus_the_capture_blob_and_setting_reasons() -> None:
    assert {case[0] for case in MASK_CASES} | {
        MaskReason.SELECTED_CALL_INCOMPLETE,
        MaskReason.CAPTURE_PENDING,
        MaskReason.CAPTURE_FAILED,
        MaskReason.BLOB_INVALID,
        MaskReason.ROUTE_MISSING,
        MaskReason.MEDIA_INVALID,
        MaskReason.LEDGER_CONTRADICTION,
        MaskReason.NO_TRAINABLE_TOKENS,
        MaskReason.FOREST_TRAINING_DISABLED,
        MaskReason.ROW_TOO_LONG,
    } == MASK_REASONS


def test_mask_reasons_are_plain_strings() -> None:
    assert MaskReason.SELECTION_NOT_CLOSED == "selection_not_closed"
    assert {
        "empty_selection",
        "selected_call_missing",
        "selected_call_pending",
        "selected_call_failed",
        "selection_not_closed",
        "terminal_not_selected",
        "selected_call_incomplete",
        "capture_pending",
        "capture_failed",
        "blob_invalid",
        "route_missing",
        "media_invalid",
        "ledger_contradiction",
        "no_trainable_tokens",
        "forest_training_disabled",
        "row_too_long",
    } == MASK_REASONS


def test_missing_parent_selection_is_not_repaired_by_adding_the_parent() -> None:
    forest = build_forest(tree([None, 0, 1]), ["c0", "c2"])

    assert forest.masked_reason == MaskReason.SELECTION_NOT_CLOSED
    assert forest.selected == ["c0", "c2"]


def test_failure_outranks_an_open_selection() -> None:
    calls = tree([None, 0, 1], c0={"status": "failed"})

    assert build_forest(calls, ["c0", "c2"]).masked_reason == MaskReason.SELECTED_CALL_FAILED


def test_forest_error_is_a_value_error_and_a_training_error() -> None:
    with pytest.raises(ValueError, match=r"selection_not_closed") as raised:
        build_forest(tree([None, 0, 1]), ["c0", "c2"], strict=True)

    assert isinstance(raised.value, TrainingError)


# --- malformed records raise in every mode ------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "rule"),
    [
        ({"call_id": ""}, RecordRule.INVALID_CALL_ID),
        ({"parent_id": ""}, RecordRule.INVALID_CALL_ID),
        ({"status": "done"}, RecordRule.UNKNOWN_STATUS),
        ({"logprobs": [-0.1, -0.2]}, RecordRule.LOGPROBS_LENGTH),
        ({"logprobs": [math.nan]}, RecordRule.NAN_LOGPROB),
        ({"logprobs": [math.inf]}, RecordRule.NAN_LOGPROB),
    ],
)
def test_malformed_call_record_raises_forest_error(
    fields: dict[str, object], rule: RecordRule
) -> None:
    arguments: dict[str, object] = {
        "call_id": "a",
        "parent_id": None,
        "prompt_tokens": [1],
        "generated_tokens": [2],
        "logprobs": [-0.1],
    }
    arguments.update(fields)

    with pytest.raises(ForestError, match=f"'{rule.value}'") as raised:
        CallRecord(**arguments)

    assert raised.value.rule == rule


def test_selection_given_as_one_string_raises_invalid_input() -> None:
    with pytest.raises(ForestError, match=r"invalid_input.*'c0'"):
        build_forest(tree([None]), "c0")


def test_calls_that_are_not_call_records_raise_invalid_input() -> None:
    with pytest.raises(ForestError, match=r"invalid_input.*dict"):
        build_forest([{"call_id": "c0"}], ["c0"])  # type: ignore[list-item]


def test_duplicate_call_records_raise() -> None:
    calls = [*tree([None]), *tree([None])]

    with pytest.raises(ForestError, match=r"duplicate_call_id.*'c0'"):
        build_forest(calls, ["c0"])


def test_call_selected_twice_raises() -> None:
    with pytest.raises(ForestError, match=r"duplicate_selection.*'c0'.*positions 0 and 2"):
        build_forest(tree([None, 0]), ["c0", "c1", "c0"])


def test_parent_cycle_raises_even_when_not_strict() -> None:
    calls = [
        CallRecord("r", None, [1], [2], [-0.1]),
        CallRecord("a", "b", [3], [4], [-0.1]),
        CallRecord("b", "a", [5], [6], [-0.1]),
    ]

    with pytest.raises(ForestError, match=r"parent_cycle.*a -> b -> a"):
        build_forest(calls, ["r", "a", "b"])


def test_self_parent_raises_parent_cycle() -> None:
    with pytest.raises(ForestError, match=r"parent_cycle"):
        build_forest([CallRecord("a", "a", [1], [2], [-0.1])], ["a"])


def test_root_with_empty_prompt_raises() -> None:
    with pytest.raises(ForestError, match=r"empty_root_prompt.*'a'"):
        build_forest([CallRecord("a", None, [], [2], [-0.1])], ["a"])
