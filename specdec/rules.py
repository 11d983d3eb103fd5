"""The building blocks of acceptance rules, shared by the strategies (``specdec.strategies``) and the
verification layouts (``specdec.layout``): leading runs of acceptances, greedy matching, and walking a token tree
down its accepted path. A chain is the tree whose every node has one child, so each chain rule has a tree twin.

Shapes: ``B`` rows, ``k`` chain drafts, ``N`` tree nodes at positions 1..N (0 is the root, the last emitted token),
``d`` tree levels, ``V`` vocabulary (``specdec.types``).
"""

from __future__ import annotations

import torch

from specdec.sampling import sample
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


def greedy_tree(shape: TreeShape, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
    """The longest path whose every token equals the target's argmax at its parent; then the argmax at its end.

    tokens [B, N], target_choice [B, N+1] (argmax of the target distribution at each position).
    """
    matched = tokens == target_choice.gather(1, shape.parent.expand_as(tokens))  # [B, N]
    num_accepted, path, end = first_accepted_path(shape, matched)
    return Verdict(num_accepted, target_choice.gather(1, end.unsqueeze(1)).squeeze(1), path)


def node_probs(target_probs: torch.Tensor, tokens: torch.Tensor, shape: TreeShape) -> torch.Tensor:
    """[B, N] p(node token) under the target distribution at the node's parent."""
    parent_probs = target_probs[:, shape.parent]  # [B, N, V]
    return parent_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def nodewise_tree(
    shape: TreeShape, accepted: torch.Tensor, target_probs: torch.Tensor, generator: torch.Generator
) -> Verdict:
    """A rule that judges each node on its own (typical, top-k, synthetic): the first path accepted node by node,
    then a sample of p at its end."""
    num_accepted, path, end = first_accepted_path(shape, accepted)
    end_probs = target_probs.gather(1, end.view(-1, 1, 1).expand(-1, 1, target_probs.shape[-1])).squeeze(1)
    return Verdict(num_accepted, sample(end_probs, generator), path)


def speculative_tree(
    shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
    generator: torch.Generator, lenience: float = 1.0,
) -> Verdict:
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
    return Verdict((path > 0).sum(-1), next_token, path)
