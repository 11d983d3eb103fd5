"""Draft-length policies, each rule tested directly on synthetic step outcomes.

(Greedy equality of every policy with every drafter lives in test_drafters.py.)
"""

from __future__ import annotations

import itertools

import pytest
import torch

from specdec.layout import ChainLayout
from specdec.types import HostSync, StepOutcome
from specdec.policies import ConfidenceLength, CostOptimalLength, FixedLength, HeuristicLength
from specdec.stats import predicted_speedup


def outcome(k: int, accepted: list[int], active: list[bool] | None = None, draft_seconds=0.0, target_seconds=0.0):
    """A StepOutcome as the loop would build it for these per-row acceptance counts."""
    num_accepted = torch.tensor(accepted)
    active = torch.tensor(active) if active is not None else torch.ones(len(accepted), dtype=torch.bool)
    new_tokens = torch.zeros(len(accepted), k + 1, dtype=torch.long)
    live = num_accepted[active]
    num_new = (num_accepted + 1) * active
    host = HostSync(remaining_max=1, room_min=k, num_active=int(active.sum()),
                    max_accepted=int(live.max()) if len(live) else -1, min_accepted=int(live.min()) if len(live) else k,
                    max_new=int(num_new.max()), min_new=int(num_new.min()))
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


# --- CostOptimalLength ----------------------------------------------------------------------------------------


def leviathan(alpha: float, k: int, c: float) -> float:
    """The formula as printed, (1 - a^(k+1)) / ((1 - a)(k c + 1)), for a < 1."""
    return (1 - alpha ** (k + 1)) / ((1 - alpha) * (k * c + 1))


def brute_force_k(alpha: float, c: float, k_min: int, k_max: int) -> int:
    """The smallest k whose speedup is within a relative 1e-9 of the best (the policy's documented tie rule)."""
    values = {k: leviathan(alpha, k, c) for k in range(k_min, k_max + 1)}
    best = max(values.values())
    return min(k for k, v in values.items() if v >= best * (1 - 1e-9))


ALPHAS = [0.05, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.99]
COSTS = [0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0, 2.0]


@pytest.mark.parametrize("k_min,k_max", [(1, 8), (1, 16), (3, 6)])
def test_cost_optimal_choice_is_the_brute_force_argmax_of_the_predicted_speedup(k_min, k_max):
    policy = CostOptimalLength(k_max=k_max, k_min=k_min)
    for alpha, c in itertools.product(ALPHAS, COSTS):
        assert policy.best_k(alpha, c) == brute_force_k(alpha, c, k_min, k_max), (alpha, c)
        assert predicted_speedup(alpha, 3, c) == pytest.approx(leviathan(alpha, 3, c))
    assert policy.best_k(1.0, 0.1) == k_max  # a = 1 (the sum form needs no limit): (k + 1) / (0.1 k + 1) grows


def test_cost_optimal_first_choice_comes_from_the_priors():
    for alpha, c in [(0.7, 0.1), (0.9, 0.02), (0.3, 0.5)]:
        policy = CostOptimalLength(k_max=10, prior_acceptance=alpha, prior_cost_ratio=c)
        assert policy.next_k() == brute_force_k(alpha, c, 1, 10)
        assert policy.chosen_k == [policy.best_k(alpha, c)] and policy.estimates == [(pytest.approx(alpha), c)]


def test_cost_optimal_estimates_follow_the_documented_update():
    policy = CostOptimalLength(k_max=8, prior_acceptance=0.5, prior_cost_ratio=0.1, decay=0.5, prior_weight=2.0)
    # Row 0 kept 4 of 4 (4 successes, no rejection); row 1 kept 1 then was rejected (1 success, 1 rejection);
    # row 2 had finished and is ignored.
    policy.observe(outcome(4, [4, 1, 0], active=[True, True, False], draft_seconds=0.02, target_seconds=0.01))
    assert policy.acceptance == pytest.approx((0.5 * 1.0 + 5) / (0.5 * 2.0 + 6))
    assert policy.cost_ratio == pytest.approx(0.5 * 0.1 + 0.5 * (0.02 / 4 / 0.01))
    policy.observe(outcome(0, [0, 0, 0]))  # nothing drafted: nothing learned
    policy.observe(outcome(2, [0, 0, 0], target_seconds=0.0))  # no timing: c unchanged, three rejections
    assert policy.acceptance == pytest.approx((0.5 * 5.5 + 0) / (0.5 * 7 + 3))
    assert policy.cost_ratio == pytest.approx(0.3)
    assert policy.history == [4, 2]


def test_cost_optimal_recovers_the_true_acceptance_and_settles_on_the_best_k():
    """Drafts accepted i.i.d. with a = 0.9 at c = 0.05: the estimate converges to 0.9, where accepted / drafted
    would converge to E[accepted] / k, well below it, and k settles near the argmax for the true (a, c)."""
    alpha, c = 0.9, 0.05
    policy = CostOptimalLength(k_max=16, prior_acceptance=0.5, prior_cost_ratio=0.5, decay=0.99)
    g = torch.Generator().manual_seed(0)
    drafted = accepted_total = 0
    for _ in range(400):
        k = policy.next_k()
        kept = (torch.rand(64, k, generator=g) < alpha).long().cumprod(-1).sum(-1)  # [64] leading acceptances
        drafted, accepted_total = drafted + 64 * k, accepted_total + int(kept.sum())
        policy.observe(outcome(k, kept.tolist(), draft_seconds=c * k * 0.01, target_seconds=0.01))
    assert policy.acceptance == pytest.approx(alpha, abs=0.02)
    assert policy.cost_ratio == pytest.approx(c, abs=0.01)  # 0.99^400 of the prior 0.5 is left
    assert accepted_total / drafted < alpha - 0.1  # the naive ratio is biased low
    last_a, last_c = policy.estimates[-1]
    assert policy.chosen_k[-1] == brute_force_k(last_a, last_c, 1, 16)
    # The speedup curve is flat near its top: the settled k is near-optimal for the true (a, c).
    best = leviathan(alpha, brute_force_k(alpha, c, 1, 16), c)
    assert leviathan(alpha, policy.chosen_k[-1], c) > 0.99 * best
    assert len(policy.chosen_k) == 400 and policy.chosen_k[0] == brute_force_k(0.5, 0.5, 1, 16)


def test_cost_optimal_goes_to_the_bounds_when_drafting_is_free_or_useless():
    cheap = CostOptimalLength(k_max=8, prior_acceptance=0.99, prior_cost_ratio=0.0)
    assert cheap.next_k() == 8
    useless = CostOptimalLength(k_max=8, k_min=2, prior_acceptance=0.05, prior_cost_ratio=1.0)
    assert useless.next_k() == 2


def test_cost_optimal_start_resets_to_the_priors():
    policy = CostOptimalLength(prior_acceptance=0.6, prior_cost_ratio=0.2)
    policy.next_k()
    policy.observe(outcome(4, [0], draft_seconds=1.0, target_seconds=0.1))
    policy.start()
    assert (policy.acceptance, policy.cost_ratio, policy.chosen_k, policy.history) == (pytest.approx(0.6), 0.2, [], [])


def test_cost_optimal_validates_its_settings():
    for kwargs in ({"k_max": 0}, {"k_min": 0}, {"k_min": 5, "k_max": 4}, {"prior_acceptance": 1.5},
                   {"prior_cost_ratio": -1}, {"decay": 1.0}, {"prior_weight": 0}):
        with pytest.raises(ValueError):
            CostOptimalLength(**kwargs)
