"""The compiled lean forward (``CachedModel.compiled_forward``): one graph serves every k, with the greedy tokens of
eager decoding, and dynamo's recompile limit is raised around our compiled calls only, never for the process."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import specdec
from specdec import cache as cache_module
from specdec.cache import COMPILED_VARIANTS, CachedModel
from specdec.profile import time_forwards

from conftest import left_pad, random_prompts, tiny_gpt2


def process_recompile_limit(value: int):
    """The process's recompile limit set to ``value`` for a block, through torch's own config patching: setting the
    attribute on the config module (``monkeypatch.setattr``) and restoring it behind dynamo's back breaks the
    module's later ``patch`` calls under some pytest releases."""
    return torch._dynamo.config.patch(recompile_limit=value)


def compilations() -> int:
    return counters["stats"]["unique_graphs"]


def test_a_compiled_generate_leaves_the_process_recompile_limit_as_it_was():
    """A compiled baseline on the device step: eager decoding's greedy tokens, and the process's recompile limit
    unchanged (it is raised inside our compiled calls only); a compiled cost profile of one token then compiles
    nothing more."""
    target = tiny_gpt2(1, layers=1)
    ids, mask = left_pad(random_prompts([6, 3], seed=4))
    with process_recompile_limit(5):
        compiled = specdec.Decoder(target, compile=True, step="device")
        assert compiled.generate(ids, mask, max_new_tokens=8).tokens == specdec.Decoder(target).generate(
            ids, mask, max_new_tokens=8).tokens
        assert torch._dynamo.config.recompile_limit == 5
        before = compilations()  # a cost profile names no logit columns: it runs the graph the decode steps compiled
        with torch.inference_mode():  # as generate runs (and the GPU suite runs everything)
            time_forwards(target, ids, [1], repeats=1, warmup=0, cache_layout="static", compile=True)
        assert compilations() == before


@pytest.mark.slow
def test_one_compiled_graph_serves_every_k():
    """The device step compiled at k = 2 compiles its graphs (the draft's one-token forward, its first two-token
    feed, the target's verification); k = 3 and 4 compile nothing more, and every k emits eager decoding's greedy
    tokens; the process's recompile limit stays as it was."""
    torch._dynamo.reset()  # graphs compiled by earlier tests for models of these shapes would serve k = 2 too
    target, draft = tiny_gpt2(1, layers=1), tiny_gpt2(2, layers=1)
    ids = torch.tensor(random_prompts([6], seed=3))  # [1, 6]
    new_graphs = {}
    with process_recompile_limit(5):
        for k in (2, 3, 4):
            compiled = specdec.Decoder(target, specdec.ModelDrafter(draft, compile=True), specdec.Greedy(),
                                       specdec.FixedLength(k), compile=True, step="device")
            eager = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(k))
            before = compilations()
            tokens = compiled.generate(ids, max_new_tokens=12).tokens
            new_graphs[k] = compilations() - before
            assert tokens == eager.generate(ids, max_new_tokens=12).tokens, k
        assert torch._dynamo.config.recompile_limit == 5
    assert new_graphs[2] > 0 and new_graphs[3] == new_graphs[4] == 0


def test_the_recompile_limit_is_raised_for_our_compiled_calls_only(monkeypatch):
    """What dynamo reads inside a call of the compiled lean forward: at least ``COMPILED_VARIANTS``; outside it, the
    process's own value, also after a call that raised; the step's width is marked dynamic on every width input."""
    calls, options_seen = [], []

    def fake_compile(forward, **options):
        options_seen.append(options)

        def run(input_ids, positions, write_slots, attend, keys, values, logit_columns, hidden_layers, features):
            calls.append((torch._dynamo.config.recompile_limit,
                          [getattr(tensor, "_dynamo_weak_dynamic_indices", set())
                           for tensor in (input_ids, positions, write_slots, attend, logit_columns)]))
            if input_ids.shape[1] == 2:
                raise RuntimeError("a compile that breaks")
            return forward(input_ids, positions, write_slots, attend, keys, values, logit_columns, hidden_layers,
                           features)
        return run

    monkeypatch.setattr(cache_module.torch, "compile", fake_compile)
    runner = CachedModel(tiny_gpt2(0, layers=1), "target", forward="lean", compile=True)
    lean_cache = runner.new_cache(1, 16, torch.device("cpu"))
    with process_recompile_limit(7):
        lean_cache.feed(torch.tensor([[1, 2, 3]]), prefill=True)  # eager
        lean_cache.feed(torch.tensor([[4, 5, 6]]), logit_columns=torch.arange(1, 3))
        assert options_seen == [{"fullgraph": True, "dynamic": False}]
        assert calls == [(COMPILED_VARIANTS, [{1}, {1}, {1}, {1}, {0}])]
        assert torch._dynamo.config.recompile_limit == 7
        with pytest.raises(RuntimeError, match="a compile that breaks"):
            lean_cache.feed(torch.tensor([[7, 8]]))  # no logit columns named: all of them, marked like the others
        assert calls[1] == (COMPILED_VARIANTS, [{1}, {1}, {1}, {1}, {0}])
        assert torch._dynamo.config.recompile_limit == 7
