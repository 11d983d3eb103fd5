"""Block verification (specdec.BlockVerification) is lossless, and a block rule with the token-wise residual is not.

Three levels. One step on tables: random prefix-dependent p and q over a tiny vocabulary, drafts sampled from q,
one call of the rule, its output continued from p to k + 1 tokens, the joint against p's exact joint (a wrong
residual shows here at once). Through the real loop: ``check_lossless`` on both drivers and under every sampling
setting the lossless tests use. At temperature 0: the baseline's greedy tokens, token for token.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPT, SMALL_VOCAB, hf_greedy, left_pad, random_prompts, tiny_gpt2
from specdec.block import BlockVerification, prefix_weights
from specdec.sampling import sample
from specdec.testing import check_lossless, chi_square_p_value, continuation_codes, exact_joint
from test_distribution import SETTINGS

SIGNIFICANCE = 1e-4


def prefix_tables(vocab: int, depth: int, seed: int, sharpness: float = 2.0) -> list[torch.Tensor]:
    """[V ** d, V] for d = 0..depth: a random distribution after every prefix of d tokens (prefix as a base-V code)."""
    g = torch.Generator().manual_seed(seed)
    tables = []
    for d in range(depth + 1):
        table = torch.rand(vocab ** d, vocab, generator=g, dtype=torch.float64).pow(sharpness)
        tables.append(table / table.sum(-1, keepdim=True))
    return tables


def one_step_then_target(rule, p: list[torch.Tensor], q: list[torch.Tensor], k: int, batch: int, seed: int
                         ) -> torch.Tensor:
    """Draft k tokens from the q tables, verify once with ``rule`` against the p tables, continue each row from p
    until it holds k + 1 tokens. Returns [batch] the k + 1 tokens of each row as one base-V code."""
    vocab = p[0].shape[-1]
    g = torch.Generator().manual_seed(seed)
    code = torch.zeros(batch, dtype=torch.long)  # [B] the prefix drafted so far
    tokens, draft_probs, target_probs = [], [], []
    for d in range(k):
        q_here = q[d][code]  # [B, V]
        token = sample(q_here, g)  # [B]
        target_probs.append(p[d][code])
        draft_probs.append(q_here)
        tokens.append(token)
        code = code * vocab + token
    target_probs.append(p[k][code])
    draft_tokens = torch.stack(tokens, 1)  # [B, k]
    verdict = rule(draft_tokens, torch.stack(draft_probs, 1), torch.stack(target_probs, 1), g)
    rows = torch.arange(batch)
    kept = torch.arange(k + 1) < verdict.num_accepted.unsqueeze(1)  # [B, k+1]
    out = torch.cat([draft_tokens, draft_tokens[:, :1]], 1)  # [B, k+1]
    out[rows, verdict.num_accepted] = verdict.next_token
    code = torch.zeros(batch, dtype=torch.long)
    for d in range(k + 1):  # past the emitted tokens, continue from p
        emitted = kept[:, d] | (verdict.num_accepted == d)
        token = torch.where(emitted, out[:, d], sample(p[d][code], g))  # [B]
        code = code * vocab + token
    return code


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("k", [1, 3])
def test_one_step_on_prefix_tables_follows_the_target_joint(k, seed):
    vocab = 4
    p, q = prefix_tables(vocab, k, seed), prefix_tables(vocab, k, seed + 100)
    codes = one_step_then_target(BlockVerification(), p, q, k, batch=200_000, seed=seed)
    assert chi_square_p_value(codes, joint_of(p)) > SIGNIFICANCE


@pytest.mark.parametrize("k", [3, 4])
def test_one_step_catches_the_tokenwise_residual(k):
    """At k = 2 the wrong residual is rarely drawn with a weight below 1 (p > 0.05 on these tables); from k = 3 on
    it is far off."""
    vocab = 4
    p, q = prefix_tables(vocab, k, 0), prefix_tables(vocab, k, 100)
    codes = one_step_then_target(BlockVerification(residual="tokenwise"), p, q, k, batch=200_000, seed=0)
    assert chi_square_p_value(codes, joint_of(p)) < 1e-12


def joint_of(tables: list[torch.Tensor]) -> torch.Tensor:
    """[V ** (depth + 1)] the exact joint of depth + 1 tokens drawn from the prefix tables."""
    joint = torch.ones(1, dtype=torch.float64)
    for table in tables:
        joint = (joint.unsqueeze(1) * table).flatten()
    return joint


def test_prefix_weights_follow_the_recursion():
    g = torch.Generator().manual_seed(3)
    p_of_draft, q_of_draft = torch.rand(64, 6, generator=g), torch.rand(64, 6, generator=g)
    p_of_draft[:5, 2] = 0  # a draft the target rules out: the weight stays 0 from there
    expected = [torch.ones(64)]
    for i in range(6):
        expected.append((expected[-1] * p_of_draft[:, i] / q_of_draft[:, i]).clamp(max=1))
    assert torch.allclose(prefix_weights(p_of_draft, q_of_draft), torch.stack(expected, 1), atol=1e-6)
    assert bool((prefix_weights(p_of_draft, q_of_draft)[:5, 3:] == 0).all())


def test_never_accepts_fewer_than_tokenwise_in_expectation():
    """On the same tables, block verification keeps at least as many drafts on average (the paper's Theorem 2)."""
    k, vocab, batch = 4, 4, 100_000
    p, q = prefix_tables(vocab, k, 5), prefix_tables(vocab, k, 105)
    kept = {}
    for rule in (BlockVerification(), specdec.Speculative()):
        codes = one_step_then_target(lambda *args: record(kept, rule, *args), p, q, k, batch, seed=5)
        assert codes.numel() == batch
    assert kept["block"] > kept["speculative"] + 0.02


def record(kept: dict, rule, *args):
    verdict = rule(*args)
    kept[rule.name] = verdict.num_accepted.double().mean().item()
    return verdict


@pytest.mark.parametrize("step", ["host", "device"])
def test_check_lossless_accepts_block_verification_on_both_drivers(step):
    report = check_lossless(BlockVerification(), k=3, step=step)
    assert report.lossless and 0.05 < report.acceptance_rate < 0.95


@pytest.mark.slow
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_block_verification_reproduces_the_target_joint_under_each_sampling_setting(setting):
    target, draft = tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(11, layers=1, vocab=SMALL_VOCAB, init=0.1)
    sampling, length = SETTINGS[setting], 3
    ids = torch.tensor([PROMPT]).expand(6000, -1)
    out = specdec.Decoder(target, specdec.ModelDrafter(draft), BlockVerification(), specdec.FixedLength(3),
                          sampling).generate(ids, max_new_tokens=length, seed=1)
    assert chi_square_p_value(continuation_codes(out.tokens, length, SMALL_VOCAB),
                              exact_joint(target, PROMPT, sampling, length)) > SIGNIFICANCE


@pytest.mark.slow
def test_the_loop_catches_the_tokenwise_residual():
    """A peaky draft far from the target: the weight often drops below 1, where the wrong residual differs."""
    target, draft = tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(12, layers=1, vocab=SMALL_VOCAB, init=0.3)
    report = check_lossless(BlockVerification(residual="tokenwise"), k=4, samples=20_000, target=target, draft=draft)
    assert not report.lossless


@pytest.mark.parametrize("step", ["host", "device"])
def test_greedy_at_temperature_zero_equals_the_baseline(target, draft, step):
    prompts = random_prompts([3, 11, 7], seed=4)
    ids, mask = left_pad(prompts)
    out = specdec.Decoder(target, specdec.ModelDrafter(draft), BlockVerification(), specdec.FixedLength(4),
                          step=step).generate(ids, mask, max_new_tokens=20)
    assert out.tokens == [hf_greedy(target, prompt, 20) for prompt in prompts]
    assert 0 < out.stats.accepted < out.stats.drafted


def test_on_point_masses_the_rule_is_greedy_matching():
    """Called with one-hot distributions (as a custom loop would), the verdict is greedy matching's."""
    g = torch.Generator().manual_seed(0)
    batch, k, vocab = 500, 5, 6
    target_choice = torch.randint(vocab, (batch, k + 1), generator=g)
    draft_tokens = torch.where(torch.rand(batch, k, generator=g) < 0.7, target_choice[:, :k],
                               torch.randint(vocab, (batch, k), generator=g))
    one_hot = torch.nn.functional.one_hot
    verdict = BlockVerification()(draft_tokens, one_hot(draft_tokens, vocab).double(),
                                  one_hot(target_choice, vocab).double(), g)
    expected = specdec.Greedy()(draft_tokens, None, one_hot(target_choice, vocab).double(), g)
    assert torch.equal(verdict.num_accepted, expected.num_accepted)
    assert torch.equal(verdict.next_token, expected.next_token)


def test_an_unknown_residual_is_refused():
    with pytest.raises(ValueError, match="residual must be one of block, tokenwise, got 'wrong'"):
        BlockVerification(residual="wrong")


def test_greedy_decoding_through_hydra_names(target, draft):
    assert specdec.make_strategy("block") == BlockVerification()
    out = specdec.generate(target, torch.tensor([PROMPT]), draft=draft, strategy="block", k=3, max_new_tokens=8)
    assert out.tokens == [hf_greedy(target, PROMPT, 8)]
