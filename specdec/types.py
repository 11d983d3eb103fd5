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
from typing import NamedTuple

import torch

POSITIONS = ("emitted", "last")


@dataclass(frozen=True)
class Verdict:
    """What an acceptance strategy decides for one step.

    A chain rule may leave ``path`` None; the proposal's layout (``specdec.layout``) fills it in, so the loop always
    sees the accepted path."""

    num_accepted: torch.Tensor  # [B] long in [0, d]: proposed tokens kept (the accepted path's depth)
    next_token: torch.Tensor  # [B] long: the token emitted after the kept ones (correction or bonus)
    path: torch.Tensor | None = None  # [B, d] positions (1..N) of the accepted path's nodes by depth; entries past
    # num_accepted mean nothing (a chain's path is 1..k)


class ModelOutput(NamedTuple):
    """What a forward through a cache returns (``KVCache.feed``)."""

    logits: torch.Tensor  # [B, m, V] at the logit columns asked for
    hidden: torch.Tensor | None = None  # [B, n, H, D] the hidden states asked for at every fed column; None: none


@dataclass(frozen=True)
class StateRequest:
    """Which of the target's hidden states a drafter reads (``Drafter.target_states``); the step hands them to its
    ``commit`` as ``StepOutcome.target_states``.

    ``layers``: indices into the target's hidden states as transformers' ``output_hidden_states`` numbers them
    (0 the embeddings' output, i the output of block i, L the final norm's output: the LM head's input), negative
    ones counting from L + 1 (-1 is L). ``positions``: "emitted" gives every position the step fed whose token and
    next token were both emitted (with the prefill's step, the prompt's): EAGLE's inputs; "last" only the position
    whose distribution gave the step's next token: Medusa's."""

    layers: tuple[int, ...] = (-1,)
    positions: str = "emitted"

    def __post_init__(self) -> None:
        if self.positions not in POSITIONS:
            raise ValueError(f"positions must be one of {', '.join(POSITIONS)}, got {self.positions!r}")
        layers = self.layers
        if (not isinstance(layers, tuple) or not layers
                or not all(isinstance(i, int) and not isinstance(i, bool) for i in layers)):
            raise ValueError(f"layers must be a non-empty tuple of integers (hidden-state indices), got {layers!r}")

    def resolved(self, num_layers: int) -> tuple[int, ...]:
        """The layers as indices in [0, num_layers], in the order asked, for a target of ``num_layers`` blocks."""
        resolved = tuple(i + num_layers + 1 if i < 0 else i for i in self.layers)
        if not all(0 <= i <= num_layers for i in resolved) or len(set(resolved)) != len(resolved):
            raise ValueError(f"layers {list(self.layers)} must be distinct hidden-state indices in "
                             f"[-{num_layers + 1}, {num_layers}] for a target of {num_layers} blocks")
        return resolved


@dataclass(frozen=True)
class TargetStates:
    """The target's hidden states a drafter asked for (``StateRequest``), at the positions of one step, each with the
    token that follows it. Valid entries end each row, as a queue's do (left padding)."""

    hidden: torch.Tensor  # [B, W, H, D] the layers asked for, in their order (W = 1 for positions="last")
    next_tokens: torch.Tensor  # [B, W] the token that follows each position
    valid: torch.Tensor  # [B, W] bool


@dataclass(frozen=True)
class StepOutcome:
    """What one step decided, for drafters and policies to learn from (``Drafter.commit``, ``observe``), and for
    each context to roll back to (``CachedContext.commit``). Where the host read the step (``host``), the bounds
    below are exact; where it read nothing (the device step), they are the widest the step allows."""

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
    target_states: TargetStates | None = None  # the target's hidden states the drafter asked for; None: none asked

    @property
    def all_active_after(self) -> bool:
        """Every batch row still generates after the step, as the host read (False where it read nothing)."""
        return self.host is not None and self.host.num_active == self.num_new.shape[0]

    @property
    def most_drafts_emitted(self) -> int:
        """No row emitted more of its drafts than this."""
        return self.k if self.host is None else max(self.host.max_new - 1, 0)

    @property
    def fewest_drafts_emitted(self) -> int:
        """Every row emitted at least this many of its drafts (rows that finished before the step count 0)."""
        return 0 if self.host is None else max(self.host.min_new - 1, 0)


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
    remaining: tuple[int, ...]  # [B'] each row's budget left after the step (0: the row is done)
    kept: tuple[int, ...]  # [B'] drafts each row kept, -1 where the row did not generate; () where none was drafted
