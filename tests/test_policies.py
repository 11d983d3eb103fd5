"""Draft-length policies, each rule tested directly on synthetic step outcomes.

(Greedy equality of every policy with every drafter lives in test_drafters.py.)
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from specdec import policies
from specdec.layout import ChainLayout
from specdec.types import HostSync, StepOutcome
from specdec.policies import ConfidenceLength, CostOptimalLength, FixedLength, HeuristicLength
from specdec.costs import CostModel, CostTable


def outcome(k: int, accepted: list[int], active: list[bool] | None = None, draft_seconds=0.0, target_seconds=0.0):
    """A StepOutcome as the loop would build it for these per-row acceptance counts."""
    num_accepted = torch.tensor(accepted)
    active = torch.tensor(active) if active is not None else torch.ones(len(accepted), dtype=torch.bool)
    new_tokens = torch.zeros(len(accepted), k + 1, dtype=torch.long)
    live = num_accepted[active]
    num_new = (num_accepted + 1) * active
    host = HostSync(remaining_max=64, room_min=k, num_active=int(active.sum()),
                    max_accepted=int(live.max()) if len(live) else -1, min_accepted=int(live.min()) if len(live) else k,
                    max_new=int(num_new.max()), min_new=int(num_new.min()), remaining=tuple(64 * active.long()),
                    kept=tuple(torch.where(active, num_accepted, -1).tolist()) if k else ())
    return StepOutcome(
        k=k, layout=ChainLayout(k), num_accepted=num_accepted, next_token=new_tokens[:, 0],
        path=torch.arange(1, k + 1).expand(len(accepted), k), new_tokens=new_tokens, num_new=num_new,
        active=active, active_after=active, host=host, draft_seconds=draft_seconds, target_seconds=target_seconds,
    )


def run_policy(policy, accepted_per_step):
    """Ask k, feed back an outcome where each row accepts ``accepted(k)``; return the k sequence."""
    ks = []
    for accepted in accepted_per_step:
        k = policy.next_k()
        ks.append(k)
        policy.observe(outcome(k, accepted(k)))
    return ks


# --- FixedLength -------------------------------------------------------------------------------------------------


def test_fixed_length_never_changes():
    policy = FixedLength(3)
    full, none = (lambda k: [k]), (lambda k: [0])
    assert run_policy(policy, [full, none, full]) == [3, 3, 3] and policy.max_k == 3


# --- HeuristicLength ------------------------------------------------------------------------------------------


def test_heuristic_adds_two_after_full_acceptance_and_drops_one_otherwise_within_bounds():
    policy = HeuristicLength(k0=4, k_min=2, k_max=9)
    full, partial = (lambda k: [k]), (lambda k: [k - 1])
    ks = run_policy(policy, [full] * 4 + [partial] * 9 + [full])
    assert ks == [4, 6, 8, 9, 9, 8, 7, 6, 5, 4, 3, 2, 2, 2]
    assert policy.next_k() == 4 and policy.max_k == 9
    policy.start()
    assert policy.next_k() == 4 and policy.history == []


def test_heuristic_batch_counts_full_only_when_every_active_row_kept_everything():
    policy = HeuristicLength(k0=4, k_min=1, k_max=16)
    policy.observe(outcome(4, [4, 4, 2]))
    assert policy.next_k() == 3  # one rejecting row shrinks k for the batch
    policy.observe(outcome(3, [3, 0, 3], active=[True, False, True]))
    assert policy.next_k() == 5  # the finished row does not count
    policy.observe(outcome(0, [0, 0, 0]))
    assert policy.next_k() == 5  # a step that drafted nothing says nothing
    policy.observe(outcome(2, [2, 2, 2]))  # the loop cut k to 2 near the end and both were kept
    assert policy.next_k() == 7


def test_heuristic_validates_its_bounds():
    for kwargs in ({"k0": 0}, {"k0": 5, "k_max": 4}, {"k0": 2, "k_min": 3}, {"k_max": 2.0}):
        with pytest.raises(ValueError):
            HeuristicLength(**kwargs)


# --- ConfidenceLength -----------------------------------------------------------------------------------------


def test_confidence_asks_for_k_max_and_stops_when_no_active_row_is_confident():
    policy = ConfidenceLength(threshold=0.4, k_max=6)
    assert policy.next_k() == 6 and policy.max_k == 6
    probs = torch.tensor([[0.5, 0.3, 0.2], [0.35, 0.35, 0.3]])  # row 0 confident (0.5 >= 0.4), row 1 not
    assert not policy.should_stop(probs, torch.tensor([True, True]))
    assert policy.should_stop(probs, torch.tensor([False, True]))  # the only confident row has finished
    assert not policy.should_stop(probs, torch.tensor([True, False]))
    assert policy.should_stop(torch.tensor([[0.39, 0.61 - 0.3, 0.3]]), torch.tensor([True]))
    assert not policy.should_stop(torch.tensor([[0.4, 0.3, 0.3]]), torch.tensor([True]))  # at the threshold: sure


def test_confidence_records_the_drafted_lengths():
    policy = ConfidenceLength(threshold=0.4, k_max=6)
    for k in (6, 2, 0, 1):
        policy.observe(outcome(k, [0]))
    assert policy.history == [6, 2, 1]
    policy.start()
    assert policy.history == []


def test_confidence_validates_threshold():
    for bad in (-0.1, 1.5, "0.4"):
        with pytest.raises(ValueError):
            ConfidenceLength(threshold=bad)


# --- CostOptimalLength: the load-aware policy -----------------------------------------------------------------


def costs_growing(per_token: float, fixed: float = 1.0, draft: float = 0.1) -> CostModel:
    """A synthetic machine: the target's forward costs ``fixed`` + ``per_token`` per token computed (rows x width),
    the draft's step 0.1 of a batch-1 target step per row-independent forward."""
    rows = [1, 2, 4, 8, 16, 32, 64]
    target = CostTable({b: {n: fixed + per_token * b * n for n in range(1, 10)} for b in rows})
    return CostModel(target, CostTable({b: {1: draft} for b in rows}))


def brute_force_rate_k(costs: CostModel, alpha: float, rows: int, k_max: int, margin: float) -> int:
    """The best k by expected tokens per second, written out from the rule in the docstring."""
    def rate(k):
        tokens = rows * sum(alpha**i for i in range(k + 1))
        return tokens / (k * costs.draft_step(rows) + costs.verify(k, rows))
    best = max(range(1, k_max + 1), key=lambda k: (rate(k), -k))
    return best if rate(best) > rate(0) * (1 + margin) else 0


def test_cost_optimal_drafts_nothing_when_verification_grows_steeply_with_the_batch():
    policy = CostOptimalLength(k_max=8, costs=costs_growing(per_token=1.0))  # compute-bound: cost ~ tokens
    acceptances = np.full(16, 0.8)
    assert policy.best_k(acceptances, rows=16) == 0
    assert policy.best_k(np.full(64, 0.9), rows=64) == 0


def test_cost_optimal_drafts_long_when_verification_is_flat_and_acceptance_high():
    policy = CostOptimalLength(k_max=8, costs=costs_growing(per_token=0.0, draft=0.01))
    assert policy.best_k(np.full(16, 0.95), rows=16) == 8
    assert policy.best_k(np.full(1, 0.95), rows=1) == 8


def test_cost_optimal_shortens_its_draft_as_the_batch_grows():
    """Verification flat at batch 1, then growing with the tokens computed: k falls with the batch to 0."""
    policy = CostOptimalLength(k_max=8, costs=costs_growing(per_token=0.08, draft=0.05))
    ks = [policy.best_k(np.full(b, 0.8), rows=b) for b in (1, 4, 16, 64)]
    assert ks == sorted(ks, reverse=True) and ks[0] >= 3 and ks[-1] == 0


@pytest.mark.parametrize("per_token", [0.0, 0.005, 0.02, 0.1])
@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.8, 0.95])
@pytest.mark.parametrize("rows", [1, 4, 16, 64])
def test_cost_optimal_choice_is_the_brute_force_argmax_of_tokens_per_second(per_token, alpha, rows):
    costs = costs_growing(per_token, draft=0.05)
    policy = CostOptimalLength(k_max=8, costs=costs, margin=0.02, prior_acceptance=alpha)  # rows at the batch's
    assert policy.best_k(np.full(rows, alpha), rows) == \
        brute_force_rate_k(costs, alpha, rows, 8, 0.02)


def brute_force_tail_rate(costs: CostModel, alpha: float, k: int, rows: int, remaining: int) -> float:
    """Expected tokens per second of drafting k with the call's tail, from each row's distribution of tokens per
    step written out: 1 + j tokens with probability alpha^j (1 - alpha), j < k, and k + 1 with alpha^k."""
    probabilities = [alpha**j * (1 - alpha) for j in range(k)] + [alpha**k]
    mean = sum(p * (1 + j) for j, p in enumerate(probabilities))
    sd = math.sqrt(sum(p * (1 + j - mean) ** 2 for j, p in enumerate(probabilities)))
    z = statistics.NormalDist().inv_cdf((rows - 0.375) / (rows + 0.25)) if rows > 1 else 0.0

    def step(b):
        return k * costs.draft_step(b) + costs.verify(k, b)
    return rows * mean / (step(rows) + z * sd * step(1) / math.sqrt(remaining * mean))


@pytest.mark.parametrize("rows", [1, 16, 64])
@pytest.mark.parametrize("alpha", [0.3, 0.8])
def test_cost_optimal_charges_each_step_its_share_of_the_calls_tail(rows, alpha):
    costs = costs_growing(0.02, draft=0.05)
    policy = CostOptimalLength(k_max=6, costs=costs)
    policy.remaining = 40
    rates = policy.rates(np.full(rows, alpha), rows)
    assert rates == pytest.approx([brute_force_tail_rate(costs, alpha, k, rows, 40) for k in range(7)])


def test_the_calls_tail_shortens_the_draft_at_batch_16_and_not_at_batch_1():
    """A longer draft that wins per step by 2%: it spreads the rows' progress more, and the batch's last row decides
    when the call ends. One row has no tail."""
    costs = CostModel(CostTable({b: {1: 14.8, 2: 21.1, 3: 26.1, 4: 29.5} for b in (1, 16)}),
                      CostTable({b: {1: 2.2} for b in (1, 16)}))
    policy = CostOptimalLength(k_max=3, costs=costs)
    acceptances = np.full(16, 0.8)
    assert policy.best_k(acceptances, 16) == 3  # the call's length unknown: no tail
    policy.remaining = 64
    assert 1 <= policy.best_k(acceptances, 16) < 3
    assert policy.best_k(acceptances[:1], 1) == 3


def test_the_calls_tail_counts_only_the_rows_that_can_still_finish_last():
    """The spread the rows already gained is sunk: with one row 24 tokens behind the other fifteen, only it can
    finish last (z(1) = 0) and the draft is as long as with no tail; with the rows even, the tail shortens it."""
    costs = CostModel(CostTable({b: {1: 14.8, 2: 21.1, 3: 26.1, 4: 29.5} for b in (1, 16)}),
                      CostTable({b: {1: 2.2} for b in (1, 16)}))
    policy = CostOptimalLength(k_max=3, costs=costs)
    acceptances = np.full(16, 0.8)
    policy.remaining = 64
    policy.rows_left = np.full(16, 64)
    assert 1 <= policy.best_k(acceptances, 16) < 3
    policy.rows_left = np.array([64] + [40] * 15)
    assert policy.best_k(acceptances, 16) == 3


def test_cost_optimal_weighs_each_rows_acceptance():
    """One row that keeps everything and fifteen that keep nothing: the batch drafts as the mean row would not."""
    policy = CostOptimalLength(k_max=8, costs=costs_growing(per_token=0.002, draft=0.01))
    mixed = np.array([0.99] + [0.0] * 15)
    rates = policy.rates(mixed, rows=16)
    for k in range(9):
        tokens = sum(0.99**i for i in range(k + 1)) + 15
        assert rates[k] == pytest.approx(tokens / (k * 0.01 + 1 + 0.002 * 16 * (k + 1)))


def test_cost_optimal_rates_from_power_sums_are_the_per_row_sums_with_the_tail():
    """The rates are computed from S_n = sum_r a_r^n; written out per row instead (tokens, Var J of each row, its
    mean, and the call's tail at 20 tokens left), they agree for rows of very different acceptances."""
    policy = CostOptimalLength(k_max=6, costs=costs_growing(per_token=0.002, draft=0.01))
    policy.remaining = 20
    acceptances = np.array([0.95, 0.1, 0.6, 0.0, 0.8])
    tokens = [sum(sum(a**j for j in range(k + 1)) for a in acceptances) for k in range(7)]
    def variance(a, k):  # Var J = E[J^2] - E[J]^2
        return sum((2 * j - 1) * a**j for j in range(1, k + 1)) - sum(a**j for j in range(1, k + 1))**2
    variances = [statistics.fmean(variance(a, k) for a in acceptances) for k in range(7)]
    z = policies.tail_factor(5)
    expected = [tokens[k] / (policy.step_seconds(k, 5) + z * math.sqrt(variances[k] / (20 * tokens[k] / 5))
                             * policy.step_seconds(k, 1)) for k in range(7)]
    assert policy.rates(acceptances, 5) == pytest.approx(expected, rel=1e-12)
    assert max(variances) > 0.1  # the tail is material at these acceptances
    policy.rows_left = np.array([20, 19, 17, 5, 20])  # contending: rows within one sd of what a row gains by its end
    reach = [math.sqrt(variances[k] * 20 / (tokens[k] / 5)) for k in range(7)]
    contenders = [sum(left >= 20 - reach[k] for left in policy.rows_left) for k in range(7)]
    assert len(set(contenders[1:])) > 1  # the rows contending differ by k here
    expected = [tokens[k] / (policy.step_seconds(k, 5) + policies.tail_factor(contenders[k])
                             * math.sqrt(variances[k] / (20 * tokens[k] / 5)) * policy.step_seconds(k, 1))
                for k in range(7)]
    assert policy.rates(acceptances, 5) == pytest.approx(expected, rel=1e-12)


def test_cost_optimal_keeps_its_rows_terms_only_while_they_hold():
    """The rows' rate terms are kept between steps; after drafting steps, plain ones, a row finishing and rows
    leaving, the kept terms are always those computed afresh from the rows' acceptances."""
    policy = CostOptimalLength(k_max=4, costs=costs_growing(per_token=0.001, draft=0.05))
    steps = [(2, [2, 0, 1, 2], None), (0, [0, 0, 0, 0], None), (3, [3, 1, 0, 2], None),
             (1, [1, 0, 1, 1], [True, True, False, True]), (0, [0, 0, 0, 0], [True, True, False, True])]
    for k, accepted, active in steps:
        policy.next_k()
        policy.chosen_k[-1] = k
        policy.observe(outcome(k, accepted, active))
        sums = policy.power_sums(policy.row_acceptances())
        fresh = policy.rate_terms(sums), policy.rate_terms(sums[0] * policy.acceptance ** policy.orders)
        for kept, computed in zip((policy.row_rate_terms(), policy.steady_rate_terms()), fresh):
            assert np.allclose(kept, computed, rtol=1e-12)
    policy.select_rows(torch.tensor([0, 1, 3]))  # the finished row leaves the batch
    assert len(policy.row_acceptances()) == 3
    assert np.allclose(policy.row_rate_terms().tokens, policy.rate_terms(
        policy.power_sums(policy.row_acceptances())).tokens, rtol=1e-12)


def test_cost_optimal_estimates_acceptance_per_row_and_follows_rows_that_leave():
    policy = CostOptimalLength(k_max=4, prior_acceptance=0.5, prior_weight=2.0, decay=0.5, batch_decay=0.25,
                               costs=costs_growing(per_token=0.0))
    policy.next_k()
    policy.observe(outcome(4, [4, 0, 2]))  # row 0: 4 successes, 4 trials; row 1: 0 of 1; row 2: 2 of 3
    pooled = (0.25 * 1.0 + 6) / (0.25 * 2.0 + 8)
    assert policy.acceptance == pytest.approx(pooled)
    expected = np.array([(4 + 2 * pooled) / (4 + 2), (0 + 2 * pooled) / (1 + 2), (2 + 2 * pooled) / (3 + 2)])
    assert np.allclose(policy.row_acceptances(), expected)
    policy.select_rows(torch.tensor([0, 2]))  # row 1 finished and left the batch
    assert np.allclose(policy.row_acceptances(), expected[[0, 2]]) and policy.rows_fed == 2


def test_cost_optimal_learns_the_machine_from_step_timings():
    """Steps whose verification takes twice the model's seconds double the target's correction over the steps."""
    costs = costs_growing(per_token=0.0, fixed=1.0, draft=0.1)
    policy = CostOptimalLength(k_max=4, costs=costs, calibration_rounds=1)
    for _ in range(40):
        k = policy.next_k()
        policy.observe(outcome(k, [k], draft_seconds=0.2 * k, target_seconds=2.0))
    assert policy.target_scale == pytest.approx(2.0, rel=1e-3) and policy.draft_scale == pytest.approx(2.0, rel=1e-3)
    modelled, measured = policy.step_costs()
    assert modelled > 0 and measured >= 0


def step_on_clock(policy, clock: list[float], accepted: list[int]) -> int:
    """One step whose forwards take exactly the policy's cost model's seconds, on a clock the policy reads."""
    k = policy.next_k()
    rows = len(accepted)
    draft, target = policy.costs.draft_chain(k, rows), policy.costs.verify(k, rows)
    clock[0] += draft + target
    policy.observe(outcome(k, [min(a, k) for a in accepted], draft_seconds=draft, target_seconds=target))
    return k


def test_cost_optimal_explores_as_rarely_as_its_measured_cost_asks_and_often_again_once_it_costs_nothing(monkeypatch):
    """Two rows that keep no draft: an exploring step drafting one token costs 12.1 s where a plain step takes 11 s
    and emits as much, so an exploration of two steps costs 0.2 plain steps, and the next comes 0.2 / 0.5% = 40 steps
    later. With verification free and the draft free, an exploration costs nothing: they come every
    ``explore_every`` again. Where they cost more than 16 x ``explore_every`` allows, they come at that."""
    clock = [0.0]
    monkeypatch.setattr(policies, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    policy = CostOptimalLength(k_max=4, prior_acceptance=0.05, costs=costs_growing(per_token=0.5, fixed=10.0),
                               explore_every=5, calibration_rounds=1)
    ks = [step_on_clock(policy, clock, [0, 0]) for _ in range(60)]
    explored = [step + 1 for step, k in enumerate(ks) if k]  # the steps that drafted, counted from 1
    # the calibration's round (k = 0..3) from the second step; after 4 plain steps; then after 39
    assert policies.EXPLORE_BUDGET == 0.005
    assert explored == [3, 4, 5, 10, 11, 51, 52] and policy.explore_interval == 40
    policy.costs = costs_growing(per_token=0.0, fixed=10.0, draft=0.0)
    ks = [step_on_clock(policy, clock, [0, 0]) for _ in range(40)]
    assert policy.explore_interval == 5 and 0 < ks.count(1) <= 16 and not any(k > 1 for k in ks)
    policy.costs = costs_growing(per_token=1.0)  # an exploring step costs 5.1 s, a plain one 3 s: 280 steps asked
    ks = [step_on_clock(policy, clock, [0, 0]) for _ in range(200)]
    assert policy.explore_interval == 80 and 2 <= ks.count(1) <= 6


def test_cost_optimal_learns_an_overestimated_draft_cost_back_while_it_only_explores():
    """A draft cost once measured 5 times too high (a disturbed step) makes drafting look unprofitable; only the
    exploring steps draft then, and the second of each teaches the draft's true cost back."""
    policy = CostOptimalLength(k_max=4, costs=costs_growing(per_token=0.0, draft=0.5), explore_every=4)
    policy.draft_scale = 5.0
    for _ in range(400):
        k = policy.next_k()
        policy.observe(outcome(k, [k, k], draft_seconds=0.5 * k, target_seconds=1.0))
    assert policy.draft_scale == pytest.approx(1.0, rel=0.05) and policy.chosen_k[-1] > 1


def test_cost_optimal_without_costs_or_a_decoder_says_what_it_needs():
    with pytest.raises(ValueError, match="has no costs"):
        CostOptimalLength().next_k()


def test_cost_optimal_start_forgets_the_rows_and_keeps_the_machine_and_the_batchs_acceptance():
    policy = CostOptimalLength(prior_acceptance=0.6, costs=costs_growing(per_token=0.0))
    policy.next_k()
    policy.observe(outcome(4, [0, 0]))
    policy.target_scale = 3.0
    learned = policy.acceptance
    policy.start()
    assert learned < 0.6 and policy.acceptance == learned and policy.target_scale == 3.0
    assert policy.chosen_k == [] and policy.row_successes is None


def test_cost_optimal_validates_its_settings():
    for kwargs in ({"k_max": 0}, {"prior_acceptance": 1.5}, {"decay": 1.0}, {"batch_decay": 1.0}, {"prior_weight": 0}, {"margin": -0.1},
                   {"margin": float("inf")}, {"repeats": 0}, {"explore_every": 0}, {"calibration_rounds": 0}):
        with pytest.raises(ValueError):
            CostOptimalLength(**kwargs)
    with pytest.raises(TypeError, match="CostModel"):
        CostOptimalLength(costs={"target": 1.0})


def steep_table_and_cheap_loop() -> tuple[CostModel, Callable[[int], float]]:
    """A table whose every token more a row costs 12 s over a plain forward's 10 s (drafting never pays, even where
    every draft is kept), at 1 and 2 rows, and a loop whose target costs 1 s a token more (drafting pays): the
    target's seconds by width."""
    table = CostTable({b: {n: 10.0 + 12.0 * (n - 1) for n in range(1, 7)} for b in (1, 2)})
    return CostModel(table, CostTable({b: {1: 0.1, 2: 0.1} for b in (1, 2)})), lambda width: 10.0 + (width - 1)


def test_cost_optimal_calibrates_its_tables_shape_in_the_loop_and_chooses_by_the_loops_prices(monkeypatch):
    """From the call's second step, rounds of k = 0..3 whose verification seconds, paired with the round's plain
    step, replace the table's shape at the rows fed: the widths calibrated cost what the loop measured, the wider
    go on at its price of a token more, and other rows keep the table. A table
    alone had the policy decode plain; calibrated, it drafts. Where the loop costs what the table says, it still
    decodes plain."""
    clock = [0.0]
    monkeypatch.setattr(policies, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    for loop_as_table in (False, True):
        costs, loop = steep_table_and_cheap_loop()
        seconds = (lambda width: costs.target.at(2, width)) if loop_as_table else loop
        policy = CostOptimalLength(k_max=5, prior_acceptance=0.9, costs=costs, calibration_rounds=3)
        ks = []
        for _ in range(40):
            k = policy.next_k()
            clock[0] += seconds(k + 1) + 0.1 * k
            policy.observe(outcome(k, [k, k], draft_seconds=0.1 * k, target_seconds=seconds(k + 1)))
            ks.append(k)
        assert ks[0] == 0 and ks[1:13] == [0, 1, 2, 3] * 3  # the table alone: plain; then the calibration
        verify = policy.table_seconds(2)[0]  # [k_max+1] the verification of k = 0..5 at 2 rows
        if loop_as_table:
            assert verify == pytest.approx([10.0 + 12.0 * k for k in range(6)]) and ks[13:28] == [0] * 15  # till it explores
        else:
            assert verify[:4] == pytest.approx([10.0, 11.0, 12.0, 13.0])
            assert verify[4:] == pytest.approx([14.0, 15.0])  # on at the calibrated 1 s a token
            assert all(ks[13:]) and policy.table_seconds(1)[0][1] == 22.0


def test_cost_optimal_calibration_pairs_each_round_and_counts_only_the_rows_and_ks_it_asked_for(monkeypatch):
    """A round whose plain step was disturbed (3x) is outvoted by the median; the steps of a round fed 3 rows (not the
    2 of the calibration's first step) and one whose draft the loop shortened count nothing."""
    clock = [0.0]
    monkeypatch.setattr(policies, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    costs, loop = steep_table_and_cheap_loop()
    policy = CostOptimalLength(k_max=3, prior_acceptance=0.9, costs=costs, calibration_rounds=5)
    policy.next_k()
    policy.observe(outcome(0, [0, 0]))
    for round_ in range(5):
        for k in range(4):
            assert policy.next_k() == k
            fed, taken = 3 if round_ == 2 else 2, k
            if round_ == 1 and k == 0:
                seconds = 3 * loop(1)
            elif round_ == 3 and k == 3:  # the loop drafted 2 near the end of the call
                taken, seconds = 2, 100.0
            else:
                seconds = (9.0 if fed == 3 else 1.0) * loop(k + 1)
            clock[0] += seconds
            policy.observe(outcome(taken, [taken] * fed, target_seconds=seconds))
    assert policy.table_seconds(2)[0] == pytest.approx([10.0, 11.0, 12.0, 13.0])
    untimed = np.full((2, 4), np.nan)
    untimed[:, :3] = [10.0, 11.0, 12.0]  # width 4 never timed at these rows: the table stays as measured
    assert policies.calibrated(costs, 2, untimed) is costs


def test_cost_optimal_does_not_calibrate_at_one_row():
    """One row drafts by the table from its second step on; the calibration waits for a step that feeds more rows."""
    costs, _ = steep_table_and_cheap_loop()
    cheap = CostModel(CostTable({b: {n: 10.0 for n in range(1, 7)} for b in (1, 2)}), costs.draft)
    policy = CostOptimalLength(k_max=5, prior_acceptance=0.9, costs=cheap, calibration_rounds=2)
    ks = run_policy(policy, [lambda k: [k]] * 6)
    assert ks == [5] * 6 and len(policy.calibration) == 8 and not policy.measuring
    ks = run_policy(policy, [lambda k: [k, k]] * 3)
    assert ks == [5, 0, 1] and len(policy.calibration) == 6 and policy.measuring  # begun, not done
    run_policy(policy, [lambda k: [k, k]] * 6)
    assert not policy.calibration and not policy.measuring


def test_cost_optimal_calibrates_again_at_a_batch_it_measures_anew():
    costs, _ = steep_table_and_cheap_loop()
    policy = CostOptimalLength(k_max=2, costs=costs, calibration_rounds=2)
    policy.measure = lambda rows: CostModel(CostTable({b: {n: 10.0 * n for n in range(1, 4)} for b in (1, 4)}))
    policy.next_k()
    policy.observe(outcome(0, [0, 0]))
    assert [policy.next_k() for _ in range(3)] == [0, 1, 2] and len(policy.calibration) == 3
    policy.rows_fed = 4  # a call at a larger batch
    assert policy.next_k() == 0 and max(policy.costs.target.seconds) == 4 and len(policy.calibration) == 5
    assert not policy.measuring  # the new calibration: its first step asked, none taken yet


def test_cost_optimal_at_batch_one_keeps_drafting_through_a_run_of_rejections():
    """At batch 1 the batch is the row. A row that kept 3 of 4 drafts a step for a long while, then had its first
    draft rejected 20 times running (a sampled run does this), has a running acceptance at which drafting does not
    pay; but whether to draft at all is the batch's long-run question, and at its steady acceptance drafting pays.
    (Deciding k = 0 from the row alone, the policy observed nothing more until ``explore_every`` and drafted
    nothing on half its steps at T = 1.) Where the steady acceptance itself says drafting does not pay, it stops."""
    policy = CostOptimalLength(k_max=4, costs=costs_growing(per_token=0.0, draft=0.5))
    for _ in range(200):
        k = policy.next_k()
        policy.observe(outcome(k, [min(k, 3)]))
    for _ in range(20):
        k = policy.next_k()
        policy.observe(outcome(k, [0]))
    row_rates = policy.rates(policy.row_acceptances(), 1)
    assert max(row_rates[1:]) < row_rates[0]  # the row alone says: stop drafting
    assert policy.acceptance > 0.6 and policy.next_k() > 0
    poor = CostOptimalLength(k_max=4, prior_acceptance=0.1, costs=costs_growing(per_token=0.0, draft=0.5))
    assert poor.next_k() == 0


def test_cost_optimal_learns_a_plain_and_a_drafting_steps_overhead_apart(monkeypatch):
    """A drafting step also runs the acceptance rule: its overhead beyond the forwards is its own. The policy takes
    plain steps early (its calibration's, after the call's first), so that both kinds are measured, and models each
    step with its own kind's overhead."""
    clock = [0.0]
    monkeypatch.setattr(policies, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    costs = costs_growing(per_token=0.0, fixed=1.0, draft=0.1)
    policy = CostOptimalLength(k_max=4, costs=costs, calibration_rounds=2)
    chosen = []
    for _ in range(30):
        k = policy.next_k()
        chosen.append(k)
        draft, target = 0.1 * k, costs.verify(k, 2)
        clock[0] += draft + target + (0.6 if k else 0.01)
        policy.observe(outcome(k, [k, k], draft_seconds=draft, target_seconds=target))
    assert chosen[1:9] == [0, 1, 2, 3] * 2 and all(chosen[9:])
    assert policy.overheads == [pytest.approx(0.01), pytest.approx(0.6)]
    assert policy.step_seconds(0, 1) == pytest.approx(1.01) and policy.step_seconds(2, 1) == pytest.approx(1.8)


def test_cost_optimal_prices_a_drafts_first_forward_apart_and_learns_the_same_scale_from_any_k():
    """A step's first draft forward catches up on two tokens and costs more than the others: priced as k times one
    forward, a scale learned from k = 1 steps overprices k = 3 and one learned from k = 3 underprices k = 1, so the
    choice follows the k last drafted."""
    rows = [1, 2, 4]
    costs = CostModel(CostTable({b: {n: 10.0 + n for n in range(1, 10)} for b in rows}),
                      CostTable({b: {1: 1.0, 2: 1.5} for b in rows}))
    assert costs.draft_chain(0) == 0.0 and costs.draft_chain(1) == 1.5 and costs.draft_chain(3) == 1.5 + 2 * 1.0
    scales = []
    for k in (1, 3):
        policy = CostOptimalLength(k_max=4, costs=costs)
        for _ in range(40):  # the machine runs the draft at twice the table's seconds
            policy.next_k()
            policy.chosen_k[-1] = k
            policy.observe(outcome(k, [k, k], draft_seconds=2 * costs.draft_chain(k), target_seconds=11.0 + k))
        scales.append(policy.draft_scale)
    assert scales == pytest.approx([2.0, 2.0], rel=1e-3)


def test_cost_optimal_keeps_exploring_across_calls_shorter_than_its_interval(monkeypatch):
    """Calls of 10 steps, and explorations that cost enough to come 80 steps apart: the plain steps are counted
    across calls, so the explorations still come (counted per call, none came once the interval outgrew a call),
    and never on a call's first step, whose wall time is the prefill's."""
    clock = [0.0]
    monkeypatch.setattr(policies, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    policy = CostOptimalLength(k_max=4, prior_acceptance=0.05, costs=costs_growing(per_token=1.0), explore_every=5)
    ks = []
    for _ in range(40):  # calls
        policy.start()
        ks += [step_on_clock(policy, clock, [0, 0]) for _ in range(10)]
    late = [step for step, k in enumerate(ks) if k and step >= 150]  # once the interval is past a call's 10 steps
    assert policy.explore_interval == 80 and len(late) >= 4 and len(late) % 2 == 0
    assert not any(ks[step] and ks[step - 1] == 0 for step in range(10, len(ks), 10))  # no call opens exploring
