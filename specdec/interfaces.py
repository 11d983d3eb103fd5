"""The three kinds of parts the decode loop takes, each declaring everything it may do, with defaults.

- ``AcceptanceStrategy``: decides how many drafts to keep and which token comes next (``specdec.strategies``).
- ``Drafter``: proposes tokens and learns what was kept (``specdec.drafters``, ``specdec.ngram``, ...).
- ``DraftLengthPolicy``: chooses k before each step and may stop a draft part way (``specdec.policies``).

A part subclasses its interface and overrides what it does; the loop reads the declared capabilities
(``greedy_at_point_masses``, ``judges_ids``, ``selects_rows``, ``stops_drafts``, ``models``) and never probes.
Shapes and notation are those of ``specdec.types``.
"""

from __future__ import annotations

from typing import Callable

import torch

from specdec.sampling import SamplingConfig
from specdec.tree import greedy_tree
from specdec.types import Proposal, StepOutcome, TreeShape, TreeVerdict, Verdict

StopHook = Callable[[torch.Tensor, torch.Tensor], bool]  # the token just drafted [B], its draft logits [B, V] -> stop now?


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


class AcceptanceStrategy:
    """``strategy(draft_tokens [B, k], draft_probs [B, k, V], target_probs [B, k+1, V], generator) -> Verdict``.

    Both distributions have been through ``sampling.logits_to_probs`` with the same settings; row k of
    ``target_probs`` is for the bonus token. Strategies hold parameters only, never state.

    At temperature 0 both distributions are point masses, and a strategy that ``judges_ids`` gives its verdict
    from token ids with ``verdict_from_ids`` instead, so the loop never builds [B, k+1, V] one-hot tensors. By
    default that is so exactly when the rule on point masses is greedy matching (``greedy_at_point_masses``);
    a strategy with another rule on point masses overrides both.

    A strategy that ``judges_trees`` also has a rule for token trees (``specdec.tree``): ``judge_tree`` with
    distributions, and ``tree_verdict_from_ids`` at temperature 0 (greedy matching by default).
    """

    name: str = "custom"
    lossless: bool = False
    greedy_at_point_masses: bool = False  # on point masses the rule keeps drafts while they equal the argmax
    judges_trees: bool = False

    def __call__(
        self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
        generator: torch.Generator,
    ) -> Verdict:
        raise NotImplementedError

    @property
    def judges_ids(self) -> bool:
        """Whether ``verdict_from_ids`` is this strategy's verdict at temperature 0."""
        return self.greedy_at_point_masses

    def verdict_from_ids(
        self, draft_tokens: torch.Tensor, target_choice: torch.Tensor, generator: torch.Generator
    ) -> Verdict:
        """Temperature 0: draft_tokens [B, k], target_choice [B, k+1] the target's argmax at each position."""
        return greedy_verdict(draft_tokens, target_choice)

    def judge_tree(
        self, shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
        generator: torch.Generator,
    ) -> TreeVerdict:
        """tokens [B, N] the nodes, draft_probs [B, I, V] q at each internal position, target_probs [B, N+1, V]."""
        raise NotImplementedError(f"strategy {self.name!r} has no rule for token trees")

    def tree_verdict_from_ids(
        self, shape: TreeShape, tokens: torch.Tensor, target_choice: torch.Tensor, generator: torch.Generator
    ) -> TreeVerdict:
        """Temperature 0: tokens [B, N], target_choice [B, N+1] the target's argmax at each position."""
        return greedy_tree(shape, tokens, target_choice)


class CallableStrategy(AcceptanceStrategy):
    """A plain callable used as a strategy: declares nothing, so it is always called with distributions."""

    def __init__(self, rule: Callable[..., Verdict]):
        self.rule = rule
        self.name = str(getattr(rule, "name", type(rule).__name__))  # read once, here, from a foreign object
        self.lossless = bool(getattr(rule, "lossless", False))

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        return self.rule(draft_tokens, draft_probs, target_probs, generator)

    def __repr__(self) -> str:
        return repr(self.rule)


def as_strategy(strategy: object) -> AcceptanceStrategy:
    """A strategy as the loop takes it: an ``AcceptanceStrategy`` as is, any other callable wrapped."""
    if isinstance(strategy, AcceptanceStrategy):
        return strategy
    if callable(strategy):
        return CallableStrategy(strategy)
    raise TypeError(f"strategy must be an acceptance strategy (specdec.Speculative(), ...), got {strategy!r}")


class Drafter:
    """Proposes tokens each step; learns from each step's outcome.

    ``start`` sees the prompt; ``propose(k, sampling, generator, stop)`` returns only the new tokens [B, k] (and
    their distributions where it has them); ``commit(outcome)`` learns what was kept. A drafter that holds a KV
    cache owns it and rolls it back in ``commit``, its one place to do so.

    ``stop(token [B], draft_logits [B, V]) -> bool``, when given, is asked after each drafted token but the last
    with that token and the draft logits it came from (before sampling settings); on True the drafter returns the
    tokens so far (at least one). The loop stops a draft once every generating row has drafted an EOS, and where
    the policy ``stops_drafts``. Drafters that draft all tokens at once (n-gram, trees) may ignore it.

    A drafter that ``selects_rows`` can keep only some batch rows (``select_rows``): the loop then drops rows
    that finished from the batch. Otherwise finished rows stay in the batch and feed holes. A drafter that
    ``drafts_trees`` proposes token trees (``Proposal.tree``); the loop then verifies them under an ancestor mask
    and asks the strategy's tree rule.
    """

    name: str = "custom"
    num_forwards: int = 0  # draft forward passes since ``start`` (for the cost ratio)
    selects_rows: bool = False
    drafts_trees: bool = False
    needs_pair: bool = False  # built from a loaded model pair (``from_pair``), not from its options alone

    @classmethod
    def from_pair(cls, pair, compile: bool = False, **options) -> "Drafter":
        """The factory the experiment configs name: this drafter for a loaded ``pair`` (``specdec.ModelPair``:
        draft, target, tokenizer) with the run's ``compile`` switch and the config's options. By default the
        drafter takes its options alone."""
        cls.check_options(compile=compile, **options)
        return cls(**options)

    @classmethod
    def check_options(cls, compile: bool = False, **options) -> None:
        """Refuse bad options before any model loads (ValueError / TypeError naming the option). By default a
        drafter that needs no pair is built once and dropped; one that needs a pair checks nothing here."""
        if not cls.needs_pair:
            cls(**options)

    def models(self) -> list[torch.nn.Module]:
        """The models it runs, checked by the loop like the target (eval mode, context limit)."""
        return []

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        raise NotImplementedError

    def propose(
        self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None = None
    ) -> Proposal:
        raise NotImplementedError

    def commit(self, outcome: StepOutcome) -> None:
        raise NotImplementedError

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B']; called only where ``selects_rows``."""
        raise NotImplementedError(f"{type(self).__name__} keeps every batch row (selects_rows is False)")


class DraftLengthPolicy:
    """Answers ``next_k()`` before each step and learns from ``observe(outcome)`` after it.

    ``max_k`` is the largest k it will ever ask for (it sizes per-position statistics); ``start`` resets it at
    the start of each ``generate`` call. ``outcome.k`` is the number of tokens actually drafted, which can be
    less than asked. A policy that ``stops_drafts`` is asked ``should_stop(draft_probs [B, V], active [B])``
    after each drafted token but the last; that costs one host sync per drafted token, so others pay nothing.
    """

    name: str = "custom"
    stops_drafts: bool = False

    @property
    def max_k(self) -> int:
        raise NotImplementedError

    def start(self) -> None:
        """Nothing to reset by default."""

    def next_k(self) -> int:
        raise NotImplementedError

    def observe(self, outcome: StepOutcome) -> None:
        """Nothing to learn by default."""

    def should_stop(self, draft_probs: torch.Tensor, active: torch.Tensor) -> bool:
        return False
