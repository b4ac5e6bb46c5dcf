"""Tree layout: the rows of a forest as one token tree, every shared prefix token laid out once.

A forest's rows repeat their shared ancestors: eight branches from one parent carry the parent's
tokens eight times. In a causal model a token's hidden state depends only on the tokens before
it, so two rows that begin with the same tokens compute the same states over that common
prefix. The tree layout keeps each distinct prefix once (``docs/forest.md``, "Tree layout"):

1. Rows are taken in order. Row ``i`` shares its longest common token prefix with any earlier
   row (the first such row on a tie); its tokens after that prefix are new nodes, each the child
   of the token before it. This is the token trie of the rows: every shared ancestor call, every
   retried sibling's common observation, even two roots that begin alike, are laid out once.
2. The nodes are numbered depth-first (pre-order): a row's new tokens, then the branches that
   leave it, deepest branch point first, and branches at the same point in row order. Parents
   therefore come before children, and each token's subtree is one contiguous range
   ``[i, subtree_end[i])``.
3. Each node keeps its parent's index (-1 for a root token) and its position id: its depth, which
   is the position the token has in every row that contains it.
4. The attention mask lets token ``i`` see token ``j`` iff ``j`` is ``i`` or one of its
   ancestors; with the depth-first numbering that is ``j <= i < subtree_end[j]``.

Rows are read as they are: the trainer passes each row up to its last loss token
(``grove.training.tree_logprobs``). Nothing here runs a model; it takes token ids and returns
tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grove.training.errors import BatchError
from grove.training.forest import Forest

__all__ = ["TreeLayout", "forest_tree", "pack_tree"]


@dataclass(frozen=True, eq=False)
class TreeLayout:
    """Rows laid out as one token tree in depth-first order (producer: ``pack_tree``; consumers:
    ``grove.training.tree_logprobs``, ``grove show --tree``).

    ``token_ids``, ``parents``, ``position_ids`` and ``subtree_end`` are int64 ``(N,)`` over the
    ``N`` distinct prefix tokens: ``parents[i]`` is the index of token ``i``'s parent (-1 for the
    first token of a row), ``position_ids[i]`` its depth (the position it has in each row that
    holds it), ``subtree_end[i]`` one past the last index of its subtree. ``row_positions[r]``
    int64 ``(len_r,)`` maps row ``r``'s token ``t`` to its packed index.
    """

    token_ids: torch.Tensor
    parents: torch.Tensor
    position_ids: torch.Tensor
    subtree_end: torch.Tensor
    row_positions: tuple[torch.Tensor, ...]

    @property
    def tokens(self) -> int:
        """Tokens in the tree (``N``): what a forward pass over it processes."""
        return int(self.token_ids.shape[0])

    @property
    def row_tokens(self) -> int:
        """Tokens in the rows it lays out: what processing each row on its own costs."""
        return sum(int(positions.shape[0]) for positions in self.row_positions)

    def attention_mask(self) -> torch.Tensor:
        """bool ``(N, N)``: ``[i, j]`` is True iff token ``j`` is token ``i`` or an ancestor."""
        index = torch.arange(self.tokens)
        return (index[None, :] <= index[:, None]) & (index[:, None] < self.subtree_end[None, :])


def pack_tree(rows: Sequence[torch.Tensor | Sequence[int]]) -> TreeLayout:
    """The rows' token tree (see the module): each distinct token prefix once, depth-first."""
    tokens = [_as_tokens(row, index) for index, row in enumerate(rows)]
    shared, source = _shared_prefixes(tokens)
    order = _depth_first_rows(tokens, shared, source)
    offsets: dict[int, int] = {}
    total = 0
    for row in order:
        offsets[row] = total
        total += int(tokens[row].shape[0]) - shared[row]
    token_ids = torch.empty(total, dtype=torch.int64)
    parents = torch.empty(total, dtype=torch.int64)
    position_ids = torch.empty(total, dtype=torch.int64)
    row_positions: list[torch.Tensor] = []
    for row, row_tokens in enumerate(tokens):
        start, length = shared[row], int(row_tokens.shape[0])
        new = torch.arange(offsets.get(row, 0), offsets.get(row, 0) + length - start)
        positions = torch.cat([row_positions[source[row]][:start], new]) if start else new
        row_positions.append(positions)
        token_ids[new] = row_tokens[start:]
        position_ids[new] = torch.arange(start, length)
        if length > start:
            parents[new[1:]] = new[:-1]
            parents[new[0]] = positions[start - 1] if start else -1
    subtree_end = torch.zeros(total, dtype=torch.int64)
    for positions in row_positions:
        if positions.shape[0]:
            # The last row token is the row's deepest; in pre-order a subtree ends after the
            # largest index of any row through it.
            subtree_end.scatter_reduce_(
                0, positions, (positions.max() + 1).expand_as(positions), reduce="amax"
            )
    return TreeLayout(token_ids, parents, position_ids, subtree_end, tuple(row_positions))


def forest_tree(forest: Forest) -> TreeLayout:
    """The tree layout of a forest's rows (empty for a masked forest)."""
    return pack_tree([row.token_ids for row in forest.rows])


def _as_tokens(row: torch.Tensor | Sequence[int], index: int) -> torch.Tensor:
    tokens = row if isinstance(row, torch.Tensor) else torch.tensor(list(row), dtype=torch.int64)
    if tokens.ndim != 1 or tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise BatchError(
            "tree_rows",
            f"row {index} must be a 1-D sequence of integer token ids, got {tokens.dtype} "
            f"{tuple(tokens.shape)}",
        )
    return tokens.to(torch.int64)


def _shared_prefixes(tokens: list[torch.Tensor]) -> tuple[list[int], list[int]]:
    """Per row, the longest token prefix it shares with an earlier row, and that row (the first
    one on a tie; the row itself when it shares nothing)."""
    shared: list[int] = []
    source: list[int] = []
    for row, row_tokens in enumerate(tokens):
        best, best_row = 0, row
        for earlier in range(row):
            width = min(int(row_tokens.shape[0]), int(tokens[earlier].shape[0]))
            if width <= best:
                continue
            differs = row_tokens[:width] != tokens[earlier][:width]
            common = int(differs.to(torch.int8).argmax()) if bool(differs.any()) else width
            if common > best:
                best, best_row = common, earlier
        shared.append(best)
        source.append(best_row)
    return shared, source


def _depth_first_rows(
    tokens: list[torch.Tensor], shared: list[int], source: list[int]
) -> list[int]:
    """Rows in the pre-order of their new tokens: a row, then the rows branching off it, deepest
    branch point first, row order among equals. Rows with no new token are left out."""
    holder = []  # the row whose new tokens hold row r's token at depth shared[r] - 1
    for row in range(len(tokens)):
        owner = source[row]
        while shared[row] and shared[row] <= shared[owner] and owner != source[owner]:
            owner = source[owner]
        holder.append(owner)
    branches: dict[int, list[int]] = {}
    roots: list[int] = []
    for row in range(len(tokens)):
        if shared[row] == int(tokens[row].shape[0]):
            continue
        if shared[row] == 0:
            roots.append(row)
        else:
            branches.setdefault(holder[row], []).append(row)
    order: list[int] = []
    stack = list(reversed(roots))
    while stack:
        row = stack.pop()
        order.append(row)
        children = sorted(branches.get(row, []), key=lambda child: (-shared[child], child))
        stack.extend(reversed(children))
    return order
