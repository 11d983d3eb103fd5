"""Token trees: draft a tree of candidates, verify every node in one target forward, accept the best path.

A chain drafts one token per depth and throws away the draft's second choices; a tree keeps b_i of them at
depth i (``TreeShape``), and the target scores all N nodes at once under an ancestor mask (a ``TreeLayout``,
``specdec.layout``), so one target call can accept a path that a chain would have lost at its first rejection.

Children. At temperature 0 a node's children are the draft's top-b tokens (distinct). When sampling they are b
i.i.d. draws from the draft distribution q at the node (with replacement), so that SpecInfer's multi-step
speculative sampling is exact (``speculative_tree``).

The drafter is ``specdec.drafters.TreeDrafter``. Rollback is each cache's one ``keep``: the accepted path's slots
stay and every other node's are forgotten (a hole in transformers' cache, gathered away in a lean one).

A static tree is the same in every row. ``RowTree`` is a tree per batch row, for drafters that shape each row's tree
from its draft (``specdec.dynamic_tree``); the rules (``specdec.rules``) take either, a static one as its view per
row (``as_rows``).

k and draft-length policies: k is the tree's depth. A step drafts the first min(k, d) levels of the shape, so a
fixed k >= d drafts the whole tree, a smaller k (the loop's, near ``max_new_tokens`` or the context limit, or an
adaptive policy's) a shallower one, and per-position statistics are per depth. Trees ignore a policy's early stop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.types import TreeShape

MAX_TREE_NODES = 1024  # nodes one verification may hold (Sequoia's largest trees hold 768)


def tree_shape(branching: tuple[int, ...]) -> TreeShape:
    """The static tree where each node at depth i - 1 has ``branching[i - 1]`` children, on CPU (a drafter keeps its
    device copy: ``TreeDrafter.layout``)."""
    check_branching(branching)
    return build_tree_shape(branching)


def check_branching(branching: object) -> None:
    """A non-empty tuple of integers >= 1 making at most ``MAX_TREE_NODES`` nodes, else one clear error."""
    if (not isinstance(branching, tuple) or not branching
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in branching)):
        shown = list(branching) if isinstance(branching, tuple) else branching
        raise ValueError(f"branching must be a non-empty list of integers >= 1 (children per node at each depth, "
                         f"e.g. [2, 2, 1]), got {shown!r}")
    num_nodes = sum(math.prod(branching[:depth]) for depth in range(1, len(branching) + 1))
    if num_nodes > MAX_TREE_NODES:
        raise ValueError(f"branching {list(branching)} makes a tree of {num_nodes} nodes; at most {MAX_TREE_NODES} "
                         f"are verified in one target forward")


def build_tree_shape(branching: tuple[int, ...]) -> TreeShape:
    parent, depth = [], []
    level = [0]  # positions of the previous level; the root is position 0
    for d, b in enumerate(branching, start=1):
        first = len(parent) + 1
        for p in level:
            parent += [p] * b
            depth += [d] * b
        level = list(range(first, len(parent) + 1))
    num_positions = len(parent) + 1
    children = torch.full((num_positions, max(branching)), -1, dtype=torch.long)
    for node, p in enumerate(parent, start=1):
        slot = int((children[p] >= 0).sum())
        children[p, slot] = node
    ancestors = torch.eye(num_positions, dtype=torch.bool)
    for node, p in enumerate(parent, start=1):
        ancestors[node] |= ancestors[p]  # parents come first in breadth-first order
    return TreeShape(tuple(branching), torch.tensor(parent), torch.tensor(depth), children, ancestors)


def truncated(shape: TreeShape, depth: int) -> TreeShape:
    """The first ``depth`` levels (a prefix of the positions, in breadth-first order), on the shape's device."""
    if depth >= len(shape.branching):
        return shape
    return tree_shape(shape.branching[:depth]).on(shape.parent.device)


@dataclass(frozen=True)
class RowTree:
    """A token tree per batch row (a dynamic tree: ``specdec.dynamic_tree``), or a static tree seen row by row.

    Every row has N nodes at positions 1..N (0 is the root), each node's parent at a smaller position, over at most
    d levels. The rules (``specdec.rules``) loop over levels and, at each, over the ``branching[i]`` sibling slots
    a node at that depth may fill; rows with fewer children leave slots empty (-1). ``distinct_siblings``: a node's
    children were drawn without replacement from q (a dynamic tree at temperature > 0), which changes the
    speculative rule; a static tree's are i.i.d. draws."""

    branching: tuple[int, ...]  # most children of any node at each depth: the rules' loop bounds
    parent: torch.Tensor  # [B, N] position (0..N) of each node's parent
    depth: torch.Tensor  # [B, N] depth of each node, 1..d
    children: torch.Tensor  # [B, N+1, c] position of the s-th child of each position, -1 where none
    ancestors: torch.Tensor  # [B, N+1, N+1] bool: position i attends position j (j is i or an ancestor of i)
    distinct_siblings: bool = False

    @property
    def num_nodes(self) -> int:
        return self.parent.shape[1]


def row_tree(parent: torch.Tensor, branching: tuple[int, ...], distinct_siblings: bool) -> RowTree:
    """The per-row tree whose node i (position i + 1) hangs under ``parent`` [B, N] (each parent at a smaller
    position; siblings in position order). ``branching`` bounds each depth's children per node."""
    batch, num_nodes = parent.shape
    positions = torch.arange(1, num_nodes + 1, device=parent.device)  # [N]
    with_root = torch.cat([parent.new_zeros(batch, 1), parent], 1)  # [B, N+1], the root its own parent
    ancestors = torch.eye(num_nodes + 1, dtype=torch.bool, device=parent.device).expand(batch, -1, -1)
    for _ in branching:  # each round adds one more generation of ancestors
        ancestors = ancestors | ancestors.gather(1, with_root.unsqueeze(2).expand(-1, -1, num_nodes + 1))
    depth = ancestors[:, 1:].sum(-1) - 1  # [B, N] ancestors but itself, the root included
    earlier_sibling = (parent.unsqueeze(2) == parent.unsqueeze(1)) & (positions.unsqueeze(1) > positions)  # [B, N, N]
    rank = earlier_sibling.sum(-1)  # [B, N] place among its siblings
    width = max(branching)
    children = parent.new_full((batch, (num_nodes + 1) * width), -1)
    children.scatter_(1, parent * width + rank, positions.expand(batch, -1))
    return RowTree(tuple(branching), parent, depth, children.view(batch, num_nodes + 1, width), ancestors,
                   distinct_siblings)


def as_rows(tree: TreeShape | RowTree, batch: int) -> RowTree:
    """A static tree as the same tree in each of ``batch`` rows (views, no copy); a ``RowTree`` as it is."""
    if isinstance(tree, RowTree):
        return tree
    return RowTree(tree.branching, tree.parent.expand(batch, -1), tree.depth.expand(batch, -1),
                   tree.children.expand(batch, -1, -1), tree.ancestors.expand(batch, -1, -1))
