"""Verifiers: how a step's target logits become a verdict. A ``Decoder`` chooses one, once, from its parts.

- ``Baseline``: nothing is ever drafted (the drafter ``proposes_nothing``): every strategy reduces to picking the
  next token from p (its argmax at temperature 0), which keeps the baseline's per-token work to the bare minimum.
- ``GreedyMatch``: temperature 0 and a strategy whose rule on point masses is greedy matching: the target's argmax
  is found in one pass over V and matched against the proposed tokens; the emitted tokens are the target's choices.
- ``IdRule``: temperature 0 and a strategy with its own rule on token ids (``judges_ids``, e.g. synthetic).
- ``Distributions``: otherwise: both distributions through the sampling settings, then the strategy's rule.

Each works for any proposal shape through the proposal's layout (``specdec.layout``), and returns a ``Judgement``:
the verdict (with its path) and what the loop and the step log need around it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from specdec.interfaces import AcceptanceStrategy
from specdec.layout import Proposal
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, one_hot_probs, sample, usable
from specdec.types import Verdict


@dataclass(frozen=True)
class Judgement:
    """A step's verdict and what the loop needs around it."""

    verdict: Verdict  # its path always set
    target_usable: torch.Tensor  # [] bool: no NaN/inf in the target logits (checked at the step's sync)
    verdict_in_range: torch.Tensor | None = None  # [] bool: a custom strategy's verdict was in range (None: built in)
    new_tokens: torch.Tensor | None = None  # [B, d+1] the tokens to emit where the verifier has them at hand (greedy
    # matching on a chain: the target's choices); else built from the verdict
    target_probs: torch.Tensor | None = None  # [B, N+1, V] p, where judged on distributions (for the step log)
    target_choice: torch.Tensor | None = None  # [B, N+1] argmax p, where judged on ids (for the step log)
    overlap_is_acceptance: bool = False  # greedy matching: sum_x min(q, p) is 1 exactly where a draft was kept


class Verifier:
    """``verifier(proposal, target_logits [B, N+1, V], generator) -> Judgement``."""

    def __call__(self, proposal: Proposal, target_logits: torch.Tensor, generator: torch.Generator) -> Judgement:
        raise NotImplementedError


class Baseline(Verifier):
    def __init__(self, sampling: SamplingConfig):
        self.sampling = sampling

    def __call__(self, proposal, target_logits, generator) -> Judgement:
        none = proposal.tokens.new_zeros(proposal.tokens.shape[0])  # [B]
        empty_path = proposal.tokens  # [B, 0]
        if self.sampling.is_greedy:
            choice, peaks = greedy_choice(target_logits)  # [B, 1], [B, 1]
            return Judgement(Verdict(none, choice[:, 0], empty_path), finite_peaks(peaks), new_tokens=choice)
        token = sample(logits_to_probs(target_logits[:, 0], self.sampling), generator)  # [B]
        return Judgement(Verdict(none, token, empty_path), usable(target_logits))


class GreedyMatch(Verifier):
    def __call__(self, proposal, target_logits, generator) -> Judgement:
        target_choice, peaks = greedy_choice(target_logits)  # [B, N+1], [B, N+1]
        layout = proposal.layout
        verdict = layout.match_greedily(proposal.tokens, target_choice)
        new_tokens = target_choice if layout.causal else None  # a chain's emitted tokens are the target's choices
        return Judgement(verdict, finite_peaks(peaks), new_tokens=new_tokens, target_choice=target_choice,
                         overlap_is_acceptance=True)


class CheckedVerifier(Verifier):
    """A verifier that calls the strategy's own rule, whose verdict is checked when the strategy is not built in."""

    def __init__(self, strategy: AcceptanceStrategy, sampling: SamplingConfig):
        self.strategy, self.sampling = strategy, sampling
        self.nothing_drafted = Baseline(sampling)  # every rule reduces to picking from p: no rule is asked

    def checked(self, verdict: object, proposal: Proposal, vocab_size: int) -> tuple[Verdict, torch.Tensor | None]:
        """The rule's verdict with its path. A custom strategy's verdict is checked in type, shape and dtype now
        (naming the strategy), and in range on the device: out-of-range values are clamped, so nothing indexes out
        of bounds before the step's sync, which then refuses the step."""
        layout = proposal.layout
        if self.strategy.trusted_verdicts:
            return layout.with_path(verdict), None
        batch, depth = proposal.tokens.shape[0], layout.depth
        if not isinstance(verdict, Verdict):
            raise TypeError(f"strategy {self.strategy.name!r} returned {type(verdict).__name__}; a strategy returns "
                            f"specdec.Verdict(num_accepted [B], next_token [B])")
        expected = {"num_accepted": (batch,), "next_token": (batch,)}
        if verdict.path is not None or not layout.causal:
            expected["path"] = (batch, depth)
        for name, shape in expected.items():
            value = getattr(verdict, name)
            if (not isinstance(value, torch.Tensor) or tuple(value.shape) != shape or value.dtype != torch.long
                    or value.device != proposal.tokens.device):
                shown = (f"shape {tuple(value.shape)}, {value.dtype} on {value.device}" if isinstance(value, torch.Tensor)
                         else repr(value))
                raise ValueError(f"strategy {self.strategy.name!r} returned {name} with {shown}; expected a long "
                                 f"tensor of shape {list(shape)} on {proposal.tokens.device}")
        in_range = ((verdict.num_accepted >= 0) & (verdict.num_accepted <= depth)
                    & (verdict.next_token >= 0) & (verdict.next_token < vocab_size)).all()  # []
        clamped = replace(verdict, num_accepted=verdict.num_accepted.clamp(0, depth),
                          next_token=verdict.next_token.clamp(0, vocab_size - 1))
        if verdict.path is not None:
            in_range &= ((verdict.path >= 0) & (verdict.path <= layout.num_nodes)).all()
            clamped = replace(clamped, path=verdict.path.clamp(0, layout.num_nodes))
        return layout.with_path(clamped), in_range


class IdRule(CheckedVerifier):
    def __call__(self, proposal, target_logits, generator) -> Judgement:
        if not proposal.layout.num_nodes:
            return self.nothing_drafted(proposal, target_logits, generator)
        target_choice, peaks = greedy_choice(target_logits)  # [B, N+1], [B, N+1]
        verdict = proposal.layout.judge_ids(self.strategy, proposal.tokens, target_choice, generator)
        verdict, in_range = self.checked(verdict, proposal, target_logits.shape[-1])
        return Judgement(verdict, finite_peaks(peaks), in_range, target_choice=target_choice)


class Distributions(CheckedVerifier):
    def __call__(self, proposal, target_logits, generator) -> Judgement:
        if not proposal.layout.num_nodes:
            return self.nothing_drafted(proposal, target_logits, generator)
        target_probs = logits_to_probs(target_logits, self.sampling)  # [B, N+1, V]
        draft_probs = proposal.probs
        if draft_probs is None:  # point masses q = onehot(draft)
            draft_probs = one_hot_probs(proposal.tokens, target_probs.shape[-1])  # [B, N, V]
        verdict = proposal.layout.judge(self.strategy, proposal.tokens, draft_probs, target_probs, generator)
        verdict, in_range = self.checked(verdict, proposal, target_logits.shape[-1])
        return Judgement(verdict, usable(target_logits), in_range, target_probs=target_probs)


def choose_verifier(proposes_nothing: bool, strategy: AcceptanceStrategy, sampling: SamplingConfig) -> Verifier:
    """The verifier for these parts (see the module docstring), chosen once per Decoder."""
    if proposes_nothing:
        return Baseline(sampling)
    if sampling.is_greedy and strategy.greedy_at_point_masses:
        return GreedyMatch()
    if sampling.is_greedy and strategy.judges_ids:
        return IdRule(strategy, sampling)
    return Distributions(strategy, sampling)
