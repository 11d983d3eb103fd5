"""Draft-length policies: how many tokens the drafter proposes at each step.

The interface, with the optional early stop (``stops_drafts``/``should_stop``), is
``specdec.interfaces.DraftLengthPolicy``. The loop still shrinks ``k`` near ``max_new_tokens`` and the context limit,
so a policy never needs to know about either.

Policies: ``FixedLength`` (k every step), ``HeuristicLength`` (transformers' +2 / -1 rule), ``ConfidenceLength``
(draft until the draft is unsure), ``CostOptimalLength`` (maximise the predicted speedup from running estimates).
Adaptive policies reset their state in ``start``, so every ``generate`` call begins from the same settings.
"""

from __future__ import annotations

import math

import torch

from specdec.checks import check_draft_length, check_positive, check_probability
from specdec.interfaces import DraftLengthPolicy
from specdec.stats import predicted_speedup
from specdec.types import StepOutcome


class FixedLength(DraftLengthPolicy):
    """Always propose ``k`` tokens."""

    name = "fixed"
    adapts = False

    def __init__(self, k: int = 4):
        self.k = check_draft_length("k", k)

    @property
    def max_k(self) -> int:
        return self.k

    def next_k(self) -> int:
        return self.k


class HeuristicLength(DraftLengthPolicy):
    """transformers' assisted-generation schedule: k <- k + 2 after a fully accepted draft, else k - 1.

    k starts at ``k0`` and stays in [k_min, k_max]. With a batch, a draft counts as fully accepted when every row
    that was generating kept all of it (``outcome.host.min_accepted == outcome.k``): one rejecting row shrinks k for
    all, since the shared k costs every row the same draft forwards. Steps that drafted nothing leave k as is.
    """

    name = "heuristic"

    def __init__(self, k0: int = 4, k_min: int = 1, k_max: int = 16):
        self.k0 = check_draft_length("k0", k0)
        self.k_min = check_draft_length("k_min", k_min)
        self.k_max = check_draft_length("k_max", k_max)
        if not self.k_min <= self.k0 <= self.k_max:
            raise ValueError(f"need k_min <= k0 <= k_max, got k_min={k_min}, k0={k0}, k_max={k_max}")
        self.start()

    @property
    def max_k(self) -> int:
        return self.k_max

    def start(self) -> None:
        self.k = self.k0
        self.history: list[int] = []  # k drafted at each step of the current call

    def next_k(self) -> int:
        return self.k

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.k == 0:
            return
        self.history.append(outcome.k)
        fully_accepted = outcome.host.min_accepted >= outcome.k
        self.k = min(self.k + 2, self.k_max) if fully_accepted else max(self.k - 1, self.k_min)


class ConfidenceLength(DraftLengthPolicy):
    """Dynamic lookahead: draft up to ``k_max`` tokens, stopping after a token whose draft is unsure.

    After drafting token i (i < k_max) the draft stops when no generating row is confident, i.e. when
    max_x q_i(x) < threshold for every active row, where q_i = softmax(draft logits) before the sampling settings
    (so the rule also works at temperature 0). transformers' ``assistant_confidence_threshold`` (default 0.4)
    judges the drafted token's probability instead, which is the same under greedy drafting. At least one token
    is always drafted. Drafters without distributions (n-gram) never stop early.
    """

    name = "confidence"
    stops_drafts = True

    def __init__(self, threshold: float = 0.4, k_max: int = 8):
        self.threshold = check_probability("threshold", threshold)
        self.k_max = check_draft_length("k_max", k_max)
        self.start()

    @property
    def max_k(self) -> int:
        return self.k_max

    def start(self) -> None:
        self.history: list[int] = []  # k drafted at each step of the current call

    def next_k(self) -> int:
        return self.k_max

    def should_stop(self, draft_probs: torch.Tensor, active: torch.Tensor) -> bool:
        confident = draft_probs.amax(-1) >= self.threshold  # [B]
        return not bool((confident & active).any())

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.k:
            self.history.append(outcome.k)


TIE_TOLERANCE = 1e-9  # relative: predicted speedups closer than this count as equal


class CostOptimalLength(DraftLengthPolicy):
    """Each step choose k in [k_min, k_max] maximising the predicted speedup from running estimates of a and c.

    a (per-token acceptance): the i.i.d. model behind the formula makes each verified draft position a
    Bernoulli(a) trial, and a step with n of k drafts kept has n successes in n + [n < k] trials. a is the ratio
    of exponentially weighted sums of successes and trials over active rows (decay ``decay`` per step), seeded
    with ``prior_weight`` trials at ``prior_acceptance``. (Accepted / drafted would underestimate a: positions
    after the first rejection are never tried.)
    c (cost ratio): exponentially weighted mean of (draft_seconds / k) / target_seconds per step, seeded with
    ``prior_cost_ratio``; steps without timings leave it unchanged.
    Near-ties go to the smaller k. k_min >= 1: at k = 0 nothing would be measured and the policy could never recover.
    Reading the step's accepted counts costs one host sync per step. ``chosen_k`` records each ``next_k`` answer,
    ``history`` the k actually drafted, ``estimates`` the (a, c) each choice was made from.
    """

    name = "cost_optimal"

    def __init__(
        self,
        k_max: int = 8,
        prior_acceptance: float = 0.7,
        prior_cost_ratio: float = 0.1,
        k_min: int = 1,
        decay: float = 0.9,
        prior_weight: float = 4.0,
    ):
        self.k_max = check_draft_length("k_max", k_max)
        self.k_min = check_draft_length("k_min", k_min)
        if self.k_min > self.k_max:
            raise ValueError(f"need k_min <= k_max, got k_min={k_min}, k_max={k_max}")
        self.prior_acceptance = check_probability("prior_acceptance", prior_acceptance)
        self.prior_cost_ratio = check_positive("prior_cost_ratio", prior_cost_ratio, allow_zero=True)
        self.decay = check_probability("decay", decay, high_open=True)
        self.prior_weight = check_positive("prior_weight", prior_weight)
        self.start()

    @property
    def max_k(self) -> int:
        return self.k_max

    def start(self) -> None:
        self.successes = self.prior_acceptance * self.prior_weight  # weighted accepted positions
        self.trials = self.prior_weight  # weighted verified positions
        self.cost_ratio = self.prior_cost_ratio
        self.chosen_k: list[int] = []
        self.history: list[int] = []
        self.estimates: list[tuple[float, float]] = []

    @property
    def acceptance(self) -> float:
        return self.successes / self.trials

    def best_k(self, acceptance: float, cost_ratio: float) -> int:
        """argmax over k in [k_min, k_max] of the predicted speedup; the smallest k within a relative 1e-9 of it
        (longer drafts whose gain is rounding noise, e.g. a^12 at a = 0.05, are not worth drafting)."""
        speedups = {k: predicted_speedup(acceptance, k, cost_ratio) for k in range(self.k_min, self.k_max + 1)}
        best = max(speedups.values())
        return min(k for k, speedup in speedups.items() if speedup >= best * (1 - TIE_TOLERANCE))

    def next_k(self) -> int:
        k = self.best_k(self.acceptance, self.cost_ratio)
        self.estimates.append((self.acceptance, self.cost_ratio))
        self.chosen_k.append(k)
        return k

    def observe(self, outcome: StepOutcome) -> None:
        k = outcome.k
        if k == 0:
            return
        self.history.append(k)
        accepted = outcome.num_accepted * outcome.active  # [B]
        rejected = (outcome.num_accepted < k) & outcome.active  # [B] rows whose trials ended in a rejection
        successes, rejections = torch.stack([accepted.sum(), rejected.sum()]).tolist()
        self.successes = self.decay * self.successes + successes
        self.trials = self.decay * self.trials + successes + rejections
        if outcome.target_seconds > 0 and math.isfinite(outcome.draft_seconds):
            step_ratio = outcome.draft_seconds / k / outcome.target_seconds
            self.cost_ratio = self.decay * self.cost_ratio + (1 - self.decay) * step_ratio
