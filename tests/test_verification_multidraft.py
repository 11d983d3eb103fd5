"""Multi-draft speculative decoding: ``ModelDrafter(draft, num_drafts=n)`` drafts n independent chains per row, one
token tree verified by recursive rejection sampling (``rules.speculative_tree``). Lossless through the real loop
on both drivers' settings, greedy at temperature 0, and a rule that judges the i.i.d. chains as if drawn without
replacement (the dynamic tree's rule, on the wrong drafts) is caught."""

from __future__ import annotations

import pytest
import torch

import specdec
from conftest import PROMPT, SMALL_VOCAB, hf_greedy, left_pad, random_prompts, tiny_gpt2
from specdec.strategies import Speculative
from specdec.testing import check_lossless, chi_square_p_value, continuation_codes, exact_joint
from test_distribution import SETTINGS
from test_tree import NoResidualBetweenSiblings

SIGNIFICANCE = 1e-4


def chains(n: int):
    return lambda draft, target: specdec.ModelDrafter(draft, num_drafts=n)


def test_the_chains_are_one_tree_of_independent_draws(draft):
    drafter = specdec.ModelDrafter(draft, num_drafts=3)
    drafter.start(torch.tensor([PROMPT]), torch.ones(1, len(PROMPT), dtype=torch.long))
    proposal = drafter.propose(4, specdec.SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert proposal.layout.shape.branching == (3, 1, 1, 1) and proposal.tokens.shape == (1, 12)
    assert proposal.probs.shape == (1, 10, draft.config.vocab_size)  # q at the root and at the 9 inner nodes
    assert proposal.layout.shape.parent[3:].tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9]  # each chain under its own


@pytest.mark.parametrize("setting", ["t1", pytest.param("t0.7-topk5", marks=pytest.mark.slow)])
def test_check_lossless_accepts_four_chains(setting):
    report = check_lossless(Speculative(), make_drafter=chains(4), k=2, sampling=SETTINGS[setting])
    assert report.lossless and 0.05 < report.acceptance_rate < 0.95


@pytest.mark.slow
def test_four_chains_reproduce_the_target_joint_at_top_p():
    target, draft = tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(11, layers=1, vocab=SMALL_VOCAB, init=0.1)
    sampling, length = SETTINGS["t1.3-topp0.8"], 3
    ids = torch.tensor([PROMPT]).expand(6000, -1)
    out = specdec.Decoder(target, specdec.ModelDrafter(draft, num_drafts=4), Speculative(), specdec.FixedLength(2),
                          sampling).generate(ids, max_new_tokens=length, seed=2)
    assert chi_square_p_value(continuation_codes(out.tokens, length, SMALL_VOCAB),
                              exact_joint(target, PROMPT, sampling, length)) > SIGNIFICANCE


def test_the_check_catches_a_rule_without_the_residual_between_chains():
    assert not check_lossless(NoResidualBetweenSiblings(), make_drafter=chains(4), k=2).lossless


def test_greedy_chains_equal_transformers(target, draft):
    prompts = random_prompts([3, 12, 6], seed=5)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, draft=specdec.ModelDrafter(draft, num_drafts=3), attention_mask=mask, k=4,
                           max_new_tokens=20)
    assert out.tokens == [hf_greedy(target, prompt, 20) for prompt in prompts]
    assert 0 < out.stats.accepted


def test_more_chains_keep_more_drafts(target, draft):
    """At temperature 1 on the same prompts, 4 chains keep more drafts per call than 1 (the point of drafting them)."""
    ids = torch.tensor([PROMPT]).expand(400, -1)
    sampling = specdec.SamplingConfig(temperature=1.0)
    tau = {n: specdec.Decoder(target, specdec.ModelDrafter(draft, num_drafts=n), Speculative(), specdec.FixedLength(3),
                              sampling).generate(ids, max_new_tokens=12, seed=3).stats.mean_accepted_length
           for n in (1, 4)}
    assert tau[4] > tau[1] * 1.03


@pytest.mark.parametrize("options, message", [
    ({"num_drafts": 0}, "num_drafts must be an integer >= 1 (independent draft chains per row), got 0"),
    ({"num_drafts": 2, "cache_layout": "static"}, "num_drafts=2 drafts a token tree, which runs eager"),
    ({"num_drafts": 2, "compile": True}, "num_drafts=2 drafts a token tree, which runs eager"),
    ({"num_drafts": 200}, "num_drafts=200 gives a node 200 children, more than the draft's vocabulary"),
])
def test_bad_num_drafts_are_refused(draft, options, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        specdec.ModelDrafter(draft, **options)


def test_the_hydra_factory_takes_num_drafts(draft):
    pair = specdec.ModelPair(draft=draft, target=draft, tokenizer=None, name="tiny")
    assert specdec.ModelDrafter.from_pair(pair, num_drafts=2).num_drafts == 2
    with pytest.raises(ValueError, match="num_drafts must be an integer >= 1"):
        specdec.ModelDrafter.check_options(num_drafts=-1)
