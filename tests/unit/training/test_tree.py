"""The tree layout (training/tree.py) checked against the rows of every forest of the family."""

from __future__ import annotations

import pytest
import torch

from grove.training.errors import BatchError
from grove.training.forest import Forest
from grove.training.tree import TreeLayout, forest_tree, pack_tree
from tests.unit.training.tree_shapes import all_forests, shape_forest, walkthrough_forest

FORESTS = all_forests()


def ancestors_or_self(layout: TreeLayout, index: int) -> set[int]:
    found = set()
    while index >= 0:
        found.add(index)
        index = int(layout.parents[index])
    return found


@pytest.mark.parametrize("name", sorted(FORESTS))
def test_each_row_reads_back_from_the_tree_with_positions_along_its_path(name: str) -> None:
    forest = FORESTS[name]
    layout = forest_tree(forest)

    for row, positions in zip(forest.rows, layout.row_positions, strict=True):
        assert layout.token_ids[positions].tolist() == row.token_ids
        assert layout.position_ids[positions].tolist() == list(range(len(row.token_ids)))
        assert layout.parents[positions].tolist() == [-1, *positions[:-1].tolist()]


@pytest.mark.parametrize("name", sorted(FORESTS))
def test_tree_holds_each_distinct_token_prefix_of_the_rows_once(name: str) -> None:
    forest = FORESTS[name]
    layout = forest_tree(forest)

    prefixes = {
        tuple(row.token_ids[: t + 1]) for row in forest.rows for t in range(len(row.token_ids))
    }
    assert layout.tokens == len(prefixes)
    assert layout.row_tokens == sum(len(row.token_ids) for row in forest.rows)


@pytest.mark.parametrize("name", sorted(FORESTS))
def test_mask_lets_each_token_see_exactly_its_ancestors_and_itself(name: str) -> None:
    layout = forest_tree(FORESTS[name])
    mask = layout.attention_mask()

    for index in range(layout.tokens):
        assert set(torch.nonzero(mask[index]).flatten().tolist()) == ancestors_or_self(
            layout, index
        )


@pytest.mark.parametrize("name", sorted(FORESTS))
def test_order_is_depth_first_with_each_subtree_contiguous(name: str) -> None:
    layout = forest_tree(FORESTS[name])

    assert all(int(layout.parents[i]) < i for i in range(layout.tokens))
    for index in range(layout.tokens):
        subtree = [j for j in range(layout.tokens) if index in ancestors_or_self(layout, j)]
        assert subtree == list(range(index, int(layout.subtree_end[index])))


def test_eight_branches_lay_out_the_parent_and_the_shared_observation_once() -> None:
    layout = forest_tree(FORESTS["eight_branches"])

    # Parent: prompt [3, 1] + generation [20, 21]; every branch: observation [1, 2] (the same
    # in all eight) + its own generation: 4 + 2 + 8 x 2 = 22 tokens for 8 rows of 8.
    assert (layout.tokens, layout.row_tokens) == (22, 64)


def test_a_chain_is_its_one_row_in_order() -> None:
    forest = FORESTS["chain_of_six"]
    layout = forest_tree(forest)

    assert layout.token_ids.tolist() == forest.rows[0].token_ids
    assert layout.parents.tolist() == list(range(-1, layout.tokens - 1))
    assert torch.equal(layout.attention_mask(), torch.ones(24, 24, dtype=torch.bool).tril())


def test_compaction_roots_that_begin_differently_are_separate_roots() -> None:
    layout = forest_tree(FORESTS["compaction_roots"])

    assert torch.nonzero(layout.parents < 0).flatten().tolist() == [0, 8]
    assert not layout.attention_mask()[8:, :8].any()


def test_walkthrough_tree_shares_the_common_prompt_start_and_the_retried_call() -> None:
    forest = walkthrough_forest(with_rejected=True)
    layout = forest_tree(forest)

    # Rows: 1 2 3 10 11 4 5 12 13 | 1 2 30 31 14 6 15 16 | 1 2 30 31 14 6 17 18. The rewritten
    # root begins like the first (1 2), the retry shares c3 and its observation (30 31 14 6).
    assert layout.token_ids.tolist() == [
        1,
        2,
        3,
        10,
        11,
        4,
        5,
        12,
        13,
        30,
        31,
        14,
        6,
        15,
        16,
        17,
        18,
    ]
    assert layout.parents.tolist() == [-1, 0, 1, 2, 3, 4, 5, 6, 7, 1, 9, 10, 11, 12, 13, 12, 15]
    assert layout.position_ids.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 2, 3, 4, 5, 6, 7, 6, 7]
    assert [p.tolist() for p in layout.row_positions] == [
        list(range(9)),
        [0, 1, 9, 10, 11, 12, 13, 14],
        [0, 1, 9, 10, 11, 12, 15, 16],
    ]


def test_rejected_sibling_left_out_of_the_selection_is_not_in_the_tree() -> None:
    layout = forest_tree(walkthrough_forest(with_rejected=False))

    assert 15 not in layout.token_ids.tolist() and 16 not in layout.token_ids.tolist()
    assert layout.tokens == 15


def test_deeper_branch_comes_first_in_depth_first_order() -> None:
    # Row 2 leaves row 0 at depth 4, row 1 at depth 1: pre-order visits row 2's branch first.
    layout = pack_tree([[1, 2, 3, 4, 5], [1, 9, 9], [1, 2, 3, 4, 7]])

    assert layout.token_ids.tolist() == [1, 2, 3, 4, 5, 7, 9, 9]
    assert [p.tolist() for p in layout.row_positions] == [
        [0, 1, 2, 3, 4],
        [0, 6, 7],
        [0, 1, 2, 3, 5],
    ]


def test_a_row_that_is_a_prefix_of_an_earlier_row_adds_no_token() -> None:
    layout = pack_tree([[1, 2, 3], [1, 2]])

    assert layout.tokens == 3
    assert [p.tolist() for p in layout.row_positions] == [[0, 1, 2], [0, 1]]


def test_empty_rows_and_no_rows_give_an_empty_tree() -> None:
    assert pack_tree([]).tokens == 0
    layout = pack_tree([[], [4]])
    assert layout.tokens == 1
    assert [p.tolist() for p in layout.row_positions] == [[], [0]]


def test_masked_forest_gives_an_empty_tree() -> None:
    masked = Forest([], [], None, [], None, False)
    assert forest_tree(masked).tokens == 0


def test_non_integer_row_raises_batch_error() -> None:
    with pytest.raises(BatchError, match="row 1 must be a 1-D sequence of integer token ids"):
        pack_tree([[1, 2], torch.tensor([0.5, 1.0])])


def test_two_shapes_with_different_prompts_share_nothing() -> None:
    first = shape_forest([None, 0, 0], prompt_base=3)
    second = shape_forest([None, 0, 0], prompt_base=7)
    rows = [row.token_ids for row in first.rows + second.rows]

    layout = pack_tree(rows)
    assert layout.tokens == forest_tree(first).tokens + forest_tree(second).tokens
