"""What a drafter proposes (``Proposal``) and how the target verifies it (``VerifyLayout``), for any proposal shape.

A step feeds the target its queue (the emitted tokens it has not seen: the whole prompt at the first step, then the
last emitted token) and then the proposal's N tokens, all in one forward. The queue's last token is the root
(position 0); the proposed tokens are positions 1..N in breadth-first order, node i sitting ``offsets[i]`` positions
after the root and attending the root and its ancestors. A chain of k drafts is the tree whose node i has node
i - 1 as its parent; a token tree (``specdec.tree``) branches, the same in every row (``TreeLayout``) or its own
in each (``RowTreeLayout``, a dynamic tree). The layout also says how to read the target's verdict back: which
rule of the strategy judges it, the accepted path's tokens, and which fed nodes a cache keeps.
The decode loop and the caches only ever call these methods, so neither asks which shape a proposal has.

Chains keep their fast paths inside ``ChainLayout``: their attention is plain causal attention (``causal``, no
mask to build), and the nodes a cache keeps are a prefix of those fed (a lengths cache keeps them by arithmetic).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.rules import greedy_tree, greedy_verdict
from specdec.tree import RowTree, tree_shape, truncated
from specdec.types import TreeShape, Verdict


class VerifyLayout:
    """How the N proposed tokens of one step relate to each other and to the root (see the module docstring)."""

    depth: int  # d: draft positions (a chain's k, a tree's levels); a verdict's path has d entries
    num_nodes: int  # N
    causal: bool  # the nodes form a chain: causal attention, and kept nodes are a prefix of the fed ones
    measures_overlap: bool  # per-position overlap sum_x min(q, p) is defined (one draft per position)

    def node_offsets(self, device: torch.device) -> torch.Tensor:
        """[N] each node's position after the root (its depth); [B, N] where each row has its own tree."""
        raise NotImplementedError

    def node_attention(self, device: torch.device) -> torch.Tensor | None:
        """[N, N] bool: node i attends node j (j is i or an ancestor of i), [B, N, N] where each row has its own
        tree; None where attention is causal."""
        raise NotImplementedError

    def judge(self, strategy, tokens, draft_probs, target_probs, generator) -> Verdict:
        """The strategy's rule on distributions: draft_probs q, target_probs [B, N+1, V] p at the root and nodes.
        The rule's verdict as it returned it (``with_path`` completes it)."""
        raise NotImplementedError

    def judge_ids(self, strategy, tokens, target_choice, generator) -> Verdict:
        """Temperature 0, a strategy with its own rule on token ids: target_choice [B, N+1] the argmax p."""
        raise NotImplementedError

    def with_path(self, verdict: Verdict) -> Verdict:
        """The verdict with its accepted path (a tree rule gives it; a chain's is 1..k)."""
        return verdict

    def match_greedily(self, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
        """Greedy matching: the longest path whose every token is the target's argmax at its parent."""
        raise NotImplementedError

    def path_tokens(self, tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        """[B, N] proposed tokens, [B, d] path -> [B, d] the tokens along the path."""
        raise NotImplementedError

    def kept_nodes(self, path: torch.Tensor, num_kept: torch.Tensor, num_fed: int) -> torch.Tensor:
        """[B, num_fed] bool: which of the first ``num_fed`` nodes lie on the path's first ``num_kept`` [B] nodes."""
        raise NotImplementedError

    def truncated(self, depth: int) -> VerifyLayout:
        """The first ``depth`` levels (fewer drafts than asked)."""
        raise NotImplementedError


class ChainLayout(VerifyLayout):
    """k drafts in a row: node i is the child of node i - 1."""

    causal = True
    measures_overlap = True

    def __init__(self, k: int):
        self.depth = self.num_nodes = k

    def node_offsets(self, device: torch.device) -> torch.Tensor:
        return torch.arange(1, self.depth + 1, device=device)  # [k]

    def node_attention(self, device: torch.device) -> None:
        return None

    def judge(self, strategy, tokens, draft_probs, target_probs, generator) -> Verdict:
        return strategy(tokens, draft_probs, target_probs, generator)

    def judge_ids(self, strategy, tokens, target_choice, generator) -> Verdict:
        return strategy.verdict_from_ids(tokens, target_choice, generator)

    def match_greedily(self, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
        return self.with_path(greedy_verdict(tokens, target_choice))

    def with_path(self, verdict: Verdict) -> Verdict:
        """The chain's path, 1..k in every row."""
        batch = verdict.num_accepted.shape[0]
        path = torch.arange(1, self.depth + 1, device=verdict.num_accepted.device).expand(batch, -1)  # [B, k]
        return Verdict(verdict.num_accepted, verdict.next_token, path)

    def path_tokens(self, tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        return tokens  # the path is the whole chain

    def kept_nodes(self, path: torch.Tensor, num_kept: torch.Tensor, num_fed: int) -> torch.Tensor:
        return torch.arange(num_fed, device=num_kept.device) < num_kept.unsqueeze(1)  # [B, num_fed]

    def truncated(self, depth: int) -> ChainLayout:
        return ChainLayout(depth)


class TreeLayout(VerifyLayout):
    """A static token tree (``specdec.tree.TreeShape``); the strategy's tree rule judges it."""

    causal = False
    measures_overlap = False

    def __init__(self, shape: TreeShape):
        self.shape = shape  # tensors on the proposal's device
        self.depth = len(shape.branching)
        self.num_nodes = shape.num_nodes

    def node_offsets(self, device: torch.device) -> torch.Tensor:
        return self.shape.depth  # [N]

    def node_attention(self, device: torch.device) -> torch.Tensor:
        return self.shape.ancestors[1:, 1:]  # [N, N]

    def judge(self, strategy, tokens, draft_probs, target_probs, generator) -> Verdict:
        return strategy.judge_tree(self.shape, tokens, draft_probs, target_probs, generator)

    def judge_ids(self, strategy, tokens, target_choice, generator) -> Verdict:
        return strategy.tree_verdict_from_ids(self.shape, tokens, target_choice, generator)

    def match_greedily(self, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
        return greedy_tree(self.shape, tokens, target_choice)

    def path_tokens(self, tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        return tokens_on_path(tokens, path)

    def kept_nodes(self, path: torch.Tensor, num_kept: torch.Tensor, num_fed: int) -> torch.Tensor:
        return nodes_on_path(path, num_kept, self.num_nodes)[:, :num_fed]

    def truncated(self, depth: int) -> TreeLayout:
        return self if depth >= self.depth else TreeLayout(truncated(self.shape, depth))


class RowTreeLayout(VerifyLayout):
    """A tree per batch row (``specdec.tree.RowTree``): every row has N nodes, each its own shape. The strategy's
    tree rule judges it as it judges a static tree."""

    causal = False
    measures_overlap = False

    def __init__(self, tree: RowTree):
        self.tree = tree  # tensors on the proposal's device
        self.depth = len(tree.branching)
        self.num_nodes = tree.num_nodes

    def node_offsets(self, device: torch.device) -> torch.Tensor:
        return self.tree.depth  # [B, N]

    def node_attention(self, device: torch.device) -> torch.Tensor:
        return self.tree.ancestors[:, 1:, 1:]  # [B, N, N]

    def judge(self, strategy, tokens, draft_probs, target_probs, generator) -> Verdict:
        return strategy.judge_tree(self.tree, tokens, draft_probs, target_probs, generator)

    def judge_ids(self, strategy, tokens, target_choice, generator) -> Verdict:
        return strategy.tree_verdict_from_ids(self.tree, tokens, target_choice, generator)

    def match_greedily(self, tokens: torch.Tensor, target_choice: torch.Tensor) -> Verdict:
        return greedy_tree(self.tree, tokens, target_choice)

    def path_tokens(self, tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
        return tokens_on_path(tokens, path)

    def kept_nodes(self, path: torch.Tensor, num_kept: torch.Tensor, num_fed: int) -> torch.Tensor:
        return nodes_on_path(path, num_kept, self.num_nodes)[:, :num_fed]


def tokens_on_path(tokens: torch.Tensor, path: torch.Tensor) -> torch.Tensor:
    """[B, N] proposed tokens, [B, d] path -> [B, d] the tokens along it; past the path's end: anything."""
    return tokens.gather(1, (path - 1).clamp_min(0))


def nodes_on_path(path: torch.Tensor, num_kept: torch.Tensor, num_nodes: int) -> torch.Tensor:
    """[B, N] bool: the nodes among the path's [B, d] first ``num_kept`` [B]."""
    within = torch.arange(path.shape[1], device=path.device) < num_kept.unsqueeze(1)  # [B, d]
    marks = torch.zeros(path.shape[0], num_nodes + 1, dtype=torch.long, device=path.device)
    on_path = marks.scatter_add_(1, path, within.long()) > 0  # [B, N+1]; entries past the end add nothing
    return on_path[:, 1:]


def tree_layout(branching: tuple[int, ...], device: torch.device) -> TreeLayout:
    """The layout of the static tree ``branching`` with its tensors on ``device``."""
    return TreeLayout(tree_shape(branching).on(device))


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one step: N tokens and how they are laid out (a chain of N by default)."""

    tokens: torch.Tensor  # [B, N] long
    probs: torch.Tensor | None  # the draft distributions q the tokens were drawn from: [B, k, V] for a chain, [B, I, V]
    # at each internal position of a tree (``TreeShape.num_internal``; a per-row tree's: [B, N+1, V] at every
    # position, read where a node has children); None for point masses q = onehot(token)
    # (n-gram drafts; model drafts at temperature 0)
    finite: torch.Tensor | None = None  # [] bool: False if draft logits were unusable; checked at the step sync
    layout: VerifyLayout | None = None  # None: a chain of the N tokens

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, torch.Tensor) or self.tokens.dim() != 2:
            shown = tuple(self.tokens.shape) if isinstance(self.tokens, torch.Tensor) else type(self.tokens).__name__
            raise ValueError(f"Proposal tokens must be a tensor of shape [B, N] (N drafted tokens per row), got {shown}")
        if self.layout is None:
            object.__setattr__(self, "layout", ChainLayout(self.tokens.shape[1]))
