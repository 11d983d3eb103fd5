"""Dynamic token trees (``specdec.DynamicTreeDrafter``): per-row trees built and verified in one forward under each
row's own mask, greedy equality with transformers (batch 1, ragged, EOS mid-tree, draft = target, an unrelated
draft; lean and transformers forwards), the per-row rules, and exactness at temperature > 0: the multi-draft rule
for siblings drawn without replacement on synthetic distributions, and the whole loop under check_lossless and the
chi-square test with top-k / top-p, where the variants that are not exact (reranking sampled siblings; the i.i.d.
residual on siblings drawn without replacement) fail."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch

import specdec
from specdec.cache import CachedModel, TreeFeed
from specdec.dynamic_tree import DynamicTreeDrafter, draws_without_replacement, level_plan
from specdec.rules import first_accepted_path, greedy_tree, speculative_tree
from specdec.sampling import SamplingConfig
from specdec.strategies import Speculative
from specdec.testing import chi_square_p_value, check_lossless
from specdec.tree import row_tree, tree_shape
from conftest import hf_greedy, left_pad, tiny_gpt2
from test_distribution import SETTINGS

SIGNIFICANCE = 1e-3
NEW_TOKENS = 20
SIZES = [(8, 3, 2), (6, 4, 3), (10, 2, 4)]  # (node_budget, depth, top_k)


@pytest.fixture(scope="module")
def target():
    return tiny_gpt2(seed=0, init=0.2)


@pytest.fixture(scope="module")
def unrelated():
    return tiny_gpt2(seed=1, layers=1, init=0.2)


def sharpened(model, factor: float = 40.0):
    """The model with its logits scaled by ``factor`` (the final norm's scale): the same argmax everywhere, and a
    first choice so likely that the path of argmaxes is the likeliest path at every depth."""
    sharp = copy.deepcopy(model)
    sharp.transformer.ln_f.weight.mul_(factor)
    sharp.transformer.ln_f.bias.mul_(factor)
    return sharp


# --- per-row trees and their rules -------------------------------------------------------------------------------


def test_row_tree_gives_each_row_its_own_children_depths_and_ancestors():
    parent = torch.tensor([[0, 0, 1, 1, 3],    # root -> 1, 2; 1 -> 3, 4; 3 -> 5
                           [0, 1, 2, 3, 0]])   # a chain 1 -> 2 -> 3 -> 4 and a second child of the root
    tree = row_tree(parent, (2, 2, 2, 2), distinct_siblings=True)
    assert tree.depth.tolist() == [[1, 1, 2, 2, 3], [1, 2, 3, 4, 1]]
    assert tree.children[0, 0].tolist() == [1, 2] and tree.children[0, 1].tolist() == [3, 4]
    assert tree.children[1, 0].tolist() == [1, 5] and tree.children[1, 3].tolist() == [4, -1]
    assert tree.ancestors[0, 5].nonzero().flatten().tolist() == [0, 1, 3, 5]
    assert tree.ancestors[1, 4].nonzero().flatten().tolist() == [0, 1, 2, 3, 4]


def test_a_static_shape_and_its_per_row_view_give_the_same_verdicts():
    shape = tree_shape((2, 2))
    parent = shape.parent.expand(3, -1)
    tree = row_tree(parent, shape.branching, distinct_siblings=False)
    assert torch.equal(tree.children, shape.children.expand(3, -1, -1))
    assert torch.equal(tree.depth, shape.depth.expand(3, -1))
    accepted = torch.tensor([[0, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    for a, b in zip(first_accepted_path(shape, accepted), first_accepted_path(tree, accepted)):
        assert torch.equal(a, b)


def test_greedy_matching_follows_each_rows_own_tree():
    tree = row_tree(torch.tensor([[0, 0, 1, 2], [0, 1, 1, 2]]), (2, 2, 2), distinct_siblings=False)
    tokens = torch.tensor([[7, 8, 5, 6], [7, 5, 6, 9]])
    target_choice = torch.tensor([[8, 1, 6, 9, 4],    # root wants 8 (node 2), node 2 wants 6 (node 4), then 4
                                  [7, 6, 9, 3, 0]])   # root wants 7 (node 1), node 1 wants 6 (node 3), then 3
    verdict = greedy_tree(tree, tokens, target_choice)
    assert verdict.path.tolist() == [[2, 4, 0], [1, 3, 0]] and verdict.num_accepted.tolist() == [2, 2]
    assert verdict.next_token.tolist() == [4, 3]  # the argmax at each path's end


def distinct_children_tokens(q: torch.Tensor, count: int, batch: int, seed: int) -> torch.Tensor:
    """[batch, count] children of one root drawn without replacement from q [V]."""
    return draws_without_replacement(q.expand(batch, -1), count, torch.Generator().manual_seed(seed))


def first_token_of_distinct_siblings(p: torch.Tensor, q: torch.Tensor, count: int, batch: int, seed: int,
                                     iid_residual: bool = False) -> torch.Tensor:
    """The first emitted token of a root with ``count`` children drawn without replacement from q, judged by the
    speculative tree rule (``iid_residual``: wrongly, as if they were i.i.d.)."""
    tree = row_tree(torch.zeros(batch, count, dtype=torch.long), (count,), distinct_siblings=not iid_residual)
    tokens = distinct_children_tokens(q, count, batch, seed)  # [B, count]
    vocab = p.shape[0]
    target_probs = torch.cat([p.expand(batch, 1, vocab), torch.full((batch, count, vocab), 1 / vocab)], 1)
    verdict = speculative_tree(tree, tokens, q.expand(batch, 1, -1), target_probs,
                               torch.Generator().manual_seed(seed + 1))
    accepted_child = tokens.gather(1, (verdict.path[:, 0] - 1).clamp_min(0).unsqueeze(1)).squeeze(1)
    return torch.where(verdict.num_accepted > 0, accepted_child, verdict.next_token)


def synthetic_p_q(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(vocab, generator=g).pow(3), torch.rand(vocab, generator=g).pow(3)
    q[0] = 0  # a token the draft never proposes: only a residual can emit it
    q[1] = 0
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("count", [2, 3, 6])  # 6 draws from a support of 4: the last two are no draws
def test_siblings_drawn_without_replacement_emit_the_target_distribution(count):
    p, q = synthetic_p_q(vocab=6, seed=count)
    tokens = first_token_of_distinct_siblings(p, q, count, batch=100_000, seed=count)
    assert chi_square_p_value(tokens, p) > SIGNIFICANCE


def test_the_iid_residual_on_siblings_drawn_without_replacement_fails_the_same_test():
    p, q = synthetic_p_q(vocab=6, seed=3)
    tokens = first_token_of_distinct_siblings(p, q, 3, batch=100_000, seed=3, iid_residual=True)
    assert chi_square_p_value(tokens, p) < SIGNIFICANCE


def test_draws_without_replacement_are_distinct_and_the_first_follows_q():
    q = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    draws = distinct_children_tokens(q, 3, 60_000, seed=0)
    assert bool((draws[:, 0] != draws[:, 1]).all() & (draws[:, 1] != draws[:, 2]).all() & (draws != 4).all())
    assert chi_square_p_value(draws[:, 0], q) > SIGNIFICANCE


# --- one forward over per-row trees ------------------------------------------------------------------------------


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_every_node_of_every_row_sees_exactly_its_own_path(target, forward):
    """One forward over a batch whose rows hold different trees equals decoding each node's path alone."""
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    parent = torch.tensor([[0, 0, 1, 2, 3], [0, 1, 2, 1, 0]])
    tree = row_tree(parent, (2, 2, 2), distinct_siblings=False)
    cache = CachedModel(target, "target", forward=forward).new_cache(2, 64, prompt.device)
    body = prompt[:, :-1]
    cache.feed(body, logit_columns=torch.arange(0))
    cache.keep(torch.ones_like(body, dtype=torch.bool), prefix=True, max_kept=body.shape[1])
    nodes = torch.tensor([[20, 21, 22, 23, 24], [30, 31, 32, 33, 34]])
    ids = torch.cat([prompt[:, -1:], nodes], 1)  # the root (pending token), then the nodes
    offsets = torch.cat([torch.zeros(2, 1, dtype=torch.long), tree.depth], 1)  # [B, N+1]
    logits = cache.feed(ids, tree=TreeFeed(offsets, tree.ancestors)).logits  # [2, 6, V]
    for row in range(2):
        for position in range(parent.shape[1] + 1):
            path = tree.ancestors[row, position].nonzero().flatten().tolist()[1:]
            alone = torch.cat([prompt[row], nodes[row, [p - 1 for p in path]]]).unsqueeze(0)
            assert torch.allclose(logits[row, position], target(alone).logits[0, -1], atol=1e-10), (row, position)


# --- greedy equality ---------------------------------------------------------------------------------------------


def decode(target, draft, prompts, size, forward="auto", eos=None, new_tokens=NEW_TOKENS):
    ids, mask = left_pad(prompts)
    node_budget, depth, top_k = size
    drafter = DynamicTreeDrafter(draft, node_budget, depth, top_k, forward=forward)
    decoder = specdec.Decoder(target, drafter, specdec.Greedy(), specdec.FixedLength(depth), forward=forward)
    return decoder.generate(ids, mask, max_new_tokens=new_tokens, eos_token_id=eos)


@pytest.mark.parametrize("forward", ["lean", "transformers"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_greedy_dynamic_trees_equal_transformers_with_an_unrelated_draft(target, unrelated, size, forward):
    prompts = [[4, 5, 6], [7, 8, 9, 10, 11], [12]]
    for rows in ([0], [0, 1, 2]):  # batch 1, then a ragged batch
        out = decode(target, unrelated, [prompts[i] for i in rows], size, forward)
        assert out.tokens == [hf_greedy(target, prompts[i], NEW_TOKENS) for i in rows]
    assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("forward", ["lean", "transformers"])
@pytest.mark.parametrize("size", SIZES, ids=str)
def test_draft_equal_to_target_accepts_every_path_to_full_depth(target, size, forward):
    sharp = sharpened(target)
    prompts = [[95, 29, 31, 54], [51, 24], [6]]  # prompts along whose greedy continuations no argmax is near a tie
    first_choice = [sharp(torch.tensor([p + hf_greedy(sharp, p, NEW_TOKENS)])).logits[0, len(p) - 1 : -1]
                    .softmax(-1).amax(-1).min() for p in prompts]
    assert min(first_choice) > 0.95  # so the path of argmaxes is the likeliest at every depth: it is in the tree
    out = decode(sharp, sharp, prompts, size, forward)
    assert out.tokens == [hf_greedy(sharp, p, NEW_TOKENS) for p in prompts]
    depth = size[1]
    assert out.stats.per_position == [1.0] * depth  # every step keeps a path as deep as it drafted


def test_greedy_dynamic_tree_stops_at_an_eos_inside_the_tree(target, unrelated):
    prompts = [[7, 8, 9], [4, 5]]
    references = [hf_greedy(target, p, 24) for p in prompts]
    eos = references[0][5]
    out = decode(target, target, prompts, (8, 4, 2), eos=eos, new_tokens=24)
    for tokens, reference in zip(out.tokens, references):
        assert tokens == (reference[: reference.index(eos) + 1] if eos in reference else reference)


def test_rows_of_a_batch_get_different_trees(target, unrelated):
    drafter = DynamicTreeDrafter(unrelated, node_budget=8, depth=3, top_k=3)
    prompts = [[4, 5, 6], [20, 21, 22], [40, 41, 42]]
    ids, mask = left_pad(prompts)
    drafter.start(ids, mask)
    proposal = drafter.propose(3, SamplingConfig(), torch.Generator())
    parents = proposal.layout.tree.parent  # [3, 8]
    assert proposal.tokens.shape == (3, 8) and len({tuple(row) for row in parents.tolist()}) > 1
    assert bool((parents < torch.arange(1, 9)).all())  # parents come first


def test_level_plans_spend_the_budget():
    assert level_plan(16, 5, 4, rerank=True).num_nodes == 16
    sampled = level_plan(16, 5, 4, rerank=False)
    assert sampled.num_nodes == 16 and min(sampled.fed) >= 1 and sampled.last_kept >= 1  # every level keeps a node
    assert level_plan(16, 1, 4, rerank=True).num_nodes == 4  # one level holds top_k nodes at most


@pytest.mark.parametrize("options, message", [
    (dict(node_budget=0), "node_budget must be an integer >= 1, got 0"),
    (dict(node_budget=3, depth=4), r"depth=4 needs node_budget >= depth"),
    (dict(node_budget=30, depth=2, top_k=3), r"node_budget=30 is more than 12, the most nodes a tree of depth=2"),
    (dict(compile=True), "compile=true cannot draft trees"),
])
def test_bad_sizes_are_refused_before_any_model_runs(options, message):
    with pytest.raises(ValueError, match=message):
        DynamicTreeDrafter.check_options(**options)
    with pytest.raises(TypeError, match="unknown options"):
        DynamicTreeDrafter.check_options(branching=[2, 2])


# --- exact at temperature > 0 -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_pair():
    """A target and a draft that differ enough (acceptance ~0.25) for a wrong rule to show within 6000 samples."""
    from conftest import SMALL_VOCAB

    return tiny_gpt2(10, layers=2, vocab=SMALL_VOCAB), tiny_gpt2(12, layers=1, vocab=SMALL_VOCAB, init=0.1)


class RerankedWhenSampling(DynamicTreeDrafter):
    """Wrong: keeps the N likeliest sampled candidates (EAGLE-2's reranking at temperature > 0), so a node keeps
    the likelier of its drawn children and its siblings are no longer draws from q."""

    @staticmethod
    def reranks(sampling: SamplingConfig) -> bool:
        return True


class IidResidual(Speculative):
    """Wrong: judges siblings drawn without replacement as if they were i.i.d. (q never loses a rejected token)."""

    def judge_tree(self, tree, tokens, draft_probs, target_probs, generator):
        return super().judge_tree(replace(tree, distinct_siblings=False), tokens, draft_probs, target_probs,
                                  generator)


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("size", [(5, 2, 3), (4, 3, 2)], ids=str)
def test_sampled_dynamic_trees_reproduce_the_target_joint_distribution(small_pair, size, setting):
    target, draft = small_pair
    report = check_lossless(Speculative(), make_drafter=lambda d, t: DynamicTreeDrafter(d, *size), k=size[1],
                            sampling=SETTINGS[setting], target=target, draft=draft)
    assert 0 < report.acceptance_rate < 1 and report.lossless, report


@pytest.mark.parametrize("strategy, drafter",
                         [(Speculative(), RerankedWhenSampling), (IidResidual(), DynamicTreeDrafter)],
                         ids=["reranked-siblings", "iid-residual"])
def test_variants_that_are_not_exact_fail_the_same_test(small_pair, strategy, drafter):
    target, draft = small_pair
    report = check_lossless(strategy, make_drafter=lambda d, t: drafter(d, 4, 1, 6), k=1, target=target, draft=draft)
    assert not report.lossless, report


def test_the_tree_bench_runs_dynamic_trees_beside_chains_and_static_trees(target, unrelated):
    from conftest import TickingClock, random_prompts
    from experiments import tree_bench
    from experiments.common import harness

    pair = harness.Pair("tiny", unrelated, target, random_prompts([5, 7], seed=3), None, True)
    args = tree_bench.parse_args(["--max-new-tokens", "10", "--chains", "4", "--trees", "2-1", "--dynamic",
                                  "6-3-2"])
    rows = tree_bench.compare(pair, tree_bench.groups_from(args), args, TickingClock())
    assert [row["method"] for row in rows] == ["baseline", "chain k=4", "tree 2-1", "dynamic 6-3-2"]
    assert rows[-1]["nodes per call"] == 6 and all(row["same tokens as baseline"] is True for row in rows)
    with pytest.raises(SystemExit):
        tree_bench.parse_args(["--dynamic", "30-2-3"])  # more nodes than two levels of top-3 hold
