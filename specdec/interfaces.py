"""The three kinds of parts the decode loop takes, each declaring everything it may do, with defaults.

- ``AcceptanceStrategy``: decides how many drafts to keep and which token comes next (``specdec.strategies``).
- ``Drafter``: proposes tokens and learns what was kept (``specdec.drafters``, ``specdec.ngram``, ...).
- ``DraftLengthPolicy``: chooses k before each step and may stop a draft part way (``specdec.policies``).

A part subclasses its interface and overrides what it does; the loop reads the declared capabilities
(``greedy_at_point_masses``, ``judges_ids``, ``requires_greedy``, ``proposes_nothing``, ``selects_rows``,
``drafts_trees``, ``drafts_on_device``, ``trusted_proposals``, ``target_states``, ``bounds_context``,
``stops_drafts``, ``adapts``, ``models``) and never probes. Shapes and notation are those of ``specdec.types``; the
words the code coins are in docs/glossary.md.

Where to add a part: a strategy subclasses ``AcceptanceStrategy`` (``__call__`` on a chain; ``judge_tree`` for
trees); a drafter that runs a cached model subclasses ``specdec.drafters.CachedDrafter`` and writes ``draft``;
any other drafter subclasses ``Drafter``.
"""

from __future__ import annotations

from typing import Callable

import torch

from specdec.layout import Proposal
from specdec.sampling import SamplingConfig
from specdec.types import StateRequest, StepOutcome, TreeShape, Verdict

StopHook = Callable[[torch.Tensor, torch.Tensor], bool]  # the token just drafted [B], its draft logits [B, V] -> stop now?


class AcceptanceStrategy:
    """``strategy(draft_tokens [B, k], draft_probs [B, k, V], target_probs [B, k+1, V], generator) -> Verdict``.

    Both distributions have been through ``sampling.logits_to_probs`` with the same settings; row k of
    ``target_probs`` is for the bonus token. Strategies hold parameters only, never state.

    At temperature 0 both distributions are point masses, and the loop never builds [B, k+1, V] one-hot tensors:
    a strategy whose rule there is greedy matching declares ``greedy_at_point_masses`` and the loop matches token
    ids itself; a strategy with another rule on point masses declares ``judges_ids`` and gives
    ``verdict_from_ids`` (and ``tree_verdict_from_ids``); any other is called with point masses.

    A strategy that ``judges_trees`` also has a rule for token trees (``specdec.tree``): ``judge_tree`` with
    distributions. A strategy that ``requires_greedy`` decodes the target's argmax and refuses temperature > 0.
    """

    name: str = "custom"
    lossless: bool = False
    greedy_at_point_masses: bool = False  # on point masses the rule keeps drafts while they equal the argmax
    judges_trees: bool = False
    requires_greedy: bool = False  # only meaningful at temperature 0 (greedy verification)
    trusted_verdicts: bool = False  # its verdicts need no checking (the built-in strategies); others are checked

    def __call__(
        self, draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
        generator: torch.Generator,
    ) -> Verdict:
        raise NotImplementedError

    @property
    def judges_ids(self) -> bool:
        """Whether the strategy is judged on token ids at temperature 0 (greedy matching or its own id rule)."""
        return self.greedy_at_point_masses

    def verdict_from_ids(
        self, draft_tokens: torch.Tensor, target_choice: torch.Tensor, generator: torch.Generator
    ) -> Verdict:
        """Temperature 0: draft_tokens [B, k], target_choice [B, k+1] the target's argmax at each position."""
        raise NotImplementedError(f"strategy {self.name!r} declares judges_ids but has no verdict_from_ids")

    def judge_tree(
        self, shape: TreeShape, tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
        generator: torch.Generator,
    ) -> Verdict:
        """tokens [B, N] the nodes, draft_probs [B, I, V] q at each internal position, target_probs [B, N+1, V];
        the verdict's ``path`` [B, d] holds the accepted nodes' positions."""
        raise NotImplementedError(f"strategy {self.name!r} has no rule for token trees")

    def tree_verdict_from_ids(
        self, shape: TreeShape, tokens: torch.Tensor, target_choice: torch.Tensor, generator: torch.Generator
    ) -> Verdict:
        """Temperature 0, for a strategy that ``judges_ids`` with its own rule: target_choice [B, N+1]."""
        raise NotImplementedError(f"strategy {self.name!r} declares judges_ids but has no tree_verdict_from_ids")


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

    ``start`` sees the prompt; ``propose(k, sampling, generator, stop)`` returns only the new tokens (and their
    distributions where it has them) as a ``Proposal``, a chain of up to k tokens unless it says otherwise in
    the proposal's layout (``specdec.layout``; k = 0 asks for nothing, an empty proposal); ``commit(outcome)``
    learns what was kept. A drafter that holds a KV cache owns it and rolls it back in ``commit``, its one place to
    do so; ``release`` frees what it keeps between calls (static caches, compiled forwards).

    ``stop(token [B], draft_logits [B, V]) -> bool``, when given, is asked after each drafted token but the last
    with that token and the draft logits it came from (before sampling settings); on True the drafter returns the
    tokens so far (at least one). The loop stops a draft once every generating row has drafted an EOS, and where
    the policy ``stops_drafts``. Drafters that draft all tokens at once (n-gram, trees) may ignore it.

    Capabilities: ``proposes_nothing`` (the baseline: the loop never drafts, k is always 0); ``selects_rows`` (can
    keep only some batch rows, ``select_rows``: the loop then drops rows that finished; otherwise they stay and
    feed holes); ``drafts_trees`` (proposes token trees, which need a strategy with a tree rule and an eager loop);
    ``drafts_on_device`` (proposes and commits without host reads, its state updated in place: it can run in the
    device step); ``trusted_proposals`` (specdec's own drafters: their proposals are not checked each step);
    ``needs_pair`` (built from a loaded model pair by ``from_pair``); ``target_states`` (the target's hidden states
    it reads, a ``StateRequest``: the verification returns them and ``commit`` receives them in
    ``outcome.target_states``; None, the default, costs nothing).
    ``bounds_context`` (its models' positions bound how long a row may grow, as the target's do; False for a
    drafter that keeps its own context within them).
    """

    name: str = "custom"
    num_forwards: int = 0  # draft forward passes since ``start`` (for the cost ratio)
    proposes_nothing: bool = False
    selects_rows: bool = False
    drafts_trees: bool = False
    drafts_on_device: bool = False
    trusted_proposals: bool = False
    needs_pair: bool = False
    target_states: StateRequest | None = None
    bounds_context: bool = True

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", **options) -> "Drafter":
        """The factory the experiment configs name: this drafter for a loaded ``pair`` (``specdec.ModelPair``:
        draft, target, tokenizer) with the run's ``compile`` and ``forward`` switches (``specdec.cache.CachedModel``)
        and the config's options. By default the drafter takes its options alone."""
        cls.check_options(compile=compile, forward=forward, **options)
        return cls(**options)

    @classmethod
    def reads_draft_model(cls, **options) -> bool:
        """Whether ``from_pair`` with these options drafts with the pair's draft model: a pair of a target alone
        (``load_pair(target=DIR)``) has none, so such a drafter is refused for it before any model loads."""
        return False

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", **options) -> None:
        """Refuse bad options before any model loads (ValueError / TypeError naming the option). By default a
        drafter that needs no pair is built once and dropped; one that needs a pair checks nothing here."""
        if not cls.needs_pair:
            cls(**options)

    def models(self) -> list[torch.nn.Module]:
        """The models it runs, checked by the loop like the target (eval mode, context limit)."""
        return []

    def check_target(self, target: torch.nn.Module) -> None:
        """Refuse, in one line, a target this drafter cannot draft for (the Decoder asks before any work)."""

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

    def release(self) -> None:
        """Free what the drafter keeps between calls; nothing by default."""

    def fix_shapes(self, slots: int) -> None:
        """Make room for ``slots`` cache slots now and keep every step's shapes fixed from here on (called after
        ``start`` by the device step, whose captured steps replay one set of shapes and cannot grow a cache);
        nothing by default."""

    def device_state(self) -> dict[str, torch.Tensor]:
        """A drafter that ``drafts_on_device``: the tensors its part of a captured step reads from the step before,
        by name; none by default."""
        return {}

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors (a kept capture's), holding this call's values; nothing by default."""


class DraftLengthPolicy:
    """Answers ``next_k()`` before each step and learns from ``observe(outcome)`` after it.

    ``max_k`` is the largest k it will ever ask for (it sizes per-position statistics); ``start`` resets it at
    the start of each ``generate`` call. ``outcome.k`` is the number of tokens actually drafted, which can be
    less than asked; ``next_k() == 0`` makes the step a plain decode step. A policy that ``stops_drafts`` is asked
    ``should_stop(draft_probs [B, V], active [B])`` after each drafted token but the last; that costs one host sync
    per drafted token, so others pay nothing. ``bind`` shows it the models a speculating ``Decoder`` runs, once;
    ``select_rows`` narrows what it keeps per row when finished rows leave the batch; ``step_costs`` reports what
    a policy that models step costs predicted and measured over the last call. ``measuring`` is True while the
    policy spends its steps measuring the machine rather than choosing (a calibration under way, which a call's end
    interrupted): a bench's warm-up decodes on until it is False, so that timed calls time the policy's choices.
    """

    name: str = "custom"
    stops_drafts: bool = False
    adapts: bool = True  # k may change between steps from what the policy observes (False: one fixed k)

    @property
    def measuring(self) -> bool:
        return False

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

    def bind(self, target: torch.nn.Module, drafter: Drafter, forward: str) -> None:
        """Called once by a ``Decoder`` that speculates with this policy: the target, the drafter and the forward
        ("auto", "lean", "transformers") it runs them with. Nothing by default."""

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] of what it tracks per row (called where finished rows leave the
        batch, after the step's ``observe``). Nothing by default."""

    def step_costs(self) -> tuple[float, float] | None:
        """(modelled, measured) mean seconds per step over the last call's decode steps, for a policy that models
        step costs; None by default."""
        return None
