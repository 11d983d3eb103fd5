"""Acceptance strategies: pure, batched functions of one step's drafts and distributions.

Every strategy is called as ``strategy(draft_tokens, draft_probs, target_probs, generator) -> Verdict`` with

    draft_tokens  [B, k]       long, the proposal
    draft_probs   [B, k, V]    q, the draft distributions the tokens were drawn from (point masses if none)
    target_probs  [B, k+1, V]  p, the target distributions; row k is for the bonus token

and returns ``Verdict(num_accepted [B], next_token [B])``. Both distributions have already been through
``sampling.logits_to_probs`` with the same settings. Strategies hold parameters only, never state.

The interface, and what a strategy declares about temperature 0, is ``specdec.interfaces.AcceptanceStrategy``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specdec.block import BlockVerification
from specdec.checks import check_draft_length, check_positive, check_probability, check_strategy_object
from specdec.interfaces import AcceptanceStrategy, as_strategy
from specdec.rules import (
    at_parents, count_leading_true, first_accepted_path, greedy_tree, greedy_verdict, node_probs, nodewise_tree,
    probs_of, row_at, speculative_tree,
)
from specdec.sampling import sample
from specdec.traversal import Traversal
from specdec.tree import as_rows
from specdec.types import Verdict


def sample_at_first_rejection(
    target_probs: torch.Tensor, num_accepted: torch.Tensor, generator: torch.Generator
) -> torch.Tensor:
    """The next token of a lossy rule: a sample of p at the first rejected position (or the bonus position)."""
    return sample(row_at(target_probs, num_accepted), generator)  # [B]


@dataclass(frozen=True)
class Greedy(AcceptanceStrategy):
    """Accept draft token i while it equals argmax p_i; emit argmax p at the first mismatch.

    Equals the target's own greedy decoding (lossless at temperature 0, the only setting it allows).
    """

    name: str = "greedy"
    trusted_verdicts: bool = True
    lossless: bool = True
    greedy_at_point_masses: bool = True
    judges_trees: bool = True
    requires_greedy: bool = True

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        return greedy_verdict(draft_tokens, target_probs.argmax(-1))

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        return greedy_tree(shape, tokens, target_probs.argmax(-1))


@dataclass(frozen=True)
class Speculative(AcceptanceStrategy):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    Accept x_i ~ q_i with probability min(1, p_i(x_i) / (l * q_i(x_i))); at the first rejection emit a sample of
    norm(max(0, p_i - q_i)). After k acceptances the bonus token is a sample of p_k. With lenience l = 1 the
    emitted tokens are distributed exactly as p; l < 1 (Leviathan appendix A.5) accepts more and is lossy.
    Padding q with a zero row at position k makes the bonus the residual max(0, p_k - 0) = p_k: one code path.
    """

    lenience: float = 1.0
    name: str = "speculative"
    trusted_verdicts: bool = True
    greedy_at_point_masses: bool = True  # q(x) = 1 always accepts where p(x) = 1; the residual is p itself
    judges_trees: bool = True

    def __post_init__(self) -> None:
        check_probability("lenience", self.lenience, low_open=True)  # 1 is exact speculative sampling

    @property
    def lossless(self) -> bool:
        return self.lenience == 1

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        p_of_draft = probs_of(target_probs[:, :-1], draft_tokens)  # [B, k]
        q_of_draft = probs_of(draft_probs, draft_tokens)  # [B, k]
        uniform = torch.rand(p_of_draft.shape, generator=generator, device=p_of_draft.device)  # [B, k]
        # u < p / (l q), written without division; strict so that p = 0 is never accepted.
        num_accepted = count_leading_true(uniform * self.lenience * q_of_draft < p_of_draft)  # [B]
        padded_q = torch.nn.functional.pad(draft_probs, (0, 0, 0, 1))  # [B, k+1, V], zero row at k
        residual = (row_at(target_probs, num_accepted) - row_at(padded_q, num_accepted)).clamp_min(0)  # [B, V]
        # Rounding can leave no residual mass where p == q; p itself is the exact limit there.
        has_mass = residual.sum(-1, keepdim=True) > 0  # [B, 1]
        residual = torch.where(has_mass, residual, row_at(target_probs, num_accepted))
        next_token = sample(residual, generator)  # [B]; sample normalises
        return Verdict(num_accepted, next_token)

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        """SpecInfer's multi-step speculative sampling (``specdec.tree.speculative_tree``), with this lenience."""
        return speculative_tree(shape, tokens, draft_probs, target_probs, generator, self.lenience)


@dataclass(frozen=True)
class Typical(AcceptanceStrategy):
    """Typical acceptance (Medusa, Cai et al. 2024): accept x_i while p_i(x_i) > min(epsilon, delta exp(-H(p_i))).

    Lossy. The next token is a sample of p at the first rejected (or bonus) position. At temperature 0 p is a
    point mass with H = 0, so the rule accepts exactly the argmax (greedy decoding), unless min(epsilon, delta)
    reaches 1 and it accepts nothing.
    """

    epsilon: float = 0.09
    delta: float = 0.3
    name: str = "typical"
    trusted_verdicts: bool = True
    lossless: bool = False
    judges_trees: bool = True

    def __post_init__(self) -> None:
        check_probability("epsilon", self.epsilon, low_open=True)
        check_positive("delta", self.delta)

    @property
    def greedy_at_point_masses(self) -> bool:
        return min(self.epsilon, self.delta) < 1

    def threshold(self, target_probs: torch.Tensor) -> torch.Tensor:
        """[..., V] p -> [...] acceptance threshold min(epsilon, delta exp(-H(p)))."""
        entropy = torch.special.entr(target_probs).sum(-1)  # [...], 0 log 0 = 0
        return torch.clamp(self.delta * torch.exp(-entropy), max=self.epsilon)

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        verify_probs = target_probs[:, :-1]  # [B, k, V]
        accepted = probs_of(verify_probs, draft_tokens) > self.threshold(verify_probs)  # [B, k]
        num_accepted = count_leading_true(accepted)
        return Verdict(num_accepted, sample_at_first_rejection(target_probs, num_accepted, generator))

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        """Each node by the same test against p at its parent; the first path accepted node by node."""
        accepted = node_probs(target_probs, tokens, shape) > at_parents(self.threshold(target_probs), shape)  # [B, N]
        return nodewise_tree(shape, accepted, target_probs, generator)


@dataclass(frozen=True)
class TopK(AcceptanceStrategy):
    """Accept x_i while it is among the n most likely tokens of p_i (and p_i(x_i) > 0). Lossy.

    The next token is a sample of p at the first rejected (or bonus) position. At temperature 0 only the argmax
    has mass, so the rule reduces to greedy decoding.
    """

    n: int = 5
    name: str = "topk"
    trusted_verdicts: bool = True
    lossless: bool = False
    greedy_at_point_masses: bool = True
    judges_trees: bool = True

    def __post_init__(self) -> None:
        check_draft_length("topk strategy n", self.n)

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        verify_probs = target_probs[:, :-1]  # [B, k, V]
        nth_largest = verify_probs.topk(min(self.n, verify_probs.shape[-1]), dim=-1).values[..., -1]  # [B, k]
        p_of_draft = probs_of(verify_probs, draft_tokens)  # [B, k]
        num_accepted = count_leading_true((p_of_draft >= nth_largest) & (p_of_draft > 0))
        return Verdict(num_accepted, sample_at_first_rejection(target_probs, num_accepted, generator))

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        """Each node by the same test against p at its parent; the first path accepted node by node."""
        nth_largest = target_probs.topk(min(self.n, target_probs.shape[-1]), dim=-1).values[..., -1]  # [B, N+1]
        p_of_node = node_probs(target_probs, tokens, shape)  # [B, N]
        accepted = (p_of_node >= at_parents(nth_largest, shape)) & (p_of_node > 0)
        return nodewise_tree(shape, accepted, target_probs, generator)


@dataclass(frozen=True)
class SyntheticAcceptance(AcceptanceStrategy):
    """Accept draft token i with probability a_i, whatever the tokens; for benchmarks only.

    The schedule: ``acceptance`` at every position; or decaying, a_i = acceptance * decay^(i-1) (vLLM's synthetic
    acceptance that falls with draft position); or a list, a_i its i-th entry (the last repeated past its end), to
    match a real pair's measured per-position profile. num_accepted = the leading successes of Bernoulli(a_i)
    trials, so P(n >= i) = a_1 ... a_i (Leviathan's i.i.d. model where a_i is constant). A tree's node at depth i
    is accepted with probability a_i, each on its own. The next token is the target's at the first rejection (or
    the bonus position): its argmax at temperature 0, judged from token ids like greedy verification; a sample of
    p otherwise. Lossy by design: the cost of speculation on given shapes depends only on how many drafts are
    accepted, so this measures a system at a controlled acceptance (vLLM benchmarks with the same rule).
    """

    acceptance: float | tuple[float, ...] = 0.7
    decay: float = 1.0
    name: str = "synthetic"
    trusted_verdicts: bool = True
    lossless: bool = False
    judges_ids = True  # at temperature 0 its own rule on ids (verdict_from_ids), not greedy matching
    judges_trees: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.acceptance, Sequence) and not isinstance(self.acceptance, (str, bytes)):
            if not len(self.acceptance):
                raise ValueError("synthetic acceptance must be a rate in [0, 1] or a non-empty list of them (one per "
                                 "draft position), got []")
            listed = tuple(check_probability(f"synthetic acceptance at position {i}", rate)
                           for i, rate in enumerate(self.acceptance, start=1))
            object.__setattr__(self, "acceptance", listed)  # a config's list, as a tuple (hashable, frozen)
            if self.decay != 1:
                raise ValueError(f"synthetic acceptance decay={self.decay!r} applies to a single rate; a list already "
                                 f"gives each position its own")
        else:
            check_probability("synthetic acceptance", self.acceptance)
        check_probability("synthetic acceptance decay", self.decay, low_open=True)

    def rates(self, positions: int, device: torch.device) -> torch.Tensor:
        """[positions] a_1 .. a_positions (device ops only, so a captured step can replay them)."""
        position = torch.arange(positions, device=device)  # [positions]
        if isinstance(self.acceptance, tuple):
            listed = torch.stack([torch.full((), rate, device=device) for rate in self.acceptance])  # [L]
            return listed[position.clamp(max=len(self.acceptance) - 1)]
        return self.acceptance * self.decay ** position.float()

    def num_accepted(self, draft_tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        uniform = torch.rand(draft_tokens.shape, generator=generator, device=draft_tokens.device)  # [B, k]
        return count_leading_true(uniform < self.rates(draft_tokens.shape[1], draft_tokens.device))  # [B]

    def verdict_from_ids(self, draft_tokens, target_choice, generator) -> Verdict:
        """Temperature 0: target_choice [B, k+1] is the target's argmax at each position."""
        num_accepted = self.num_accepted(draft_tokens, generator)  # [B]
        return Verdict(num_accepted, target_choice.gather(1, num_accepted.unsqueeze(1)).squeeze(1))

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        num_accepted = self.num_accepted(draft_tokens, generator)  # [B]
        return Verdict(num_accepted, sample_at_first_rejection(target_probs, num_accepted, generator))

    def accepted_nodes(self, tree, tokens: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """[B, N] each node accepted with the rate of its depth, on its own."""
        depth = as_rows(tree, tokens.shape[0]).depth  # [B, N]
        rate = self.rates(len(tree.branching), tokens.device)[depth - 1]  # [B, N]
        return torch.rand(tokens.shape, generator=generator, device=tokens.device) < rate

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator) -> Verdict:
        return nodewise_tree(shape, self.accepted_nodes(shape, tokens, generator), target_probs, generator)

    def tree_verdict_from_ids(self, shape, tokens, target_choice, generator) -> Verdict:
        num_accepted, path, end = first_accepted_path(shape, self.accepted_nodes(shape, tokens, generator))
        return Verdict(num_accepted, target_choice.gather(1, end.unsqueeze(1)).squeeze(1), path)


STRATEGIES = {
    "greedy": Greedy,
    "speculative": Speculative,
    "typical": Typical,
    "topk": TopK,
    "synthetic": SyntheticAcceptance,
    "block": BlockVerification,
    "traversal": Traversal,
}


def make_strategy(strategy: str | AcceptanceStrategy, **params) -> AcceptanceStrategy:
    """A strategy by name (with its parameters), or an already built one (a plain callable is wrapped)."""
    if not isinstance(strategy, str):
        check_strategy_object(strategy)
        return as_strategy(strategy)
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; known strategies: {', '.join(STRATEGIES)}")
    return STRATEGIES[strategy](**params)
