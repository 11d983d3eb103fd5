"""Shared types and the notation used across specdec.

Notation (Leviathan et al. 2023): ``p`` is the **target** distribution, ``q`` the **draft** distribution.
Code spells them out as ``target_probs`` and ``draft_probs``.

Shapes: ``B`` batch rows, ``k`` draft tokens proposed this step, ``V`` vocabulary size.
A step feeds the target ``k + 1`` tokens (the last emitted token and the ``k`` drafts) and gets ``k + 1``
distributions: position ``i < k`` verifies draft token ``i``; position ``k`` gives the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one step."""

    tokens: torch.Tensor  # [B, k] long
    probs: torch.Tensor | None  # [B, k, V] draft distributions q, or None for point masses q = onehot(tokens)
    # (n-gram drafts; model drafts at temperature 0)
    finite: torch.Tensor | None = None  # [] bool: False if draft logits were unusable (``sampling.usable``);
    # checked at the step sync
    tree: TreeShape | None = None  # a token tree: tokens [B, N] are its nodes, probs [B, I, V] the draft
    # distributions each internal position's children were drawn from (``TreeShape.num_internal``)


@dataclass(frozen=True)
class Verdict:
    """What an acceptance strategy decides for one step."""

    num_accepted: torch.Tensor  # [B] long in [0, k]: leading draft tokens kept
    next_token: torch.Tensor  # [B] long: the token emitted after the kept drafts (correction or bonus)


@dataclass(frozen=True)
class StepOutcome:
    """What one step decided, for drafters and policies to learn from (``Drafter.commit``, ``observe``)."""

    k: int  # drafts proposed this step
    num_accepted: torch.Tensor  # [B] drafts kept per row
    next_token: torch.Tensor  # [B] token emitted after the kept drafts
    new_tokens: torch.Tensor  # [B, k+1] kept drafts then next_token; only the first num_new are real
    num_new: torch.Tensor  # [B] tokens emitted this step (0 for rows already finished)
    active: torch.Tensor  # [B] bool, rows still generating during this step
    active_after: torch.Tensor  # [B] bool, rows still generating after it (the others leave the batch or feed holes)
    max_accepted: int  # host copies over active rows
    min_accepted: int
    draft_seconds: float
    target_seconds: float
    path: torch.Tensor | None = None  # trees: [B, d] positions of the accepted nodes (``TreeVerdict.path``)


@dataclass(frozen=True)
class TreeShape:
    """A static token tree: each node at depth i - 1 has ``branching[i - 1]`` children, so there are
    N = b1 + b1 b2 + ... nodes over d = len(branching) levels. Positions: 0 is the root (the last committed token),
    1..N the nodes in breadth-first order (the children of one parent are consecutive, parents in order).
    Build with ``specdec.tree.tree_shape``; the tensors live on CPU and ``on(device)`` moves them."""

    branching: tuple[int, ...]
    parent: torch.Tensor  # [N] position (0..N) of each node's parent
    depth: torch.Tensor  # [N] depth of each node, 1..d
    children: torch.Tensor  # [N+1, b_max] position of the s-th child of each position, -1 where none
    ancestors: torch.Tensor  # [N+1, N+1] bool: position i attends position j (j is i or an ancestor of i)

    @property
    def num_nodes(self) -> int:
        return self.parent.shape[0]

    @property
    def num_internal(self) -> int:
        """Positions that have children: the root and every node above the last level (the first ones)."""
        return self.num_nodes + 1 - self.level_sizes[-1]

    @property
    def level_sizes(self) -> tuple[int, ...]:
        sizes, width = [], 1
        for b in self.branching:
            width *= b
            sizes.append(width)
        return tuple(sizes)

    @property
    def depth_offsets(self) -> torch.Tensor:
        """[N+1] each position's depth below the root (0 for the root): its position after the root's."""
        return torch.cat([torch.zeros_like(self.depth[:1]), self.depth])

    def on(self, device: torch.device) -> TreeShape:
        return TreeShape(self.branching, *(t.to(device) for t in (self.parent, self.depth, self.children,
                                                                 self.ancestors)))


@dataclass(frozen=True)
class TreeVerdict(Verdict):
    """What a strategy decides for one tree: ``num_accepted`` [B] is the depth of the accepted path, ``next_token``
    [B] the token after it, and ``path`` [B, d] the positions (1..N) of the path's nodes by depth; entries past
    num_accepted are 0 (the root) and mean nothing."""

    path: torch.Tensor  # [B, d]
