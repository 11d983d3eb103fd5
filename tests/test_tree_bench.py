"""The tree benchmark's measuring parts on a tiny pair: it compares chains and trees that verify the same number of
nodes, in one interleaved run, and times tree verification over an unchanged cache. (Speed is never asserted.)"""

from __future__ import annotations

import torch
from conftest import TickingClock, random_prompts, tiny_gpt2

from experiments import tree_bench
from experiments.common import harness
from specdec.profile import time_tree_forwards


def test_trees_and_chains_of_a_group_verify_the_same_number_of_nodes_and_emit_the_baseline_tokens():
    target, draft = tiny_gpt2(0, layers=2, init=0.2), tiny_gpt2(1, layers=1, init=0.2)
    pair = harness.Pair("tiny", draft, target, random_prompts([5, 7, 6], seed=3), None, True)
    args = tree_bench.parse_args(["--max-new-tokens", "10"])
    rows = tree_bench.compare(pair, {4: [(2, 1), (4,)], 6: [(2, 2)]}, args, TickingClock())
    assert [row["method"] for row in rows] == ["baseline", "chain k=4", "tree 2-1", "tree 4", "chain k=6", "tree 2-2"]
    assert [row["nodes per call"] for row in rows] == [0, 4, 4, 4, 6, 6]
    assert all(row["same tokens as baseline"] is True for row in rows)
    assert rows[0]["tau"] == 1.0 and all(row["tau"] >= 1.0 for row in rows)


def test_time_tree_forwards_feeds_the_root_and_n_nodes_over_the_same_cache():
    model = tiny_gpt2(0, layers=1)
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    seen = []
    hook = model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (tuple(kwargs["input_ids"].shape), tuple(kwargs["attention_mask"].shape))), with_kwargs=True)
    times = time_tree_forwards(model, prompt, [1, 3], repeats=2, warmup=1, clock=TickingClock(),
                               forward="transformers")
    hook.remove()
    assert times == {1: 1.0, 3: 1.0}
    # after the prompt (5 slots, filled by the body alone): the root and n nodes under a [1, 1, n+1, 5+n+1] mask
    assert seen == [((1, 2), (1, 1, 2, 7))] * 3 + [((1, 4), (1, 1, 4, 9))] * 3
