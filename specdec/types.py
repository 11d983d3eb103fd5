"""Shared types and the notation used across specdec.

Notation (Leviathan et al. 2023): ``p`` is the **target** distribution, ``q`` the **draft** distribution.
Code spells them out as ``target_probs`` and ``draft_probs``.

Shapes: ``B`` batch rows, ``k`` draft tokens proposed this step, ``V`` vocabulary size; a token tree has ``N``
nodes over ``d`` levels (a chain: N = d = k). A step feeds the target the last emitted token (the root, position
0) and the N proposed tokens (positions 1..N) and gets N + 1 distributions: position i's distribution verifies
the children of position i; a chain's position k gives the bonus token. Words the code coins (hole, queue, root,
region, ...) are defined in docs/glossary.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    """What an acceptance strategy decides for one step.

    A chain rule may leave ``path`` None; the proposal's layout (``specdec.layout``) fills it in, so the loop always
    sees the accepted path."""

    num_accepted: torch.Tensor  # [B] long in [0, d]: proposed tokens kept (the accepted path's depth)
    next_token: torch.Tensor  # [B] long: the token emitted after the kept ones (correction or bonus)
    path: torch.Tensor | None = None  # [B, d] positions (1..N) of the accepted path's nodes by depth; entries past
    # num_accepted mean nothing (a chain's path is 1..k)


@dataclass(frozen=True)
class StepOutcome:
    """What one step decided, for drafters and policies to learn from (``Drafter.commit``, ``observe``)."""

    k: int  # draft positions proposed this step (a tree's levels)
    layout: VerifyLayout  # how the proposal was laid out (``specdec.layout``)
    num_accepted: torch.Tensor  # [B] drafts kept per row
    next_token: torch.Tensor  # [B] token emitted after the kept drafts
    path: torch.Tensor  # [B, k] positions (1..N) of the accepted path's nodes (a chain: 1..k)
    new_tokens: torch.Tensor  # [B, k+1] kept drafts then next_token; only the first num_new are real
    num_new: torch.Tensor  # [B] tokens emitted this step (0 for rows already finished)
    active: torch.Tensor  # [B] bool, rows still generating during this step
    active_after: torch.Tensor  # [B] bool, rows still generating after it (the others leave the batch or feed holes)
    host: HostSync | None  # the step's host copies; None where the step runs on the device and reads none
    draft_seconds: float
    target_seconds: float


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
class HostSync:
    """The scalars the host reads after a step (one device-to-host copy), where the loop reads them."""

    remaining_max: int  # largest budget left over active rows; 0 ends the call
    room_min: int  # smallest context room left over active rows (bounds the next k; k_max when it cannot bind)
    num_active: int  # rows still generating after the step
    max_accepted: int  # over the rows generating during the step (0 when nothing was drafted)
    min_accepted: int
    max_new: int  # tokens emitted this step, over all rows (bounds the rollback)
    min_new: int
