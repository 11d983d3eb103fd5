"""The bound (specdec.bound): the best acceptance any lossless verifier reaches for the sampled drafts, as an LP.
Checked against closed forms (sum min(p, q) for one draft; the min-cut form for n drafts), against token-wise
speculative sampling's exact expectation, block verification and recursive rejection sampling (all below it)."""

from __future__ import annotations

import pytest
import torch

from specdec.block import BlockVerification
from specdec.bound import (
    multidraft_acceptance_by_cut, optimal_chain_length, optimal_multidraft_acceptance, tokenwise_chain_length,
)
from specdec.rules import speculative_tree
from specdec.sampling import sample
from specdec.strategies import Speculative
from specdec.tree import tree_shape
from test_verification_block import one_step_then_target, prefix_tables


def random_pair(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(2, vocab, generator=g, dtype=torch.float64).pow(3)
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_lp_equals_the_min_cut_and_one_draft_is_the_overlap(seed):
    p, q = random_pair(5, seed)
    assert optimal_multidraft_acceptance(p, q, 1) == pytest.approx(float(torch.minimum(p, q).sum()), abs=1e-6)
    for n in (1, 2, 3):
        assert optimal_multidraft_acceptance(p, q, n) == pytest.approx(multidraft_acceptance_by_cut(p, q, n), abs=1e-6)


def test_recursive_rejection_sampling_stays_below_the_bound():
    """n i.i.d. drafts at the root, judged by SpecInfer's rule: P(a draft is kept) <= the LP's optimum, and above
    one draft's sum min(p, q)."""
    vocab, n, batch = 5, 3, 200_000
    p, q = random_pair(vocab, 4)
    g = torch.Generator().manual_seed(0)
    shape = tree_shape((n,))
    tokens = sample(q.expand(batch, n, vocab), g)  # [B, n] i.i.d. drafts
    verdict = speculative_tree(shape, tokens, q.expand(batch, 1, vocab), p.expand(batch, n + 1, vocab), g)
    kept = verdict.num_accepted.double().mean().item()
    assert float(torch.minimum(p, q).sum()) < kept < optimal_multidraft_acceptance(p, q, n) - 0.005


@pytest.mark.parametrize("seed", [0, 1])
def test_block_and_tokenwise_stay_below_the_full_information_chain_bound(seed):
    """Block keeps more than token-wise, whose Monte Carlo mean is its exact expectation; both stay below the LP of
    a verifier that would know p off the drafted path (which block verification, seeing one path, cannot reach)."""
    k, vocab, batch = 3, 3, 400_000
    p, q = prefix_tables(vocab, k, seed), prefix_tables(vocab, k, seed + 100)
    best = optimal_chain_length(p, q, k)
    kept = {}
    for rule in (BlockVerification(), Speculative()):
        def recorded(*args, rule=rule):
            verdict = rule(*args)
            kept[rule.name] = verdict.num_accepted.double().mean().item()
            return verdict
        one_step_then_target(recorded, p, q, k, batch, seed)
    assert kept["speculative"] == pytest.approx(tokenwise_chain_length(p, q, k), abs=0.01)
    assert tokenwise_chain_length(p, q, k) + 0.02 < kept["block"] < best


def test_a_too_large_lp_is_refused():
    p, q = random_pair(40, 0)
    with pytest.raises(ValueError, match="more than 2000000: use a smaller vocabulary"):
        optimal_multidraft_acceptance(p, q, 4)
