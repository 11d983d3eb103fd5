"""Draft-length policies: how many tokens the drafter proposes at each step.

The interface, with the optional early stop (``stops_drafts``/``should_stop``), is
``specdec.interfaces.DraftLengthPolicy``. The loop still shrinks ``k`` near ``max_new_tokens`` and the context limit,
so a policy never needs to know about either.

Policies: ``FixedLength`` (k every step), ``HeuristicLength`` (transformers' +2 / -1 rule), ``ConfidenceLength``
(draft until the draft is unsure), ``CostOptimalLength`` (the k, 0 included, of the most expected tokens per second
for the batch as it is now, from costs measured on this machine and running acceptance per row).
Adaptive policies reset their state in ``start``, so every ``generate`` call begins from the same settings.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import torch
import transformers

from specdec.checks import check_draft_length, check_positive, check_probability
from specdec.costs import CostModel, CostTable, measure_costs
from specdec.interfaces import DraftLengthPolicy
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


TIE_TOLERANCE = 1e-9  # relative: predicted rates closer than this count as equal
COST_DECAY = 0.8  # per-step forgetting factor of the online corrections to the cost model
CALIBRATED_K = 3  # the longest draft whose verification the calibration times in the loop: where a choice is close
# (drafting barely pays, at batch 16 and more) it is among k = 0-3; longer drafts are priced on from k = 3 at the
# calibrated price of a token more (``calibrated``); one row is not calibrated (``CostOptimalLength``)
EXPLORE_BUDGET = 0.005  # the share of the time the explorations may cost where drafting does not pay, as measured
EXPLORE_MAX = 16  # ... and they come at least once in this many times explore_every plain steps


class RateTerms(NamedTuple):
    """What a step's expected rate needs of the rows generating (``CostOptimalLength.rate_terms``)."""

    tokens: np.ndarray  # [k_max+1] tokens a step drafting k emits, summed over the rows
    deviation: np.ndarray  # [k_max+1] s_k / sqrt(m_k): the sd of the tokens a row gains in the R / m_k steps it
    # needs for R tokens is deviation sqrt(R), and its tail is z deviation / sqrt(R) steps per step


class CostOptimalLength(DraftLengthPolicy):
    """Each step, the k in [0, k_max] that maximises the batch's expected tokens per second as it is now:

        k* = argmax_k  sum_r E(a_r, k) / (step(B', k) + tail(k)),    E(a, k) = sum_{i=0..k} a^i

    over the rows r generating, with a_r each row's running acceptance, and step(B', k) the seconds of a step that
    drafts k over the B' rows the forwards compute (``specdec.costs``): k draft forwards (the first catching up on
    two tokens), the target's verification of k + 1 tokens per row, and the loop's overhead. tail(k) is each step's
    share of the steps the batch's last row adds: drafting makes the rows' progress uneven (sd s_k of a row's tokens
    per step), a call lasts until its last row is done, and with R tokens left to the row furthest behind, the
    slowest of R' generating rows needs about z(R') s_k sqrt(R / m_k) / m_k steps more than the mean row (m_k its
    mean tokens per step, z(R') the expected largest of R' standard normals; 0 for one row), each run by the few
    rows left, step(1, k):

        tail(k) = z(R') s_k step(1, k) / sqrt(R m_k)

    Without it, the per-step model was right to 2% at batch 16 and still chose k = 3 where k = 2 decoded faster, and
    k = 1 where no draft did: every fixed k lost 9-11% there to its call's tail against the per-step prediction. A
    plain step's rows stay even (s_0 = 0). k = 0 is a plain decode step (B' tokens per step); a k > 0 is
    taken only where it beats k = 0 by the relative ``margin``, so that the policy is not slower than decoding
    without a draft by more than the cost model's error. After ``explore_interval`` - 1 plain decode steps in a row
    (at first ``explore_every`` - 1; counted across calls) the next step drafts one token anyway, so that
    acceptance and the draft's cost stay measured (a choice of 0 from stale estimates would never be revisited),
    and the next one too, whose draft cost is learned from (never a call's first step, whose wall time is the
    prefill's). The exploration's cost is measured: its two steps' wall time beyond what plain steps take for the
    tokens they emitted (the mean row's), c plain steps. The interval to the next is c / ``EXPLORE_BUDGET`` plain
    steps, so that where drafting does not pay the explorations cost about 0.5% of the time, within
    [``explore_every``, ``EXPLORE_MAX`` x ``explore_every``]; where drafting pays an exploration costs nothing and
    they come every ``explore_every``.
    (At batch 64, T = 1, an exploration cost 1.4-1.6 plain steps, most of it the draft's first forward catching up
    on every token the plain steps emitted. An interval doubled at each exploration and reset by any step that
    drafted by choice explored again about 16 steps into each call: a call's last row, alone, drafts by choice.)
    As the batch grows the target's verification costs grow with B' (k + 1), and the choice shortens to k = 0; as
    rows finish and leave, it lengthens again.

    The costs: ``costs`` (a ``specdec.costs.CostModel``), or, where None, measured by ``specdec.costs.measure_costs``
    from the models the ``Decoder`` shows it (``bind``) when it first meets a batch larger than it has measured:
    the target's forward of 1..k_max + 1 tokens per row and the draft's of one, at 1, 2, 4, ... rows (a second or
    two for the embedded pair on a CPU, in the first call). A drafter without a single causal LM to time (n-gram,
    EAGLE and Medusa heads) has its cost per drafted token learned from the steps instead. The model is then
    corrected online from the step timings the loop takes: the target's and the draft's measured over modelled
    seconds, and the loop's overhead per step as the step's wall time beyond its forwards, apart for plain and for
    drafting steps (a drafting step also runs the acceptance rule, sampling's included: at T = 1 and batch 16, one
    overhead for both made k = 1 look faster than the plain loop, which it was not), each an exponentially weighted
    mean (``COST_DECAY`` per step) started at its first observation.

    The shape of the target's table, what a token more a row costs, is also measured in the loop, where a close choice
    turns on it: at batch 16, T = 1, start-up tables priced the second token a row at 12-31% of the first in
    different processes, the loop's own steps at 23-28% in each, and the policy drafted k = 1, 2, 3 or nothing as its
    table had it (docs/load.md). The chosen steps cannot measure it: a width priced too high is never chosen, so
    never corrected (per-width corrections from chosen steps, tried twice, followed that selection). So, from the
    second step of its first call at a batch size, the policy takes ``calibration_rounds`` rounds of steps drafting
    k = 0, 1, ..., min(k_max, ``CALIBRATED_K``), one of each per round, and replaces the table's shape at the rows
    fed by the median over the rounds of each width's verification seconds over the plain step's of the same round
    (paired, so that the machine's drifts cancel), wider drafts priced on at its price of a token more
    (``calibrated``). Its plain steps measure a plain step's overhead too. The calibration's steps emit tokens as any
    step does; they cost what their k loses against the best. It runs only at steps that feed more than one row: at
    one row drafting pays by far, the choice is among long drafts whose prices dip beyond 4 tokens a row (the
    embedded target's 5-token forward cheaper than its 4-token one), and calibrated to k = 3 and priced on from
    there, the policy drafted k = 3 at 1.24x where fixed k = 4 ran 1.33x (T = 1); calibrated to one past the k it
    would choose, it ran 0.79 of fixed k = 4 in one process (greedy; cause not found). There a plain step's overhead
    is taken to be a drafting step's until a plain step is observed. These corrections describe the machine, and the
    batch's acceptance the pair on its data: both carry across calls (the prior seeds the first), so a call
    does not start by drafting from the prior again; each call's rows start from the batch's acceptance.

    Acceptance: a step in which a row kept n of k drafts is n successes in n + [n < k] Bernoulli(a) trials (the
    positions after the first rejection are never tried). The batch's a is the ratio of exponentially weighted
    (``batch_decay`` per step) successes to trials, seeded with ``prior_weight`` trials at ``prior_acceptance``;
    each row's a_r is its own weighted counts (``decay`` per step) shrunk towards the batch's by ``prior_weight``
    trials of it. The two time scales keep a row responsive while the batch's a stays steady: at batch 1, where
    the batch is the row, one time scale let a few rejections in a row pull a to near 0, and the plain steps chosen
    then observe nothing to pull it back (sampled at T = 1, such a policy drafted nothing on half its steps).

    The step's per-row counts come from the loop's one host read of the step (``HostSync``). The arithmetic is
    numpy's on the host, and of the rows it needs only what the power sums of their acceptances give
    (``rate_terms``), kept while they hold: where the policy decodes plain, a step's choice is a few operations on
    vectors of k_max + 1 (with torch's operations on [R, k_max + 1] each step, ``next_k`` took 300 µs at batch 64
    and the target's next forward ran 0.6 ms slower). ``chosen_k`` records each ``next_k`` answer;
    ``step_costs()`` the mean modelled and measured seconds per decode step of the last call. Tree drafters are
    modelled as chains of their depth.
    """

    name = "cost_optimal"

    def __init__(
        self,
        k_max: int = 8,
        prior_acceptance: float = 0.7,
        decay: float = 0.9,
        batch_decay: float = 0.99,
        prior_weight: float = 4.0,
        margin: float = 0.02,
        costs: CostModel | None = None,
        repeats: int = 3,
        explore_every: int = 16,
        calibration_rounds: int = 16,
    ):
        self.k_max = check_draft_length("k_max", k_max)
        self.prior_acceptance = check_probability("prior_acceptance", prior_acceptance)
        self.decay = check_probability("decay", decay, high_open=True)
        self.batch_decay = check_probability("batch_decay", batch_decay, high_open=True)
        self.prior_weight = check_positive("prior_weight", prior_weight)
        self.margin = check_positive("margin", margin, allow_zero=True)
        if costs is not None and not isinstance(costs, CostModel):
            raise TypeError(f"costs must be a specdec.costs.CostModel or None (measured), got {type(costs).__name__}")
        self.repeats = check_draft_length("repeats", repeats)
        self.explore_every = check_draft_length("explore_every", explore_every)
        self.calibration_rounds = check_draft_length("calibration_rounds", calibration_rounds)
        self.costs = costs
        self.measure: Callable[[int], CostModel] | None = None  # set by ``bind``: times the models at a batch size
        self.target_scale = self.draft_scale = 1.0  # measured / modelled seconds of each model's forwards
        self.overheads: list[float | None] = [None, None]  # the loop's seconds per step beyond its forwards:
        # [plain step, drafting step], None until a step of the kind is observed
        self.schedule_calibration()
        self.explore_interval = explore_every  # plain steps in a row before one drafts to explore
        self.plain_steps = 0  # plain decode steps chosen in a row, across calls: at batch 1 a call of 64 tokens is
        # 64 steps, and counted per call, an interval backed off past it never came, and a policy that had
        # stopped drafting decoded 8191 of 8192 steps plain, at 0.95x where fixed k = 4 ran 1.9x
        self.learned_draft_step = 0.0  # seconds per drafted token, for a drafter without a timed model
        self.successes = self.prior_acceptance * self.prior_weight  # weighted accepted positions, all rows
        self.trials = self.prior_weight  # weighted verified positions, all rows
        self.call_rows = 1  # the last call's batch size: the rows a call's first choice assumes
        self.call_remaining = math.inf  # the tokens left to the last call's rows after its first step, about
        self.positions = np.arange(k_max + 1, dtype=np.float64)  # [k_max+1] the draft positions 0..k_max
        self.orders = np.arange(2 * k_max + 1, dtype=np.float64)  # [2 k_max+1] the powers ``power_sums`` sums
        self.pair_orders = np.add.outer(np.arange(1, k_max + 1), np.arange(1, k_max + 1))  # [k_max, k_max] i + j
        self.looked_up: dict[int, tuple[np.ndarray, np.ndarray | None]] = {}  # ``table_seconds``'s, by rows
        self.looked_up_in: CostModel | None = None  # the cost model they were looked up in
        self.tail_table = np.zeros(0)  # ``tail_factors``'
        self.start()

    @property
    def max_k(self) -> int:
        return self.k_max

    @property
    def measuring(self) -> bool:
        """A calibration begun and not yet done."""
        return bool(self.calibration_seconds) and bool(self.calibration)

    def bind(self, target: torch.nn.Module, drafter, forward: str) -> None:
        """Keep how to measure the costs (where none were given): the target and the drafter's one causal LM."""
        if self.costs is not None and self.costs.draft is not None:
            return
        models = drafter.models()
        draft = models[0] if len(models) == 1 and models[0] is not target and is_causal_lm(models[0]) else None
        k_max, repeats = self.k_max, self.repeats

        def measure(batch_size: int) -> CostModel:
            return measure_costs(target, draft, batch_size, k_max, repeats, forward)

        self.measure = measure  # a closure: a deep copy of the policy shares it, never copying the models

    def schedule_calibration(self) -> None:
        """Take the calibration's steps from the next step after a call's first on, and forget any earlier one's."""
        self.calibration = list(range(min(self.k_max, CALIBRATED_K) + 1)) * self.calibration_rounds  # ks still to
        # draft, in order: rounds of k = 0..K
        self.calibration_seconds: list[float] = []  # the target's seconds in each calibration step taken, NaN where
        # not timed, the loop drafted another k (it shortens drafts near the end), or the rows fed were other than
        self.calibration_rows = 0  # ... the first calibration step's: the rows whose table it corrects
        self.calibrating: int | None = None  # the k of the calibration step asked for; None: not calibrating

    def start(self) -> None:
        self.row_successes = self.row_trials = None  # [B'] per row, from the call's first step on
        self.row_terms: RateTerms | None = None  # ``row_rate_terms``', None once they change
        self.steady_terms: RateTerms | None = None  # ``steady_rate_terms``', likewise
        self.generating: np.ndarray | None = None  # [B'] bool, rows that generate in the next step
        self.first_step = True
        self.rows_fed = self.call_rows  # rows the next step's forwards compute
        self.remaining = self.call_remaining  # tokens left to the row furthest behind (inf: unknown, no tail)
        self.rows_left: np.ndarray | None = None  # [R] tokens left to each generating row (None: all at remaining)
        self.step_started = math.nan
        self.chosen_k: list[int] = []
        self.modelled: list[float] = []  # per decode step: the model's seconds for the k it chose
        self.measured: list[float] = []  # per decode step: the step's wall seconds
        self.pending_model = math.nan
        self.exploring = False  # the step asked for explores
        self.explore_again = False  # the next step is an exploration's second
        self.explore_excess = 0.0  # the exploration's steps so far: their wall time beyond their tokens', in plain
        # steps (an exploration the call's end cut short is not counted)

    @property
    def acceptance(self) -> float:
        return self.successes / self.trials

    def row_acceptances(self) -> np.ndarray:
        """[R] the running acceptance of each row generating (the prior's rows before the call's first step)."""
        pooled = self.acceptance
        if self.row_successes is None:
            rows = self.rows_fed if self.generating is None else int(self.generating.sum())
            return np.full(rows, pooled)
        rows = (self.row_successes + self.prior_weight * pooled) / (self.row_trials + self.prior_weight)  # [B']
        return rows[self.generating]

    def table_seconds(self, rows: int) -> tuple[np.ndarray, np.ndarray | None]:
        """The cost model's verification of k = 0..k_max drafts and their draft forwards (``draft_chain``; None: no
        draft table) at ``rows`` rows, looked up once per row count and cost model."""
        costs = self.costs
        if self.looked_up_in is not costs:
            self.looked_up, self.looked_up_in = {}, costs
        if rows not in self.looked_up:
            self.looked_up[rows] = (np.array([costs.verify(k, rows) for k in range(self.k_max + 1)]),
                                    np.array([costs.draft_chain(k, rows) for k in range(self.k_max + 1)])
                                    if costs.draft is not None else None)
        return self.looked_up[rows]

    def forward_seconds(self, k: int, rows: int) -> float:
        """The model's seconds of a step's forwards at ``rows`` rows drafting k, with the online corrections."""
        return float(self.all_forward_seconds(rows)[k])

    def all_forward_seconds(self, rows: int) -> np.ndarray:
        """[k_max+1] ``forward_seconds`` of k = 0..k_max."""
        verify, drafts = self.table_seconds(rows)
        draft = self.positions * self.learned_draft_step if drafts is None else self.draft_scale * drafts
        return draft + self.target_scale * verify

    def step_seconds(self, k: int, rows: int) -> float:
        return self.forward_seconds(k, rows) + self.overhead(k)

    def all_step_seconds(self, rows: int) -> np.ndarray:
        """[k_max+1] ``step_seconds`` of k = 0..k_max."""
        seconds = self.all_forward_seconds(rows) + self.overhead(1)
        seconds[0] += self.overhead(0) - self.overhead(1)
        return seconds

    def overhead(self, k: int) -> float:
        """The loop's seconds beyond the forwards of a step drafting k: that kind's estimate, else the other's, else
        0."""
        own, other = self.overheads[k > 0], self.overheads[k == 0]
        return own if own is not None else other if other is not None else 0.0

    def power_sums(self, acceptances: np.ndarray) -> np.ndarray:
        """[2 k_max + 1] S_j = sum_r a_r^j over the rows' ``acceptances`` [R]: all that ``rates`` needs of them."""
        return (acceptances[:, None] ** self.orders).sum(0)

    def row_rate_terms(self) -> RateTerms:
        """``rate_terms`` of the rows generating, kept until a drafting step, a row finishing or leaving changes
        them: where the policy decodes plain, a step's choice then computes a few operations on [k_max + 1]
        vectors."""
        if self.row_terms is None:
            self.row_terms = self.rate_terms(self.power_sums(self.row_acceptances()))
        return self.row_terms

    def steady_rate_terms(self) -> RateTerms:
        """``rate_terms`` of as many rows at the batch's steady acceptance, kept as ``row_rate_terms`` are (only a
        drafting step changes that acceptance)."""
        if self.steady_terms is None:
            rows = self.row_rate_terms().tokens[0]  # S_0 = R
            self.steady_terms = self.rate_terms(rows * self.acceptance ** self.orders)
        return self.steady_terms

    def rates(self, acceptances: np.ndarray, rows: int) -> np.ndarray:
        """[k_max + 1] expected tokens per second of a step drafting k = 0..k_max, for rows generating at
        ``acceptances`` [R] while the forwards compute ``rows`` rows, the call's tail included."""
        return self.rates_of_terms(self.rate_terms(self.power_sums(acceptances)), self.all_step_seconds(rows))

    def rate_terms(self, sums: np.ndarray) -> RateTerms:
        """What ``rates`` needs of the rows, from their acceptances' ``power_sums``: [k_max+1] each, the tokens a
        step drafting k emits, summed over the rows, and the mean row's deviation, s_k sqrt(R / sum_r E(a_r, k)) (the
        tail from it, the rows left and the last row's step: ``rates_of_terms``). Per row, with J the drafts kept of k
        (a^j = P(J >= j)): E(a, k) = 1 + E[J] = sum_{j<=k} a^j, E[J^2] = sum_{j=1..k} (2j-1) a^j and
        E[J]^2 = sum_{i,j=1..k} a^(i+j); summed over rows, each a^n becomes S_n."""
        generating = sums[0]  # R
        firsts = sums[:self.k_max + 1]  # [k_max+1] S_0..S_k_max
        tokens = firsts.cumsum()  # [k_max+1] sum_r E(a_r, k)
        if generating <= 1:  # one row has no tail (z(1) = 0): its spread is never asked for
            return RateTerms(tokens, np.zeros(self.k_max + 1))
        kept_squared = ((2 * self.positions - 1) * firsts).cumsum() + generating  # [k_max+1] sum_r E[J_r^2]
        squared_means = np.zeros(self.k_max + 1)  # [k_max+1] sum_r E[J_r]^2: S_{i+j} over the k x k block
        squared_means[1:] = sums[self.pair_orders].cumsum(0).cumsum(1).diagonal()
        variance = np.maximum(kept_squared - squared_means, 0) / generating  # [k_max+1] the mean row's Var J
        return RateTerms(tokens, np.sqrt(variance * generating / tokens))

    def rates_of_terms(self, terms: RateTerms, seconds: np.ndarray) -> np.ndarray:
        """``rates`` from the rows' ``rate_terms`` and the steps' ``all_step_seconds`` at the rows the forwards
        compute (``seconds``); the tail's steps at one row."""
        if math.isinf(self.remaining) or terms.tokens[0] <= 1:  # the call's length unknown, or one row: no tail
            return terms.tokens / seconds
        root = math.sqrt(self.remaining)
        tail = self.contenders_factor(terms.deviation * root, round(terms.tokens[0])) * terms.deviation / root
        return terms.tokens / (seconds + tail * self.all_step_seconds(1))  # [k_max+1]

    def contenders_factor(self, reach: np.ndarray, generating: int) -> np.ndarray:
        """[k_max+1] z(n_k): the expected largest of the standard normals of the n_k rows that can still finish last
        drafting k, those whose tokens left come within ``reach`` [k_max+1] (one sd of what a row gains by the call's
        end) of the most left. At a call's start the rows are even and all R contend; later the spread already
        gained is sunk: a row far ahead cannot finish last. (Charged z(R) throughout, at batch 16, T = 1 the policy
        decoded the last 10-15 steps of each call plain where fixed k = 1 was faster.)"""
        if self.rows_left is None:
            return np.full(reach.shape, self.tail_factors(generating)[generating])
        contenders = (self.rows_left[:, None] >= self.remaining - reach).sum(0)  # [k_max+1]
        return self.tail_factors(generating)[contenders]

    def tail_factors(self, rows: int) -> np.ndarray:
        """[>= rows + 1] ``tail_factor`` of 0, 1, ..., rows, computed once per batch size rather than per k each
        step (the choice runs on every step's hot path)."""
        if self.tail_table.shape[0] <= rows:
            self.tail_table = np.array([tail_factor(n) for n in range(rows + 1)])
        return self.tail_table

    def best_k(self, acceptances: np.ndarray, rows: int) -> int:
        """``best_of_terms`` of the rows' running ``acceptances`` [R] at ``rows`` rows fed."""
        sums = self.power_sums(acceptances)
        steady = sums[0] * self.acceptance ** self.orders  # [2 k_max+1] as many rows at the batch's acceptance
        return self.best_of_terms(self.rate_terms(sums), lambda: self.rate_terms(steady), self.all_step_seconds(rows))

    def best_of_terms(self, terms: RateTerms, steady: Callable[[], RateTerms], seconds: np.ndarray) -> int:
        """The k >= 1 of the highest rate at the rows' running acceptances (their ``rate_terms``; ``seconds``: the
        steps' ``all_step_seconds`` at the rows fed), the smallest within a relative 1e-9 of it; 0 where that does
        not beat k = 0's rate by ``margin`` at those acceptances nor at the batch's ``steady`` one (computed only
        then). A plain step observes no acceptance, so a row's estimate that a few rejections pulled down would
        otherwise stay down until ``explore_every``: whether to draft at all is the batch's long-run question (the
        load's), how far to draft the rows' current one."""
        rates = self.rates_of_terms(terms, seconds)
        drafting = rates[1:]
        k = int(np.argmax(drafting >= drafting.max() * (1 - TIE_TOLERANCE))) + 1  # the first of the best
        if rates[k] > rates[0] * (1 + self.margin):
            return k
        steady_rates = self.rates_of_terms(steady(), seconds)
        return k if steady_rates[1:].max() > steady_rates[0] * (1 + self.margin) else 0

    def next_k(self) -> int:
        self.ensure_costs(self.rows_fed)
        seconds = self.all_step_seconds(self.rows_fed)  # [k_max+1] the model's step of each k, at the rows fed
        calibrate = self.calibration and not self.first_step and self.rows_fed > 1
        self.calibrating = self.calibration.pop(0) if calibrate else None
        explore_now = not self.first_step and self.plain_steps + 1 >= self.explore_interval  # keeps a, costs measured
        self.exploring = self.calibrating is None and (explore_now or self.explore_again)
        if self.calibrating is not None:
            k = self.calibrating
        elif self.exploring:
            # Two drafting steps: the first's draft forward catches up on the plain steps' tokens and teaches no
            # draft cost; the second's does (with one, a draft cost once overestimated was never learned back, and
            # a batch-1 run decoded a third of its steps plain).
            k = 1
            self.explore_again = explore_now
        else:
            k = self.best_of_terms(self.row_rate_terms(), self.steady_rate_terms, seconds)
        self.plain_steps = 0 if k else self.plain_steps + 1
        self.chosen_k.append(k)
        self.pending_model = float(seconds[k])
        self.step_started = time.perf_counter()
        return k

    def ensure_costs(self, rows: int) -> None:
        """Measure the costs where none are known yet, or where the batch outgrows the rows measured."""
        if self.costs is not None and (rows <= max(self.costs.target.seconds) or self.measure is None):
            return
        if self.measure is None:
            raise ValueError("CostOptimalLength has no costs: give costs=specdec.costs.CostModel(...), or run it in a "
                             "specdec.Decoder, which shows it the models to measure")
        self.costs = self.measure(rows)
        self.schedule_calibration()

    def observe(self, outcome: StepOutcome) -> None:
        if self.costs is None:  # never asked for a k (a loop that does not speculate): nothing to learn
            return
        wall = time.perf_counter() - self.step_started
        host = outcome.host  # the host loop's read of the step, per row too (the device step takes no adaptive policy)
        rows, self.remaining = len(host.remaining), max(host.remaining_max, 1)
        kept = np.array(host.kept, dtype=np.float64)  # [B'] drafts kept, -1: not generating; empty: none drafted
        if self.first_step:
            self.call_rows, self.call_remaining = rows, self.remaining
        else:
            self.learn_costs(outcome, rows, wall)
            if self.exploring:
                self.learn_exploring_cost(wall, float(kept[kept >= 0].mean()) if outcome.k else 0.0, rows)
        self.first_step = False
        if outcome.k:
            self.learn_acceptance(kept, outcome.k)
        left = np.array(host.remaining)  # [B'] tokens each row may still emit
        generating = left > 0  # [B'] rows that generate in the next step
        rows_left = left[generating]  # [R]
        if self.rows_left is None or rows_left.shape != self.rows_left.shape:
            self.row_terms = self.steady_terms = None
        self.rows_fed, self.generating, self.rows_left = rows, generating, rows_left

    def learn_acceptance(self, kept: np.ndarray, k: int) -> None:
        """Each generating row's successes (drafts ``kept`` [B'] of k, -1 where the row did not generate) and trials
        (those and the rejection, where one came)."""
        successes = np.maximum(kept, 0)  # [B']
        trials = successes + ((kept >= 0) & (kept < k))  # [B']
        if self.row_successes is None or self.row_successes.shape != successes.shape:
            self.row_successes, self.row_trials = np.zeros_like(successes), np.zeros_like(trials)
        self.row_successes = self.decay * self.row_successes + successes
        self.row_trials = self.decay * self.row_trials + trials
        self.row_terms = self.steady_terms = None
        self.successes = self.batch_decay * self.successes + float(successes.sum())
        self.trials = self.batch_decay * self.trials + float(trials.sum())

    def learn_exploring_cost(self, wall: float, kept: float, rows: int) -> None:
        """Add an exploring step's cost (``kept``: the drafts the mean generating row kept) to its exploration's, in
        plain steps at the rows fed; after the exploration's second step, set the interval to the next."""
        self.explore_excess += wall / self.step_seconds(0, rows) - kept - 1
        if self.explore_again:
            return
        interval = round(self.explore_excess / EXPLORE_BUDGET)
        self.explore_interval = min(max(interval, self.explore_every), EXPLORE_MAX * self.explore_every)
        self.explore_excess = 0.0

    def learn_costs(self, outcome: StepOutcome, rows: int, wall: float) -> None:
        """Correct the cost model from a decode step's timings (the prefill's step says nothing of decoding), and
        record what it modelled beside what the step took."""
        k, costs = outcome.k, self.costs
        self.modelled.append(self.pending_model)
        self.measured.append(wall)
        forwards = outcome.draft_seconds + outcome.target_seconds
        timed = math.isfinite(outcome.target_seconds) and outcome.target_seconds > 0
        if timed:
            observed = outcome.target_seconds / self.table_seconds(rows)[0][k]
            self.target_scale = COST_DECAY * self.target_scale + (1 - COST_DECAY) * observed
        if self.calibrating is not None:
            self.record_calibration(outcome.target_seconds if timed and k == self.calibrating else math.nan, rows)
        # After a plain step the draft's first forward also catches up on the tokens the plain steps emitted (or on
        # the prompt): a cost of switching, not of drafting k (learned from it, one exploring step at batch 16 made
        # every drafted token look 2.4x its price, and the policy stopped drafting where k = 2 paid 14%).
        drafted_before = len(self.chosen_k) >= 2 and self.chosen_k[-2] > 0
        if k and drafted_before and math.isfinite(outcome.draft_seconds) and outcome.draft_seconds > 0:
            if costs.draft is None:
                per_token = outcome.draft_seconds / k
                self.learned_draft_step = COST_DECAY * self.learned_draft_step + (1 - COST_DECAY) * per_token
            else:
                observed = outcome.draft_seconds / self.table_seconds(rows)[1][k]
                self.draft_scale = COST_DECAY * self.draft_scale + (1 - COST_DECAY) * observed
        if not math.isfinite(forwards):
            forwards = self.forward_seconds(k, rows)
        overhead, kind = max(wall - forwards, 0.0), int(k > 0)
        known = self.overheads[kind]
        self.overheads[kind] = overhead if known is None else COST_DECAY * known + (1 - COST_DECAY) * overhead

    def record_calibration(self, seconds: float, rows: int) -> None:
        """Keep a calibration step's target ``seconds`` at ``rows`` rows fed; after the last step, correct the
        table."""
        if not self.calibration_seconds:
            self.calibration_rows = rows
        self.calibration_seconds.append(seconds if rows == self.calibration_rows else math.nan)
        if not self.calibration:
            rounds = np.array(self.calibration_seconds).reshape(self.calibration_rounds, -1)  # [rounds, K + 1]
            self.costs = calibrated(self.costs, self.calibration_rows, rounds)

    def select_rows(self, index: torch.Tensor) -> None:
        index = index.cpu().numpy()
        self.rows_fed, self.row_terms, self.steady_terms = index.shape[0], None, None
        self.generating = self.generating[index]
        if self.row_successes is not None:
            self.row_successes, self.row_trials = self.row_successes[index], self.row_trials[index]

    def step_costs(self) -> tuple[float, float] | None:
        if not self.measured:
            return None
        return statistics.fmean(self.modelled), statistics.fmean(self.measured)


def calibrated(costs: CostModel, rows: int, seconds: np.ndarray) -> CostModel:
    """``costs`` with the target's shape at ``rows`` rows the loop's: ``seconds`` [rounds, K + 1] holds the target's
    seconds verifying k = 0..K drafts (k + 1 tokens a row) in each round of the calibration, NaN where not timed.
    Width k + 1 costs the table's width 1 times the median over the rounds of its seconds over the same round's
    width 1; wider ones continue from width K + 1 at the calibrated widths' mean price of a token more a row (the
    table's own widths beyond carry its per-width errors: scaled by width K + 1's correction, they made 5 tokens a
    row look cheap beside 4 at batch 16, greedy, and the policy drafted k = 4-6 where k = 2 was best). The level,
    width 1, stays the table's: the policy's ``target_scale`` corrects it from every step. Unchanged where a width
    was never timed at those rows."""
    prices = seconds[:, 1:] / seconds[:, :1]  # [rounds, K] width k + 1 over width 1, paired per round
    timed = np.isfinite(prices)  # [rounds, K]
    if not timed.any(0).all():
        return costs
    medians = [float(np.median(prices[timed[:, j], j])) for j in range(prices.shape[1])]  # [K]
    table, widest = costs.target, prices.shape[1] + 1
    one = table.at(rows, 1)
    per_token = one * (medians[-1] - 1) / (widest - 1)  # seconds of a token more a row, from width 1 to K + 1
    after = {1: one, **{n: one * price for n, price in enumerate(medians, 2)}}
    beyond = {n for row in table.seconds.values() for n in row if n > widest}
    after.update({n: after[widest] + (n - widest) * per_token for n in beyond})
    return dataclasses.replace(costs, target=CostTable({**table.seconds, rows: after}))


def tail_factor(rows: int) -> float:
    """The expected largest of ``rows`` standard normals (Blom's approximation; 0 for one row): how many standard
    deviations the slowest of ``rows`` rows falls behind the mean."""
    return statistics.NormalDist().inv_cdf((rows - 0.375) / (rows + 0.25)) if rows > 1 else 0.0


def is_causal_lm(model: torch.nn.Module) -> bool:
    """A model whose forward takes token ids and a cache and gives logits: what ``specdec.costs`` can time."""
    return isinstance(model, transformers.PreTrainedModel) and hasattr(model, "lm_head")
