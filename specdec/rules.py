"""The building blocks of acceptance rules, shared by the strategies (``specdec.strategies``) and the
verification layouts (``specdec.layout``): leading runs of acceptances, greedy matching, and walking a token tree
down its accepted path. A chain is the tree whose every node has one child, so each chain rule has a tree twin.

Shapes: ``B`` rows, ``k`` chain drafts, ``N`` tree nodes at positions 1..N (0 is the root, the last emitted token),
``d`` tree levels, ``V`` vocabulary (``specdec.types``).
"""

from __future__ import annotations

import torch

from specdec.sampling import sample
from specdec.tree import RowTree, as_rows
from specdec.types import TreeShape, Verdict


def probs_of(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B, k, V] probabilities, [B, k] tokens -> [B, k] probability of each token."""
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def row_at(probs: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """[B, n, V] probabilities, [B] positions -> [B, V] the distribution at each row's position."""
    batch, _, vocab = probs.shape
    return probs.gather(1, index.view(batch, 1, 1).expand(batch, 1, vocab)).squeeze(1)


def count_leading_true(accepted: torch.Tensor) -> torch.Tensor:
    """[B, k] bool -> [B] long: length of the all-True prefix of each row."""
    return accepted.cumprod(-1).sum(-1)  # cumprod of bool is long


def greedy_verdict(draft_tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
    """Keep drafts while they equal the target's choice; emit the target's choice at the first mismatch.

    draft_tokens [B, k], target_choice [B, k+1] (the argmax of each target distribution).
    """
    k = draft_tokens.shape[1]
    num_accepted = count_leading_true(draft_tokens == target_choice[:, :k])  # [B]
    next_token = target_choice.gather(1, num_accepted.unsqueeze(1)).squeeze(1)  # [B]
    return Verdict(num_accepted, next_token)


def first_accepted_path(tree: TreeShape | RowTree, accepted: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Walk down from the root taking, at each node, its first child that ``accepted`` [B, N] marks.

    Returns num_accepted [B] (the path's depth), path [B, d] (positions by depth, 0 past the end) and end [B] (the
    position the path ends at: the root, or its deepest node). The loop is over depth, never over rows.
    """
    batch = accepted.shape[0]
    tree = as_rows(tree, batch)
    rows = torch.arange(batch, device=accepted.device)
    accepted = torch.cat([torch.zeros_like(accepted[:, :1]), accepted], 1)  # [B, N+1], by position
    end = torch.zeros(batch, dtype=torch.long, device=accepted.device)  # [B]
    alive = torch.ones(batch, dtype=torch.bool, device=accepted.device)  # [B]
    path = []
    for b in tree.branching:
        candidates = tree.children[rows, end, :b]  # [B, b]
        ok = accepted.gather(1, candidates.clamp_min(0)) & (candidates >= 0)  # [B, b]
        alive = ok.any(-1) & alive  # [B]
        first = ok.long().argmax(-1, keepdim=True)  # [B, 1], first True
        end = torch.where(alive, candidates.gather(1, first).squeeze(1), end)
        path.append(torch.where(alive, end, 0))
    path = torch.stack(path, 1)  # [B, d]
    return (path > 0).sum(-1), path, end


def at_parents(values: torch.Tensor, tree: TreeShape | RowTree) -> torch.Tensor:
    """[B, N+1] a value at each position -> [B, N] the value at each node's parent."""
    return values.gather(1, as_rows(tree, values.shape[0]).parent)


def greedy_tree(tree: TreeShape | RowTree, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
    """The longest path whose every token equals the target's argmax at its parent; then the argmax at its end.

    tokens [B, N], target_choice [B, N+1] (argmax of the target distribution at each position).
    """
    matched = tokens == at_parents(target_choice, tree)  # [B, N]
    num_accepted, path, end = first_accepted_path(tree, matched)
    return Verdict(num_accepted, target_choice.gather(1, end.unsqueeze(1)).squeeze(1), path)


def node_probs(target_probs: torch.Tensor, tokens: torch.Tensor, tree: TreeShape | RowTree) -> torch.Tensor:
    """[B, N] p(node token) under the target distribution at the node's parent."""
    batch, vocab = target_probs.shape[0], target_probs.shape[-1]
    parent = as_rows(tree, batch).parent  # [B, N]
    return target_probs.reshape(batch, -1).gather(1, parent * vocab + tokens)  # [B, N]


def nodewise_tree(
    tree: TreeShape | RowTree, accepted: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator
) -> Verdict:
    """A rule that judges each node on its own (typical, top-k, synthetic): the first path accepted node by node,
    then a sample of p at its end."""
    num_accepted, path, end = first_accepted_path(tree, accepted)
    return Verdict(num_accepted, sample(row_at(target_probs, end), generator), path)


def speculative_tree(
    tree: TreeShape | RowTree, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
    generator: torch.Generator, lenience: float = 1.0,
) -> Verdict:
    """Multi-step speculative sampling (SpecInfer; SpecTr and Sequoia for siblings drawn without replacement).

    At the current node (the root first), with r = p (the target distribution there) and q the draft's: try its
    children x_1..x_b in order; accept x_s with probability min(1, r(x_s) / (l q(x_s))); on a rejection
    r <- norm(max(0, r - q)) and try the next sibling. For i.i.d. siblings (a static tree) q stays; for siblings
    drawn without replacement (``distinct_siblings``) q <- norm(q with q(x_s) = 0), the distribution the next
    sibling was drawn from, and a child outside q's support (a draw past it) is no draw and is skipped. An accepted
    child becomes the current node, with r = p at it. When every child is rejected (or the node is a leaf) the next
    token is a sample of r. With lenience l = 1 the emitted tokens are distributed exactly as p: each sibling is a
    draw from the q it is judged by, so each step is a standard speculative sampling step against the residual left
    by the previous siblings, whatever decided how many children a node has before they were drawn.

    tokens [B, N], draft_probs [B, I, V] (q at the first I positions, those with children), target_probs
    [B, N+1, V].
    """
    batch = tokens.shape[0]
    tree = as_rows(tree, batch)
    rows = torch.arange(batch, device=tokens.device)
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # [B] current position
    residual = target_probs[:, 0]  # [B, V]
    alive = torch.ones(batch, dtype=torch.bool, device=tokens.device)  # [B] still descending
    path = []
    for b in tree.branching:
        q = draft_probs[rows, node.clamp(max=draft_probs.shape[1] - 1)]  # [B, V]; dead rows read anything
        searching = alive.clone()  # [B] rows still trying this node's children
        for s in range(b):
            child = tree.children[rows, node, s]  # [B], -1 where the node has no s-th child
            token = tokens[rows, (child - 1).clamp_min(0)]  # [B]
            uniform = torch.rand(batch, generator=generator, device=tokens.device)  # [B]
            r_x, q_x = residual[rows, token], q[rows, token]  # [B]
            tried = searching & (child >= 0)
            if tree.distinct_siblings:
                tried &= q_x > 0
            accept = tried & (uniform * lenience * q_x < r_x)  # [B]
            reject = tried & ~accept
            residual = torch.where(reject.unsqueeze(1), normalized_excess(residual, q), residual)
            if tree.distinct_siblings:
                q = torch.where(reject.unsqueeze(1), without_token(q, token), q)
            residual = torch.where(accept.unsqueeze(1), target_probs[rows, child.clamp_min(0)], residual)
            node = torch.where(accept, child, node)
            searching &= ~accept
        alive &= ~searching  # rows that found no accepted child stop at their node
        path.append(torch.where(alive, node, 0))
    path = torch.stack(path, 1)  # [B, d]
    next_token = sample(residual, generator)  # [B]
    return Verdict((path > 0).sum(-1), next_token, path)


def normalized_excess(residual: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[B, V] norm(max(0, r - q)); r itself where rounding leaves no mass (r == q)."""
    leftover = (residual - q).clamp_min(0)  # [B, V]
    mass = leftover.sum(-1, keepdim=True)  # [B, 1]
    return torch.where(mass > 0, leftover / mass.clamp_min(torch.finfo(leftover.dtype).tiny), residual)


def without_token(q: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """[B, V] q with each row's ``token`` [B] removed and the rest renormalised (all zero where none is left)."""
    removed = q.scatter(1, token.unsqueeze(1), 0.0)  # [B, V]
    mass = removed.sum(-1, keepdim=True)  # [B, 1]
    return removed / mass.clamp_min(torch.finfo(q.dtype).tiny)
