"""``grove show``'s tree drawing (grove/tools/tree_view.py) and its place on the page."""

from __future__ import annotations

import re
from pathlib import Path

from grove.tools.lineage import AttemptLineage
from grove.tools.show import render_page
from grove.tools.tree_view import draw_tree, tree_section
from grove.training.tree import forest_tree, pack_tree
from tests.unit.training.tree_shapes import shape_forest, walkthrough_forest

FOREST_DOC = Path(__file__).resolve().parents[3] / "docs" / "forest.md"

WALKTHROUGH = """\
17 tokens in the tree for 3 rows of 25 tokens
 0 [1 2]  rows 0 1 2
 2 ├─[3 10 11 4 5 12 13]  row 0
 9 └─[30 31 14 6]  rows 1 2
13   ├─[15 16]  row 1
15   └─[17 18]  row 2"""


def test_draw_tree_draws_one_branch_per_line_with_its_index_tokens_and_rows() -> None:
    assert draw_tree(forest_tree(walkthrough_forest(with_rejected=True))) == WALKTHROUGH


def test_docs_forest_tree_layout_picture_is_the_drawing() -> None:
    section = FOREST_DOC.read_text().split("## Tree layout", 1)[1]
    (picture,) = re.findall(r"```text\n(.*?)\n```", section, flags=re.DOTALL)
    assert picture == WALKTHROUGH


def test_nested_branches_keep_their_parents_rail() -> None:
    drawing = draw_tree(forest_tree(shape_forest([None, 0, 0, 1, 1, 2])))

    assert drawing.splitlines()[1:] == [
        " 0 [3 1 20 21 1 2]  rows 0 1 2",
        " 6 ├─[22 23 1 2]  rows 0 1",
        "10 │ ├─[26 27]  row 0",
        "12 │ └─[28 29]  row 1",
        "14 └─[24 25 1 2 30 31]  row 2",
    ]


def test_long_branches_are_cut_in_the_middle_and_decoded_tokens_joined() -> None:
    layout = pack_tree([list(range(30))])

    assert draw_tree(layout, max_tokens=4).splitlines()[1] == " 0 [0 1 … 26 more … 28 29]  row 0"
    assert draw_tree(pack_tree([[1, 2]]), decode=lambda t: f"t{t}\n").splitlines()[1] == (
        "0 [t1\\n|t2\\n]  row 0"
    )


def test_show_page_has_the_tree_layout_below_the_rows() -> None:
    forest = walkthrough_forest(with_rejected=True)
    lineage = AttemptLineage(
        capture_key="att-1", rollout_id="r0", prompt_group="g0", rollout_index=0,
        selection_policy="all_captured", admissions_closed=True, settled=True,
        settle_timed_out=False, cleaned=False, rollout=None, paths=(), owned=(), calls=(),
    )  # fmt: skip

    page = render_page(lineage, forest, None)

    assert tree_section(forest, None) in page
    assert page.index('<div id="rows">') < page.index("<h2>Tree layout</h2>")
    assert "├─[3 10 11 4 5 12 13]  row 0" in page
    assert tree_section(None, None) == ""
