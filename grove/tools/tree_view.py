"""The tree layout of a forest drawn as text: what ``policy.tree_packing`` computes.

``draw_tree`` draws a ``grove.training.tree.TreeLayout`` (``docs/forest.md``, "Tree layout") one
branch per line, in the packed (depth-first) order: a branch is a run of tokens in which each
token is the only child of the one before it, so a new line starts at a root and after every
branch point. Each line gives the branch's first packed index, its place in the tree, its tokens
(ids, or text with ``decode``; long branches are cut in the middle), and the rows through it.
``grove show`` puts the drawing of an attempt's forest on its page (``tree_section``).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from dataclasses import dataclass, field

from grove.training.forest import Forest
from grove.training.tree import TreeLayout, forest_tree

__all__ = ["draw_tree", "tree_section"]

Decode = Callable[[int], str]


@dataclass
class _Branch:
    start: int
    end: int
    rows: list[int]
    children: list[_Branch] = field(default_factory=list)


def draw_tree(layout: TreeLayout, *, decode: Decode | None = None, max_tokens: int = 12) -> str:
    """The layout as lines of text (see the module); ``max_tokens`` per branch are shown, the
    first and last halves of a longer one around an ellipsis."""
    roots = _branches(layout)
    header = (
        f"{layout.tokens} tokens in the tree for {len(layout.row_positions)} rows of "
        f"{layout.row_tokens} tokens"
    )
    lines = [header]
    width = len(str(max(layout.tokens - 1, 0)))

    def walk(branch: _Branch, prefix: str, glyph: str, child_prefix: str) -> None:
        tokens = _tokens_text(layout, branch, decode, max_tokens)
        rows = ("row " if len(branch.rows) == 1 else "rows ") + " ".join(map(str, branch.rows))
        lines.append(f"{branch.start:>{width}} {prefix}{glyph}{tokens}  {rows}")
        for index, child in enumerate(branch.children):
            last = index == len(branch.children) - 1
            walk(child, prefix + child_prefix, "└─" if last else "├─", "  " if last else "│ ")

    for root in roots:
        walk(root, "", "", "")
    return "\n".join(lines)


def tree_section(forest: Forest | None, decode: Decode | None) -> str:
    """HTML for ``grove show``: the drawing of ``forest``'s tree layout in a ``<pre>``, or
    nothing when there are no rows."""
    if forest is None or not forest.rows:
        return ""
    drawing = draw_tree(forest_tree(forest), decode=decode)
    return (
        '<h2>Tree layout</h2><p class="key">how <code>policy.tree_packing</code> computes these '
        "rows: each shared prefix once, one branch per line (packed index, tokens, rows).</p>"
        f'<pre class="tree">{html.escape(drawing)}</pre>'
    )


def _branches(layout: TreeLayout) -> list[_Branch]:
    """The layout's branches as a tree, roots in packed order."""
    parents = layout.parents.tolist()
    children_count = [0] * layout.tokens
    for parent in parents:
        if parent >= 0:
            children_count[parent] += 1
    rows_at: dict[int, list[int]] = {}
    for row, positions in enumerate(layout.row_positions):
        for position in positions.tolist():
            rows_at.setdefault(position, []).append(row)
    roots: list[_Branch] = []
    holder: dict[int, _Branch] = {}  # packed index -> the branch that holds it
    for index, parent in enumerate(parents):
        if parent >= 0 and children_count[parent] == 1:
            branch = holder[parent]
            branch.end = index + 1
        else:
            branch = _Branch(index, index + 1, rows_at.get(index, []))
            (holder[parent].children if parent >= 0 else roots).append(branch)
        holder[index] = branch
    return roots


def _tokens_text(
    layout: TreeLayout, branch: _Branch, decode: Decode | None, max_tokens: int
) -> str:
    ids = layout.token_ids[branch.start : branch.end].tolist()
    shown = [decode(t) if decode else str(t) for t in ids]
    if decode:
        shown = [repr(text)[1:-1] for text in shown]
    if len(shown) > max_tokens:
        half = max(max_tokens // 2, 1)
        shown = [*shown[:half], f"… {len(ids) - 2 * half} more …", *shown[-half:]]
    return "[" + (" " if not decode else "|").join(shown) + "]"
