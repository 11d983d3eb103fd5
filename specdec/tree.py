"""Token trees: draft a tree of candidates, verify every node in one target forward, accept the best path.

A chain drafts one token per depth and throws away the draft's second choices; a tree keeps b_i of them at
depth i (``TreeShape``), and the target scores all N nodes at once under an ancestor mask (``KVCache.forward_tree``),
so one target call can accept a path that a chain would have lost at its first rejection.

Children. At temperature 0 a node's children are the draft's top-b tokens (distinct). When sampling they are b
i.i.d. draws from the draft distribution q at the node (with replacement), so that SpecInfer's multi-step
speculative sampling is exact (``speculative_tree``).

The drafter is ``specdec.drafters.TreeDrafter``. Rollback is the chains' masking: both caches keep the slots of the accepted path and every other node becomes a
hole (``KVCache.keep_slots``), in the one place each cache is rolled back.

k and draft-length policies: k is the tree's depth. A step drafts the first min(k, d) levels of the shape, so a
fixed k >= d drafts the whole tree, a smaller k (the loop's, near ``max_new_tokens`` or the context limit, or an
adaptive policy's) a shallower one, and per-position statistics are per depth. Trees ignore a policy's early stop.
"""

from __future__ import annotations

import functools
import math

import torch

from specdec.sampling import sample
from specdec.types import TreeShape, TreeVerdict

MAX_TREE_NODES = 1024  # nodes one verification may hold (Sequoia's largest trees hold 768)


@functools.lru_cache(maxsize=None)
def tree_shape(branching: tuple[int, ...]) -> TreeShape:
    """The static tree where each node at depth i - 1 has ``branching[i - 1]`` children."""
    if (not isinstance(branching, tuple) or not branching
            or not all(isinstance(b, int) and not isinstance(b, bool) and b >= 1 for b in branching)):
        shown = list(branching) if isinstance(branching, tuple) else branching
        raise ValueError(f"branching must be a non-empty list of integers >= 1 (children per node at each depth, "
                         f"e.g. [2, 2, 1]), got {shown!r}")
    num_nodes = sum(math.prod(branching[:depth]) for depth in range(1, len(branching) + 1))
    if num_nodes > MAX_TREE_NODES:
        raise ValueError(f"branching {list(branching)} makes a tree of {num_nodes} nodes; at most {MAX_TREE_NODES} "
                         f"are verified in one target forward")
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


@functools.lru_cache(maxsize=None)
def tree_shape_on(branching: tuple[int, ...], device: torch.device) -> TreeShape:
    """``tree_shape(branching)`` with its tensors on ``device`` (built once per device)."""
    return tree_shape(branching).on(device)


def truncated(shape: TreeShape, depth: int) -> TreeShape:
    """The first ``depth`` levels (a prefix of the positions, in breadth-first order), on the shape's device."""
    if depth >= len(shape.branching):
        return shape
    return tree_shape_on(shape.branching[:depth], shape.parent.device)


def path_tokens(tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """[B, N] node tokens, [B, d] path positions -> [B, d] the tokens along the path."""
    return tokens.gather(1, (path - 1).clamp_min(0))


def kept_positions(path: torch.Tensor, num_kept: torch.Tensor, num_positions: int) -> torch.Tensor:
    """[B, N+1] bool: the root and the path's first ``num_kept - 1`` [B] nodes (a row keeps num_kept positions)."""
    batch, depth = path.shape
    on_path = torch.cat([torch.zeros_like(path[:, :1]), path], 1)  # [B, d+1], the root first
    within = torch.arange(depth + 1, device=path.device) < num_kept.unsqueeze(1)  # [B, d+1]
    kept = torch.zeros(batch, num_positions, dtype=torch.long, device=path.device)
    return kept.scatter_add_(1, on_path, within.long()) > 0  # past the end the path reads 0 and adds nothing


def first_accepted_path(shape: TreeShape, accepted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk down from the root taking, at each node, its first child that ``accepted`` [B, N] marks.

    Returns num_accepted [B] (the path's depth), path [B, d] (positions by depth, 0 past the end) and end [B] (the
    position the path ends at: the root, or its deepest node). The loop is over depth, never over rows.
    """
    batch = accepted.shape[0]
    accepted = torch.cat([torch.zeros_like(accepted[:, :1]), accepted], 1)  # [B, N+1], by position
    end = torch.zeros(batch, dtype=torch.long, device=accepted.device)  # [B]
    alive = torch.ones(batch, dtype=torch.bool, device=accepted.device)  # [B]
    path = []
    for level, b in enumerate(shape.branching):
        candidates = shape.children[end, :b]  # [B, b]
        ok = accepted.gather(1, candidates.clamp_min(0)) & (candidates >= 0)  # [B, b]
        found = ok.any(-1) & alive  # [B]
        first = ok.long().argmax(-1, keepdim=True)  # [B, 1], first True
        end = torch.where(found, candidates.gather(1, first).squeeze(1), end)
        alive = found
        path.append(torch.where(found, end, 0))
    path = torch.stack(path, 1)  # [B, d]
    return (path > 0).sum(-1), path, end


def greedy_tree(shape: TreeShape, tokens: torch.Tensor, target_choice: torch.Tensor) -> TreeVerdict:
    """The longest path whose every token equals the target's argmax at its parent; then the argmax at its end.

    tokens [B, N], target_choice [B, N+1] (argmax of the target distribution at each position).
    """
    matched = tokens == target_choice.gather(1, shape.parent.expand_as(tokens))  # [B, N]
    num_accepted, path, end = first_accepted_path(shape, matched)
    return TreeVerdict(num_accepted, target_choice.gather(1, end.unsqueeze(1)).squeeze(1), path)


def node_probs(target_probs: torch.Tensor, tokens: torch.Tensor, shape: TreeShape) -> torch.Tensor:
    """[B, N] p(node token) under the target distribution at the node's parent."""
    parent_probs = target_probs[:, shape.parent]  # [B, N, V]
    return parent_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def nodewise_tree(
    shape: TreeShape, accepted: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator
) -> TreeVerdict:
    """A rule that judges each node on its own (typical, top-k, synthetic): the first path accepted node by node,
    then a sample of p at its end."""
    num_accepted, path, end = first_accepted_path(shape, accepted)
    end_probs = target_probs.gather(1, end.view(-1, 1, 1).expand(-1, 1, target_probs.shape[-1])).squeeze(1)
    return TreeVerdict(num_accepted, sample(end_probs, generator), path)


def speculative_tree(
    shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
    generator: torch.Generator, lenience: float = 1.0,
) -> TreeVerdict:
    """SpecInfer's multi-step speculative sampling, for children drawn i.i.d. from q at their parent.

    At the current node (the root first), with r = p (the target distribution there): try its children x_1..x_b
    in order; accept x_s with probability min(1, r(x_s) / (l q(x_s))); on a rejection r <- norm(max(0, r - q)) and
    try the next sibling. An accepted child becomes the current node, with r = p at it. When every child is
    rejected (or the node is a leaf, whose q is zero) the next token is a sample of r. With lenience l = 1 the
    emitted tokens are distributed exactly as p: each sibling is a fresh draw from q, so each step is a standard
    speculative sampling step against the residual left by the previous siblings.

    tokens [B, N], draft_probs [B, I, V] (q at each internal position), target_probs [B, N+1, V].
    """
    batch, vocab = tokens.shape[0], target_probs.shape[-1]
    rows = torch.arange(batch, device=tokens.device)
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # [B] current position
    residual = target_probs[:, 0]  # [B, V]
    alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)  # [B] still descending
    path = []
    for b in shape.branching:
        q = draft_probs[rows, node.clamp(max=draft_probs.shape[1] - 1)]  # [B, V]; dead rows read anything
        searching = alive.clone()  # [B] rows still trying this node's children
        for s in range(b):
            child = shape.children[node, s]  # [B]
            token = tokens[rows, (child - 1).clamp_min(0)]  # [B]
            uniform = torch.rand(batch, generator=generator, device=tokens.device)  # [B]
            r_x, q_x = residual[rows, token], q[rows, token]  # [B]
            accept = searching & (uniform * lenience * q_x < r_x)  # [B]
            reject = searching & ~accept
            leftover = (residual - q).clamp_min(0)  # [B, V]
            mass = leftover.sum(-1, keepdim=True)  # [B, 1]
            updated = torch.where(mass > 0, leftover / mass, residual)  # rounding can leave none where r == q
            residual = torch.where(reject.unsqueeze(1), updated, residual)
            residual = torch.where(accept.unsqueeze(1), target_probs[rows, child.clamp_min(0)], residual)
            node = torch.where(accept, child, node)
            searching = reject
        alive = alive & ~searching  # rows that rejected every child stop at their node
        path.append(torch.where(alive, node, 0))
    path = torch.stack(path, 1)  # [B, d]
    next_token = sample(residual, generator)  # [B]
    return TreeVerdict((path > 0).sum(-1), next_token, path)
