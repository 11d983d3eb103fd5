"""Traversal verification (specdec.Traversal) of token trees is lossless, and a variant with the token-wise
residual is not. One step on prefix tables (random p and q after every prefix, a static tree of i.i.d. children,
one call, the output continued from p, the joint against p's); the real loop on static and dynamic trees; greedy
at temperature 0; block verification on a chain; never fewer kept drafts than top-down on the same trees."""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import SMALL_VOCAB, hf_greedy, left_pad, random_prompts, tiny_gpt2
from specdec.block import BlockVerification
from specdec.sampling import sample
from specdec.strategies import Speculative
from specdec.testing import check_lossless, chi_square_p_value
from specdec.traversal import Traversal
from specdec.tree import tree_shape
from test_verification_block import joint_of, one_step_then_target, prefix_tables

SIGNIFICANCE = 1e-4


def one_tree_step_then_target(judge, branching, p, q, batch: int, seed: int) -> tuple[torch.Tensor, float]:
    """Draft the static tree ``branching`` from the q tables (each node's children i.i.d. draws of q there), judge
    it once against the p tables, continue each row from p to d + 1 tokens. Returns [batch] base-V codes of those
    tokens and the mean number of kept drafts."""
    vocab, depth = p[0].shape[-1], len(branching)
    shape = tree_shape(branching)
    g = torch.Generator().manual_seed(seed)
    codes = [torch.zeros(batch, dtype=torch.long)]  # [B] per position: its prefix as a base-V code
    tokens, draft_probs = [], []
    level = [0]
    for d, b in enumerate(branching):
        next_level = []
        for parent in level:
            q_here = q[d][codes[parent]]  # [B, V]
            draft_probs.append(q_here)
            for _ in range(b):
                token = sample(q_here, g)
                tokens.append(token)
                codes.append(codes[parent] * vocab + token)
                next_level.append(len(codes) - 1)
        level = next_level
    target_probs = torch.stack([p[int(shape.depth[i - 1]) if i else 0][codes[i]] for i in range(len(codes))], 1)
    tokens = torch.stack(tokens, 1)  # [B, N]
    verdict = judge(shape, tokens, torch.stack(draft_probs, 1), target_probs, g)
    code = torch.zeros(batch, dtype=torch.long)
    path_tokens = tokens.gather(1, (verdict.path - 1).clamp_min(0))  # [B, d]
    for d in range(depth + 1):
        from_path = d < verdict.num_accepted
        token = torch.where(from_path, path_tokens[:, min(d, depth - 1)],
                            torch.where(verdict.num_accepted == d, verdict.next_token, sample(p[d][code], g)))
        code = code * vocab + token
    return code, verdict.num_accepted.double().mean().item()


@pytest.mark.parametrize("branching", [(2, 2), (3, 1), (2, 1, 1)], ids=str)
def test_one_step_on_prefix_tables_follows_the_target_joint(branching):
    vocab = 4
    p, q = prefix_tables(vocab, len(branching), 1), prefix_tables(vocab, len(branching), 101)
    codes, _ = one_tree_step_then_target(Traversal().judge_tree, branching, p, q, 100_000, seed=1)
    assert chi_square_p_value(codes, joint_of(p)) > SIGNIFICANCE


@pytest.mark.parametrize("branching", [(2, 2), (2, 1, 1)], ids=str)
def test_one_step_catches_the_tokenwise_residual(branching):
    vocab = 4
    p, q = prefix_tables(vocab, len(branching), 1), prefix_tables(vocab, len(branching), 101)
    codes, _ = one_tree_step_then_target(Traversal(residual="tokenwise").judge_tree, branching, p, q, 200_000, 1)
    assert chi_square_p_value(codes, joint_of(p)) < 1e-12


def test_keeps_at_least_as_many_drafts_as_top_down():
    branching, vocab = (2, 2, 1), 4
    p, q = prefix_tables(vocab, 3, 2), prefix_tables(vocab, 3, 102)
    _, traversal = one_tree_step_then_target(Traversal().judge_tree, branching, p, q, 100_000, seed=2)
    _, top_down = one_tree_step_then_target(Speculative().judge_tree, branching, p, q, 100_000, seed=2)
    assert traversal > top_down + 0.01


def test_on_a_chain_it_keeps_what_block_verification_keeps():
    k, vocab, batch = 3, 4, 200_000
    p, q = prefix_tables(vocab, k, 3), prefix_tables(vocab, k, 103)
    _, as_tree = one_tree_step_then_target(Traversal().judge_tree, (1,) * k, p, q, batch, seed=3)
    kept = []
    one_step_then_target(lambda *args: record(kept, BlockVerification()(*args)), p, q, k, batch, seed=4)
    assert as_tree == pytest.approx(kept[0], abs=0.01)  # a few standard errors (about 0.002 each)


def record(kept: list, verdict):
    kept.append(verdict.num_accepted.double().mean().item())
    return verdict


def test_check_lossless_accepts_traversal_on_a_static_tree():
    report = check_lossless(Traversal(), make_drafter=lambda d, t: specdec.TreeDrafter(d, (2, 2, 1)), k=3)
    assert report.lossless and 0.05 < report.acceptance_rate < 0.95


def test_check_lossless_accepts_traversal_on_a_dynamic_tree():
    """Siblings drawn without replacement: q loses each given-up sibling's token."""
    report = check_lossless(Traversal(), make_drafter=lambda d, t: specdec.DynamicTreeDrafter(d, 6, 3, 2), k=3)
    assert report.lossless


@pytest.mark.slow
def test_the_loop_catches_the_tokenwise_residual():
    target, draft = tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(12, layers=1, vocab=SMALL_VOCAB, init=0.3)
    report = check_lossless(Traversal(residual="tokenwise"), make_drafter=lambda d, t: specdec.TreeDrafter(d, (2, 1, 1)),
                            k=3, samples=20_000, target=target, draft=draft)
    assert not report.lossless


def test_greedy_at_temperature_zero_equals_transformers(target, draft):
    prompts = random_prompts([4, 9, 2], seed=6)
    ids, mask = left_pad(prompts)
    for drafter in (specdec.TreeDrafter(draft, (2, 2, 1)), specdec.DynamicTreeDrafter(draft, 8, 3, 2)):
        out = specdec.generate(target, ids, draft=drafter, attention_mask=mask, strategy="traversal", k=3,
                               max_new_tokens=16)
        assert out.tokens == [hf_greedy(target, prompt, 16) for prompt in prompts]
