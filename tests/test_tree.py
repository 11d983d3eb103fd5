"""Token trees: the shape, one-forward verification under the ancestor mask, greedy equality with transformers for
several shapes (batch 1 and ragged, draft = target and an unrelated draft), the tree rules, and losslessness
through the real loop (a deliberately wrong rule fails the same test; the public check agrees)."""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.cache import CachedModel, TreeFeed
from specdec.sampling import SamplingConfig, sample
from specdec.strategies import Speculative
from specdec.testing import chi_square_p_value, check_lossless, continuation_codes, exact_joint
from specdec.rules import first_accepted_path, greedy_tree, speculative_tree
from specdec.layout import nodes_on_path
from specdec.tree import tree_shape
from specdec.types import Verdict
from conftest import PROMPT, SMALL_VOCAB, hf_greedy, left_pad, tiny_gpt2
from test_distribution import SETTINGS

SIGNIFICANCE = 1e-3
SHAPES = [(1, 1, 1), (2, 2, 1), (3, 1, 2)]


@pytest.fixture(scope="module")
def target():
    return tiny_gpt2(seed=0, init=0.2)


@pytest.fixture(scope="module")
def unrelated():
    return tiny_gpt2(seed=1, layers=1, init=0.2)


def test_tree_shape_breadth_first():
    shape = tree_shape((2, 2, 1))
    assert shape.num_nodes == 2 + 4 + 4 and shape.level_sizes == (2, 4, 4) and shape.num_internal == 7
    assert shape.parent.tolist() == [0, 0, 1, 1, 2, 2, 3, 4, 5, 6]
    assert shape.depth.tolist() == [1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    assert shape.children[0].tolist() == [1, 2] and shape.children[2].tolist() == [5, 6]
    assert shape.children[7].tolist() == [-1, -1]  # a leaf
    assert shape.ancestors[9].nonzero().flatten().tolist() == [0, 2, 5, 9]  # root, grandparent, parent, itself
    with pytest.raises(ValueError, match=r"branching must be a non-empty list of integers >= 1.*\[2, 0\]"):
        tree_shape((2, 0))


def test_every_node_sees_exactly_its_path(target):
    """One forward over the tree equals decoding each node's path on its own."""
    shape = tree_shape((2, 2))
    prompt = torch.tensor([[5, 6, 7, 8]])
    cache = CachedModel(target, "target", forward="transformers").new_cache(1, 64, prompt.device)
    body = prompt[:, :-1]
    cache.feed(body, logit_columns=torch.arange(0))
    cache.keep(torch.ones_like(body, dtype=torch.bool), prefix=True, max_kept=body.shape[1])
    nodes = torch.tensor([[10, 11, 12, 13, 14, 15]])
    ids = torch.cat([prompt[:, -1:], nodes], 1)  # the root (pending token), then the nodes
    logits = cache.feed(ids, tree=TreeFeed(shape.depth_offsets, shape.ancestors)).logits  # [1, 7, V]
    for position in range(shape.num_nodes + 1):
        path = shape.ancestors[position].nonzero().flatten().tolist()[1:]  # positions below the root
        alone = torch.cat([prompt, nodes[:, [p - 1 for p in path]]], 1)
        assert torch.allclose(logits[0, position], target(alone).logits[0, -1], atol=1e-12), position


@pytest.mark.parametrize("branching", SHAPES, ids=str)
@pytest.mark.parametrize("draft_is_target", [True, False], ids=["draft=target", "unrelated draft"])
def test_greedy_tree_decoding_equals_transformers(target, unrelated, branching, draft_is_target):
    draft = target if draft_is_target else unrelated
    prompts = [[4, 5, 6], [7, 8, 9, 10, 11], [12]]
    ids, mask = left_pad(prompts)
    for batch in ([0], [0, 1, 2]):  # batch 1, then a ragged batch
        out = specdec.generate(target, ids[batch][:, -max(len(prompts[i]) for i in batch):],
                               draft=specdec.TreeDrafter(draft, branching),
                               attention_mask=mask[batch][:, -max(len(prompts[i]) for i in batch):],
                               k=8, max_new_tokens=20)
        assert out.tokens == [hf_greedy(target, prompts[i], 20) for i in batch]
    if draft_is_target:  # every call accepts a full path: depth + 1 tokens per call but at the very end
        assert out.stats.per_position[: len(branching)] == [1.0] * len(branching)


def test_greedy_tree_stops_at_eos_and_equals_transformers(target, unrelated):
    prompt = [7, 8, 9]
    reference = hf_greedy(target, prompt, 24)
    eos = reference[5]
    out = specdec.generate(target, torch.tensor([prompt]), draft=specdec.TreeDrafter(unrelated, (2, 2, 1)), k=3,
                           max_new_tokens=24, eos_token_id=eos)
    assert out.tokens[0] == reference[: reference.index(eos) + 1]


def test_k_is_the_depth_a_step_drafts(target):
    out = specdec.generate(target, torch.tensor([[4, 5, 6]]), draft=specdec.TreeDrafter(target, (2, 2, 1)), k=2,
                           max_new_tokens=12)
    assert len(out.stats.per_position) == 2  # two of the three levels
    verifications = out.stats.target_calls  # the first, with the prefill, verifies a tree too
    # 6 nodes per step (2 + 4), but the last step may draft fewer levels (the budget bounds k)
    assert 6 * (verifications - 1) < out.stats.drafted <= 6 * verifications


def test_first_accepted_path_takes_the_first_accepted_child_at_each_depth():
    shape = tree_shape((2, 2))  # positions: 1, 2 | children of 1: 3, 4; of 2: 5, 6
    accepted = torch.tensor([
        [0, 1, 0, 0, 1, 1],  # 2, then its first accepted child 5
        [1, 1, 0, 0, 1, 1],  # 1 (first), whose children are rejected: depth 1 only
        [0, 0, 1, 1, 1, 1],  # no root child: nothing, however its grandchildren fare
    ], dtype=torch.bool)
    num_accepted, path, end = first_accepted_path(shape, accepted)
    assert num_accepted.tolist() == [2, 1, 0]
    assert path.tolist() == [[2, 5], [1, 0], [0, 0]] and end.tolist() == [5, 1, 0]
    assert nodes_on_path(path, torch.tensor([2, 2, 0]), 6).long().tolist() == [
        [0, 1, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0], [0] * 6]
    assert nodes_on_path(path, torch.tensor([1, 0, 0]), 6)[:2].long().tolist() == [
        [0, 1, 0, 0, 0, 0], [0] * 6]  # EOS or the budget cut the path; a finished row keeps no node


def test_greedy_tree_verdict_on_ids():
    shape = tree_shape((2, 1))  # positions 1, 2 | 3 (child of 1), 4 (child of 2)
    tokens = torch.tensor([[7, 8, 5, 6]])
    target_choice = torch.tensor([[8, 1, 6, 9, 4]])  # argmax at positions 0..4
    verdict = greedy_tree(shape, tokens, target_choice)
    assert isinstance(verdict, Verdict)
    assert verdict.num_accepted.tolist() == [2] and verdict.path.tolist() == [[2, 4]]
    assert verdict.next_token.tolist() == [4]  # the argmax at the path's end


def test_speculative_tree_with_draft_equal_to_target_accepts_every_path():
    shape = tree_shape((2, 2))
    g = torch.Generator().manual_seed(0)
    p = torch.rand(shape.num_nodes + 1, 6, generator=g).softmax(-1)
    batch = 2000
    q = p[: shape.num_internal].expand(batch, -1, -1)  # q = p at every internal position
    tokens = torch.stack([sample(q[:, parent], g) for parent in shape.parent.tolist()], 1)  # [B, N]
    verdict = speculative_tree(shape, tokens, q, p.expand(batch, -1, -1), g)
    assert bool((verdict.num_accepted == 2).all()) and bool((verdict.path[:, 0] == 1).all())  # the first child


def test_synthetic_tree_on_a_chain_accepts_each_depth_with_its_rate():
    shape = tree_shape((1, 1, 1))
    batch, rate = 40_000, 0.6
    tokens = torch.zeros(batch, 3, dtype=torch.long)
    verdict = specdec.SyntheticAcceptance(rate).tree_verdict_from_ids(
        shape, tokens, torch.zeros(batch, 4, dtype=torch.long), torch.Generator().manual_seed(3))
    for depth in (1, 2, 3):
        assert float((verdict.num_accepted >= depth).double().mean()) == pytest.approx(rate ** depth, abs=0.01)


@pytest.mark.parametrize("strategy", [specdec.Typical(), specdec.TopK(n=2)], ids=["typical", "topk"])
def test_nodewise_rules_accept_the_first_child_that_passes_their_own_test(strategy):
    """p at the root is [0.5, 0.3, 0.15, 0.05]: typical's threshold is min(0.09, 0.3 exp(-H)) = 0.09, so tokens 0-2
    pass it; top-2 passes tokens 0 and 1."""
    shape = tree_shape((2,))
    p = torch.tensor([[[0.5, 0.3, 0.15, 0.05]] + [[0.25] * 4] * 2])  # [1, 3, 4]: the root, then two leaves
    passes = {0, 1, 2} if isinstance(strategy, specdec.Typical) else {0, 1}
    for children in ([2, 0], [3, 2], [0, 3], [3, 3]):
        verdict = strategy.judge_tree(shape, torch.tensor([children]), None, p, torch.Generator().manual_seed(0))
        first = next((i + 1 for i, token in enumerate(children) if token in passes), 0)
        assert verdict.path.tolist() == [[first]] and verdict.num_accepted.tolist() == [int(first > 0)]


@pytest.mark.slow
def test_the_public_check_on_its_own_models():
    assert check_lossless(Speculative()).lossless
    assert not check_lossless(Speculative(lenience=0.3)).lossless
    with pytest.raises(ValueError, match="temperature > 0"):
        check_lossless(Speculative(), sampling=SamplingConfig(temperature=0.0))


def test_trees_need_a_tree_rule_and_the_dynamic_layout(target, unrelated):
    """transformers' static cache cannot take a tree's mask, and nothing compiled verifies trees; the lean cache
    (preallocated, whatever ``cache_layout`` says of transformers' caches) verifies them."""
    drafter = specdec.TreeDrafter(unrelated, (2, 2))
    with pytest.raises(ValueError, match="token trees run on the dynamic cache layout"):
        specdec.Decoder(target, drafter, cache_layout="static", forward="transformers")
    with pytest.raises(ValueError, match="token trees run on the dynamic cache layout"):
        specdec.Decoder(target, drafter, compile=True)
    assert specdec.Decoder(target, drafter, cache_layout="static").runner.is_lean

    def plain_rule(draft_tokens, draft_probs, target_probs, generator):
        raise AssertionError("never called")

    with pytest.raises(ValueError, match="has no rule for token trees"):
        specdec.Decoder(target, drafter, plain_rule)


# --- losslessness through the real loop -----------------------------------------------------------------------



@pytest.fixture(scope="module")
def small_pair():
    """A target and a draft that differ enough (acceptance ~0.3) for a wrong rule to show within 6000 samples."""
    return tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(12, layers=1, vocab=SMALL_VOCAB, init=0.1)


class NoResidualBetweenSiblings(Speculative):
    """Wrong: tries each sibling against p itself instead of the residual left by the siblings before it."""

    def judge_tree(self, shape, tokens, draft_probs, target_probs, generator):
        batch = tokens.shape[0]
        rows = torch.arange(batch)
        node = torch.zeros(batch, dtype=torch.long)
        alive = torch.ones(batch, dtype=torch.bool)
        path = []
        for b in shape.branching:
            q, p = draft_probs[rows, node], target_probs[rows, node]  # [B, V]
            searching = alive.clone()
            for s in range(b):
                child = shape.children[node, s]
                token = tokens[rows, (child - 1).clamp_min(0)]
                accept = searching & (torch.rand(batch, generator=generator) * q[rows, token] < p[rows, token])
                node = torch.where(accept, child, node)
                searching = searching & ~accept
            alive = alive & ~searching
            path.append(torch.where(alive, node, 0))
        residual = (target_probs[rows, node] - draft_probs[rows, node.clamp(max=draft_probs.shape[1] - 1)]
                    ).clamp_min(0)
        residual = torch.where(alive.unsqueeze(1), target_probs[rows, node], residual)
        path = torch.stack(path, 1)
        return Verdict((path > 0).sum(-1), sample(residual, generator), path)


def tree_p_value(target, draft, strategy, branching, sampling, samples=6000, length=3) -> tuple[float, object]:
    ids = torch.tensor([PROMPT]).expand(samples, -1)
    decoder = specdec.Decoder(target, specdec.TreeDrafter(draft, branching), strategy, specdec.FixedLength(3),
                              sampling)
    out = decoder.generate(ids, max_new_tokens=length, seed=1)
    exact = exact_joint(target, PROMPT, sampling, length)
    return chi_square_p_value(continuation_codes(out.tokens, length, SMALL_VOCAB), exact), out.stats


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("branching", [(2, 2), (3, 1, 2)], ids=str)
def test_speculative_trees_reproduce_the_target_joint_distribution(small_pair, branching, setting):
    target, draft = small_pair
    p_value, stats = tree_p_value(target, draft, Speculative(), branching, SETTINGS[setting])
    assert 0 < stats.accepted < stats.drafted  # nodes both kept and rejected: the tree rollback is exercised
    assert p_value > SIGNIFICANCE


@pytest.mark.parametrize("wrong_rule", [NoResidualBetweenSiblings(), Speculative(lenience=0.5)],
                         ids=["no-residual-between-siblings", "lenience-0.5"])
def test_wrong_tree_rules_fail_the_same_test(small_pair, wrong_rule):
    target, draft = small_pair
    p_value, _ = tree_p_value(target, draft, wrong_rule, (3, 1, 2), SETTINGS["t1"])
    assert p_value < SIGNIFICANCE


@pytest.mark.parametrize("rule, lossless", [(Speculative(), True), (NoResidualBetweenSiblings(), False)],
                         ids=["speculative", "no-residual-between-siblings"])
def test_the_public_check_gives_the_same_verdict(small_pair, rule, lossless):
    target, draft = small_pair
    p_value, _ = tree_p_value(target, draft, rule, (3, 1, 2), SETTINGS["t1"])
    report = check_lossless(rule, make_drafter=lambda d, t: specdec.TreeDrafter(d, (3, 1, 2)), k=3, target=target,
                            draft=draft)
    assert report.p_value == pytest.approx(p_value) and report.lossless is lossless


@pytest.mark.slow
def test_a_sweep_of_chains_and_trees_records_the_shape_and_reports_them_side_by_side(tmp_path, monkeypatch):
    import sys
    from pathlib import Path

    from analysis import load_runs, report
    from experiments import run as run_app

    sweep = tmp_path / "sweep"
    monkeypatch.setattr(sys, "argv", [
        str(Path(run_app.__file__)), "-m", "drafter=model,tree,dynamic_tree", "draft_length.k=2", "num_prompts=2",
        "max_new_tokens=8", "warmup=0", "device=cpu", "threads=1", f"hydra.sweep.dir={sweep}",
    ])
    run_app.main()
    frame = load_runs(sweep)
    trees = frame[frame["drafter"] == "tree"]
    assert set(trees["drafter_branching"]) == {"2-2-1-1"} and trees["predicted_speedup"].isna().all()
    assert (trees["drafted"] <= 6 * trees["target_calls"]).all() and (trees["drafted"] > 0).all()  # 2 + 4 nodes
    assert report.main([str(sweep)]) == 0
    dynamic = frame[frame["drafter"] == "dynamic_tree"]
    assert (dynamic["drafted"] <= 16 * dynamic["target_calls"]).all() and dynamic["predicted_speedup"].isna().all()
    text = (sweep / "report.md").read_text()
    section = text.split("## Trees against chains")[1].split("## Acceptance")[0]
    assert "drafter=model" in section and "drafter=tree" in section and "drafter=dynamic_tree" in section
    assert "accepted_histogram.png" in text and (sweep / "accepted_histogram.png").exists()
    for histogram, accepted in zip(frame["accepted_histogram"], frame["accepted"]):
        assert sum(j * steps for j, steps in enumerate(histogram)) == accepted
