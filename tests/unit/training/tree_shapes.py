"""The hidden-shape family of forests, for the tree layout and tree-packed training tests.

Seven parent shapes (``PARENT_SHAPES``), each a list ``parents[i]`` (call ``i``'s parent index, or
None for a root), plus the walkthrough of ``docs/forest.md``: compaction roots and a rejected
sibling, selected with and without the rejected call. Call ``i``'s prompt (or observation) is
``[prompt_base + i, 1]`` for a root, ``[1, 2]`` for a continuation (every sibling sees the same
observation, as a retry does), and it generates ``[gen_base + 2i, gen_base + 2i + 1]``.
"""

from __future__ import annotations

from grove.training.forest import CallRecord, Forest, build_forest

PARENT_SHAPES: dict[str, list[int | None]] = {
    "single_call": [None],
    "chain_of_six": [None, 0, 1, 2, 3, 4],
    "two_children": [None, 0, 0],
    "branching_six": [None, 0, 0, 1, 1, 2],
    "eight_branches": [None, 0, 0, 0, 0, 0, 0, 0, 0],
    "compaction_roots": [None, 0, None, 2, 3],
    "compaction_with_branches": [None, 0, 0, None, 3, 3],
}


def shape_calls(
    parents: list[int | None], *, prompt_base: int = 3, gen_base: int = 20
) -> list[CallRecord]:
    """The calls of one parent shape (see the module)."""
    calls = []
    for index, parent in enumerate(parents):
        prompt = [prompt_base + index, 1] if parent is None else [1, 2]
        generated = [gen_base + 2 * index, gen_base + 2 * index + 1]
        calls.append(
            CallRecord(
                f"c{index}",
                None if parent is None else f"c{parent}",
                prompt,
                generated,
                [-0.25 - index / 10, -0.5 - index / 10],
            )
        )
    return calls


def shape_forest(parents: list[int | None], **bases: int) -> Forest:
    """The forest of one parent shape with every call selected."""
    calls = shape_calls(parents, **bases)
    return build_forest(calls, [call.call_id for call in calls], strict=True)


def walkthrough_calls() -> list[CallRecord]:
    """``docs/forest.md``'s compaction example: c3 rewrites the context (a new root whose prompt
    begins like c1's), c4 is rejected and c5 retries it with the same observation."""
    return [
        CallRecord("c1", None, [1, 2, 3], [10, 11], [-0.1, -0.2]),
        CallRecord("c2", "c1", [4, 5], [12, 13], [-0.3, -0.4]),
        CallRecord("c3", None, [1, 2, 30, 31], [14], [-0.5]),
        CallRecord("c4", "c3", [6], [15, 16], [-0.6, -0.7]),
        CallRecord("c5", "c3", [6], [17, 18], [-0.8, -0.9]),
    ]


def walkthrough_forest(*, with_rejected: bool) -> Forest:
    """The walkthrough selected as ``returned_history`` does (c4 left out) or as
    ``all_captured`` does (c4 selected: a rejected sibling)."""
    selected = ["c1", "c2", "c3", "c4", "c5"] if with_rejected else ["c1", "c2", "c3", "c5"]
    return build_forest(walkthrough_calls(), selected, terminal="c5", strict=True)


def all_forests() -> dict[str, Forest]:
    """Every forest of the family, by name."""
    forests = {name: shape_forest(parents) for name, parents in PARENT_SHAPES.items()}
    forests["rejected_sibling_left_out"] = walkthrough_forest(with_rejected=False)
    forests["rejected_sibling_selected"] = walkthrough_forest(with_rejected=True)
    return forests
