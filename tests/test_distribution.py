"""Speculative sampling is lossless: emitted tokens follow the target distribution exactly.

Two levels. Synthetic: fixed p and q, one strategy call on a large batch, the first emitted token against p.
End to end: a tiny-vocabulary model pair decoded through the real loop (caches, rollback, several steps), the
empirical joint distribution of the first three tokens against the exact one enumerated from the target.
Each test is a chi-square goodness-of-fit test at significance 0.001 with fixed seeds (so it is deterministic),
and a deliberately wrong rule must fail the same test.
"""

from dataclasses import dataclass

import pytest
import torch

import specdec
from specdec.sampling import SamplingConfig, logits_to_probs, sample
from specdec.rules import count_leading_true
from specdec.strategies import Speculative
from specdec.testing import chi_square_p_value, continuation_codes, exact_joint
from specdec.types import Verdict
from conftest import PROMPT, SMALL_VOCAB, tiny_gpt2

SIGNIFICANCE = 1e-3


@dataclass(frozen=True)
class AlwaysAccept:
    """Deliberately wrong: keeps every draft, so tokens follow q instead of p."""

    name: str = "always-accept"
    lossless: bool = False

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        num_accepted = torch.full(draft_tokens.shape[:1], draft_tokens.shape[1], dtype=torch.long)
        return Verdict(num_accepted, sample(target_probs[:, -1], generator))


@dataclass(frozen=True)
class AcceptButResampleFromTarget:
    """Deliberately wrong: the Leviathan acceptance test, but the correction is drawn from p, not the residual."""

    name: str = "no-residual"
    lossless: bool = False

    def __call__(self, draft_tokens, draft_probs, target_probs, generator) -> Verdict:
        p = target_probs[:, :-1].gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        q = draft_probs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1)
        accepted = torch.rand(p.shape, generator=generator) * q < p
        num_accepted = count_leading_true(accepted)
        row = target_probs[torch.arange(len(num_accepted)), num_accepted]
        return Verdict(num_accepted, sample(row, generator))


def first_emitted_token(strategy, p: torch.Tensor, q: torch.Tensor, batch: int, seed: int) -> torch.Tensor:
    """Draft k tokens from q per row, verify against p, return the first emitted token of each row."""
    g = torch.Generator().manual_seed(seed)
    k = q.shape[0]
    draft_probs = q.expand(batch, k, -1)
    draft_tokens = sample(draft_probs, g)  # [B, k]
    verdict = strategy(draft_tokens, draft_probs, p.expand(batch, k + 1, -1), g)
    return torch.where(verdict.num_accepted > 0, draft_tokens[:, 0], verdict.next_token)


def synthetic_pair(vocab: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(k + 1, vocab, generator=g).pow(3)
    q = torch.rand(k, vocab, generator=g).pow(3)
    q[:, 0] = 0  # a token the draft never proposes but the target wants: only the residual can emit it
    return p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)


def test_sample_follows_unnormalised_mass_and_never_picks_a_zero():
    mass = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.0, 0.0])  # sums to 6.5, zeros inside and at both ends
    tokens = sample(mass.expand(60_000, 2, -1), torch.Generator().manual_seed(8)).flatten()
    assert set(tokens.tolist()) == {1, 3, 4, 6}
    assert chi_square_p_value(tokens, mass / mass.sum()) > SIGNIFICANCE
    nan_row = torch.full((1, 8), float("nan"))  # refused later at the step's sync; it must still index safely
    assert 0 <= sample(nan_row, torch.Generator()).item() < 8


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_speculative_first_token_follows_target_on_synthetic_distributions(seed):
    p, q = synthetic_pair(vocab=12, k=3, seed=seed)
    tokens = first_emitted_token(Speculative(), p, q, batch=60_000, seed=seed)
    assert chi_square_p_value(tokens, p[0]) > SIGNIFICANCE


@pytest.mark.parametrize("wrong_rule", [AlwaysAccept(), AcceptButResampleFromTarget(), Speculative(lenience=0.5)],
                         ids=["always-accept", "no-residual", "lenience-0.5"])
def test_wrong_rules_fail_the_same_test(wrong_rule):
    p, q = synthetic_pair(vocab=12, k=3, seed=0)
    tokens = first_emitted_token(wrong_rule, p, q, batch=60_000, seed=0)
    assert chi_square_p_value(tokens, p[0]) < SIGNIFICANCE


def test_bonus_token_follows_target_after_a_fully_accepted_draft():
    p, _ = synthetic_pair(vocab=10, k=2, seed=4)
    q = p[:2].clone()  # draft == target: every draft accepted, so every row emits a bonus token from p[2]
    g = torch.Generator().manual_seed(0)
    batch = 40_000
    draft_tokens = sample(q.expand(batch, 2, -1), g)
    verdict = Speculative()(draft_tokens, q.expand(batch, 2, -1), p.expand(batch, 3, -1), g)
    assert bool((verdict.num_accepted == 2).all())
    assert chi_square_p_value(verdict.next_token, p[2]) > SIGNIFICANCE


SETTINGS = {  # sampling settings every lossless test runs under (tests/test_tree.py too)
    "t1": SamplingConfig(temperature=1.0),
    "t0.7-topk5": SamplingConfig(temperature=0.7, top_k=5),
    "t1.3-topp0.8": SamplingConfig(temperature=1.3, top_p=0.8),
}


@pytest.fixture(scope="module")
def small_pair():
    return tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(11, layers=1, vocab=SMALL_VOCAB)


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_speculative_decoding_reproduces_the_target_joint_distribution(small_pair, setting):
    target, draft = small_pair
    sampling, length, batch = SETTINGS[setting], 3, 6000
    ids = torch.tensor([PROMPT]).expand(batch, -1)
    out = specdec.Decoder(target, specdec.ModelDrafter(draft), Speculative(), specdec.FixedLength(2), sampling).generate(
        ids, max_new_tokens=length, seed=1)
    assert 0.05 < out.stats.acceptance_rate < 0.95  # drafts are both kept and rejected: rollback is exercised
    assert len(out.stats.per_position) == 2 and min(out.stats.per_position) > 0  # both draft positions verified
    exact = exact_joint(target, PROMPT, sampling, length)
    assert chi_square_p_value(continuation_codes(out.tokens, length, SMALL_VOCAB), exact) > SIGNIFICANCE


def test_end_to_end_test_rejects_an_always_accept_rule(small_pair):
    target, draft = small_pair
    sampling, length, batch = SETTINGS["t1"], 3, 6000
    ids = torch.tensor([PROMPT]).expand(batch, -1)
    out = specdec.Decoder(target, specdec.ModelDrafter(draft), AlwaysAccept(), specdec.FixedLength(2), sampling).generate(
        ids, max_new_tokens=length, seed=1)
    exact = exact_joint(target, PROMPT, sampling, length)
    assert chi_square_p_value(continuation_codes(out.tokens, length, SMALL_VOCAB), exact) < SIGNIFICANCE


def test_baseline_sampling_reproduces_the_target_joint_distribution(small_pair):
    target, _ = small_pair
    sampling = SETTINGS["t1"]
    ids = torch.tensor([PROMPT]).expand(6000, -1)
    out = specdec.generate(target, ids, temperature=1.0, max_new_tokens=3, seed=2)
    exact = exact_joint(target, PROMPT, sampling, 3)
    assert chi_square_p_value(continuation_codes(out.tokens, 3, SMALL_VOCAB), exact) > SIGNIFICANCE
