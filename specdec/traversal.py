"""Traversal verification of token trees (Weng et al., NeurIPS 2025, arXiv 2505.12398), written as block
verification (``specdec.block``) carried over recursive rejection sampling.

Top-down tree verification (``rules.speculative_tree``) throws a node's whole subtree away once the node is
rejected. Traversal verification walks the tree depth first and decides each node when it *leaves* it, deepest
first, so a subtree is judged before its root is given up, and a path is judged by its joint ratio, as block
verification judges a chain. Each position holds a state (w, r): a weight and a target distribution (w = 1 and
r = p at the root; q is the draft distribution the node's children were drawn from):

    entering child x of node y:  w_x = min(1, w_y r_y(x) / q_y(x)),  r_x = p at x
    leaving x:                   keep the path root..x with probability w_x and emit a sample of r_x; else give
                                 x up and update y: Z = sum max(0, w_y r_y - q_y),
                                 r_y <- norm(max(0, w_y r_y - q_y)),  w_y <- Z / (Z + 1 - w_y)
    (siblings drawn without replacement, a dynamic tree's: also q_y <- q_y without x)
    nothing kept:                emit a sample of the root's r (its w stays 1)

On a chain this is block verification exactly (w_y after its child is given up is block's h), and with w = 1
throughout (no subtree below the siblings) it is recursive rejection sampling. Lossless at every temperature: the
one-step test on prefix tables (tests/test_verification_traversal.py) checks it on static trees, the real loop
on static and dynamic trees, and a variant that keeps the token-wise residual max(0, r - q) is caught.
The walk has 2 N steps for every row's tree (each node entered and left once), so the loop is over steps, never
rows. At temperature 0 it is greedy matching (w is 1 on the argmax path and 0 off it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.block import RESIDUALS, BlockVerification
from specdec.interfaces import AcceptanceStrategy
from specdec.rules import without_token
from specdec.sampling import sample
from specdec.tree import as_rows
from specdec.types import Verdict


@dataclass(frozen=True)
class Traversal(AcceptanceStrategy):
    """Traversal verification of token trees (see the module docstring); on a chain, block verification.

    ``residual="tokenwise"`` updates a given-up node's parent with max(0, r - q) instead of max(0, w r - q): a
    deliberately wrong variant, kept for the tests that must catch it.
    """

    residual: str = "block"
    name: str = "traversal"
    trusted_verdicts: bool = True
    greedy_at_point_masses: bool = True
    judges_trees: bool = True

    def __post_init__(self) -> None:
        if self.residual not in RESIDUALS:
            raise ValueError(f"traversal verification residual must be one of {', '.join(RESIDUALS)}, got "
                             f"{self.residual!r}")

    @property
    def lossless(self) -> bool:
        return self.residual == "block"

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        """A chain is a tree of one child per node: its traversal is block verification."""
        return BlockVerification(self.residual)(draft_tokens, draft_probs, target_probs, generator)

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        return traverse(shape, tokens, draft_probs, target_probs, generator, self.residual == "block")


def traverse(tree, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
             generator: torch.Generator, weighted_residual: bool = True) -> Verdict:
    """The depth-first walk of the module docstring. tokens [B, N], draft_probs [B, I, V] (q at the first I
    positions), target_probs [B, N+1, V]; returns the kept path [B, d] and the next token."""
    batch, num_nodes = tokens.shape
    tree = as_rows(tree, batch)
    rows = torch.arange(batch, device=tokens.device)
    width = tree.children.shape[-1]
    q = draft_probs[:, torch.arange(num_nodes + 1, device=tokens.device).clamp(max=draft_probs.shape[1] - 1)]
    q = q.clone()  # [B, N+1, V]; positions without children read anything, never used
    r = target_probs.clone()  # [B, N+1, V] each position's current target distribution
    w = torch.ones(batch, num_nodes + 1, dtype=target_probs.dtype, device=tokens.device)  # [B, N+1]
    next_slot = torch.zeros(batch, num_nodes + 1, dtype=torch.long, device=tokens.device)  # [B, N+1]
    node = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # [B] where each row's walk stands
    kept = torch.zeros(batch, dtype=torch.long, device=tokens.device)  # [B] the kept node (0: the root)
    done = torch.zeros(batch, dtype=torch.bool, device=tokens.device)  # [B]
    for _ in range(2 * num_nodes):
        slot = next_slot[rows, node]  # [B]
        child = tree.children[rows, node, slot.clamp(max=width - 1)]  # [B]
        entering = (slot < width) & (child >= 0)  # [B]; else the walk leaves ``node`` (never the root here)
        parent = torch.where(entering, node, tree.parent[rows, (node - 1).clamp_min(0)])  # [B] y
        x = torch.where(entering, child, node)  # [B] the node entered or left
        token = tokens[rows, (x - 1).clamp_min(0)]  # [B]
        w_y, r_y, q_y = w[rows, parent], r[rows, parent], q[rows, parent]  # [B], [B, V], [B, V]
        tiny = torch.finfo(q_y.dtype).tiny
        entered_weight = torch.clamp(w_y * r_y[rows, token] / q_y[rows, token].clamp_min(tiny), max=1)  # [B]
        # Entering: the child's weight. Leaving: keep it, or give it up and update its parent.
        uniform = torch.rand(batch, generator=generator, device=tokens.device)  # [B]
        leaving = ~entering & ~done
        keep = leaving & (uniform < w[rows, x])
        give_up = leaving & ~keep
        excess = ((w_y.unsqueeze(1) if weighted_residual else 1) * r_y - q_y).clamp_min(0)  # [B, V]
        mass = (w_y.unsqueeze(1) * r_y - q_y).clamp_min(0).sum(-1)  # [B] Z
        new_w = mass / (mass + 1 - w_y).clamp_min(tiny)  # [B]; 0 where Z = 0
        excess_mass = excess.sum(-1, keepdim=True)  # [B, 1]
        new_r = torch.where(excess_mass > 0, excess / excess_mass.clamp_min(tiny), r_y)  # [B, V] norm(excess)
        if tree.distinct_siblings:
            q[rows, parent] = torch.where(give_up.unsqueeze(1), without_token(q_y, token), q_y)
        w[rows, x] = torch.where(entering, entered_weight, w[rows, x])
        w[rows, parent] = torch.where(give_up, new_w, w[rows, parent])
        r[rows, parent] = torch.where(give_up.unsqueeze(1), new_r, r_y)
        kept = torch.where(keep, x, kept)
        done |= keep
        next_slot[rows, node] = slot + entering.long()
        node = torch.where(entering, child, parent)
    path = tree.ancestors[rows, kept, 1:]  # [B, N] the kept node and its ancestors below the root
    depth_of = torch.where(path, tree.depth, 0)  # [B, N]
    levels = torch.arange(1, len(tree.branching) + 1, device=tokens.device)  # [d]
    positions = torch.arange(1, num_nodes + 1, device=tokens.device)  # [N]
    on_level = depth_of.unsqueeze(1) == levels.view(1, -1, 1)  # [B, d, N]
    path_by_depth = (on_level * positions).amax(-1)  # [B, d] position at each depth, 0 past the end
    next_token = sample(r[rows, kept], generator)  # [B]
    return Verdict((path_by_depth > 0).sum(-1), next_token, path_by_depth)
