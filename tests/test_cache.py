"""Cache layouts and compaction change where slots live, never what the model sees: outputs stay exact."""

import pytest
import torch

import specdec
from specdec.cache import KVCache
from conftest import hf_greedy, left_pad, random_prompts


def decoder(target, draft, layout):
    return specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout=layout), specdec.Greedy(),
                           specdec.FixedLength(5), cache_layout=layout)


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_ragged_batch_with_many_rejections_is_exact_in_both_layouts(target, draft, layout):
    prompts = random_prompts([3, 12, 7], seed=21)
    ids, mask = left_pad(prompts)
    out = decoder(target, draft, layout).generate(ids, mask, max_new_tokens=70)
    assert out.tokens == [hf_greedy(target, p, 70) for p in prompts]


def test_compaction_gathers_committed_slots_and_keeps_logits_exact(target):
    prompts = random_prompts([4, 9], seed=22)
    ids, mask = left_pad(prompts)
    cache = KVCache(target, 2, ids.device, "target")
    cache.forward(ids, mask)
    holes = torch.tensor([[7, 8, 9], [10, 11, 12]])
    cache.forward(holes, torch.ones_like(holes))
    cache.keep(torch.tensor([0, 0]), 3, max_kept=0)  # every row rejects: cropped, no holes left
    assert cache.num_slots == ids.shape[1]
    cache.forward(holes, torch.ones_like(holes))
    cache.keep(torch.tensor([1, 3]), 3, max_kept=3)  # row 0 keeps one of three: two holes
    assert cache.num_slots == ids.shape[1] + 3
    committed_before = cache.mask.sum(-1).tolist()
    cache.compact()
    assert cache.mask.sum(-1).tolist() == committed_before
    assert cache.num_slots == max(committed_before)
    nxt = torch.tensor([[5], [6]])
    logits = cache.forward(nxt, torch.ones_like(nxt))[:, -1]
    expected = [target(torch.tensor([p + row + n])).logits[0, -1]
                for p, row, n in zip(prompts, ([7], [10, 11, 12]), ([5], [6]))]
    assert torch.allclose(logits, torch.stack(expected), atol=1e-10)


def test_static_cache_compacts_when_full_and_matches_dynamic(target, draft, monkeypatch):
    """A deliberately small static cache (prompt width + new tokens - 20 slots, not rounded up) forces compaction
    (and growth once compaction is not enough). Same seed, same tokens as the dynamic layout."""
    import specdec.cache as cache_module

    compactions = []
    original = cache_module.KVCache.compact
    monkeypatch.setattr(cache_module, "STATIC_CACHE_SLACK", -20)
    monkeypatch.setattr(cache_module, "STATIC_CAPACITY_STEP", 1)
    monkeypatch.setattr(cache_module, "STATIC_POOL", {})  # no roomier cache pooled by earlier tests
    monkeypatch.setattr(cache_module.KVCache, "compact", lambda self: compactions.append(self.label) or original(self))
    prompts = random_prompts([2, 10, 6], seed=23)
    ids, mask = left_pad(prompts)
    runs = {
        layout: specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout=layout), specdec.Speculative(),
                                specdec.FixedLength(5), specdec.SamplingConfig(temperature=1.0), cache_layout=layout,
                                retire_finished_rows=False,  # the static layout keeps rows: same batch, same stream
                                ).generate(ids, mask, max_new_tokens=40, seed=3)
        for layout in ("dynamic", "static")
    }
    assert runs["static"].tokens == runs["dynamic"].tokens
    assert compactions  # the same KVCache code compacts target and draft caches


def test_unknown_layout_is_rejected(target):
    with pytest.raises(ValueError, match="unknown cache layout 'paged'; known layouts: dynamic, static"):
        KVCache(target, 1, torch.device("cpu"), "target", "paged")


class WithoutBody(torch.nn.Module):
    """A causal LM with no ``base_model``: prefill must run the whole model."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **kwargs):
        return self.model(**kwargs)


@pytest.mark.parametrize("wrap", [False, True], ids=["body", "whole-model"])
def test_prefill_fills_the_cache_as_a_full_forward_does(target, wrap):
    model = WithoutBody(target) if wrap else target
    ids, mask = left_pad(random_prompts([5, 8], seed=23))
    full, prefilled = KVCache(model, 2, ids.device, "target"), KVCache(model, 2, ids.device, "target")
    assert (prefilled.body is model) == wrap
    full.forward(ids, mask)
    prefilled.prefill(ids, mask)
    nxt = torch.tensor([[5], [6]])
    torch.testing.assert_close(prefilled.forward(nxt, torch.ones_like(nxt)), full.forward(nxt, torch.ones_like(nxt)),
                               rtol=0, atol=1e-12)


DRAFTERS = {
    "none": lambda target, draft: None,
    "model": lambda target, draft: specdec.ModelDrafter(draft),
    "ngram": lambda target, draft: specdec.NGramDrafter(max_ngram=2),
    "early_exit": lambda target, draft: specdec.EarlyExitDrafter(target, 1),
}


@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_finished_rows_leave_the_batch_and_greedy_results_stay_the_same(target, draft, drafter):
    prompts = random_prompts([3, 9, 6, 4], seed=31)
    ids, mask = left_pad(prompts)
    eos = hf_greedy(target, prompts[0], 5)[-1]  # row 0 stops within five tokens; the others run on
    widths = []
    hook = target.register_forward_pre_hook(lambda _, args, kwargs: widths.append(kwargs["input_ids"].shape[0]),
                                            with_kwargs=True)
    try:
        runs = {}
        for retire in (True, False):
            widths.clear()
            decoder = specdec.Decoder(target, DRAFTERS[drafter](target, draft), draft_length=specdec.FixedLength(3),
                                      retire_finished_rows=retire)
            runs[retire] = (decoder.generate(ids, mask, max_new_tokens=24, eos_token_id=eos), list(widths))
    finally:
        hook.remove()
    (retired, retired_widths), (kept, kept_widths) = runs[True], runs[False]
    assert retired.tokens == kept.tokens and retired.stats.rows == kept.stats.rows
    assert len(retired.tokens[0]) <= 5 < max(map(len, retired.tokens))
    assert set(kept_widths) == {4}
    assert retired_widths == sorted(retired_widths, reverse=True) and retired_widths[-1] < 4


def test_static_caches_are_pooled_across_calls_and_grow_when_a_call_needs_more(target, draft, monkeypatch):
    """Compiled code guards on the cache tensors and CUDA graphs replay on their addresses: a later call of the
    same model, role and batch size must get the same tensors back, emptied; one that needs more room gets a
    larger cache, which replaces the pooled one. Results equal the dynamic layout's either way."""
    import specdec.cache as cache_module

    monkeypatch.setattr(cache_module, "STATIC_POOL", {})
    ids, mask = left_pad(random_prompts([3, 8], seed=5))

    def run(layout, max_new_tokens):
        return decoder(target, draft, layout).generate(ids, mask, max_new_tokens=max_new_tokens)

    def pooled_keys():  # the pooled key tensor of layer 0 per role (the tensor, not its address: memory is reused)
        return {role: past.layers[0].keys for (_, role, _), (_, past, _) in cache_module.STATIC_POOL.items()}

    first = run("static", 20)
    addresses = pooled_keys()
    assert set(addresses) == {"target", "draft"}
    second = run("static", 20)
    assert all(pooled_keys()[role] is addresses[role] for role in addresses)
    assert second.tokens == first.tokens == run("dynamic", 20).tokens
    longer = run("static", 400)  # needs more than the first capacity (rounded up to 256 slots)
    assert pooled_keys()["target"] is not addresses["target"]
    assert pooled_keys()["target"].shape[2] > addresses["target"].shape[2]
    assert longer.tokens == run("dynamic", 400).tokens


@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 3])
def test_compiled_path_gives_the_eager_greedy_tokens(target, draft, k):
    """torch.compile (inductor on CPU; CUDA graphs on CUDA) over static caches: the same greedy tokens as eager,
    speculative and baseline, on a ragged batch, for several calls in a row (pooled caches, compiled shapes)."""
    for seed in range(2):
        ids, mask = left_pad(random_prompts([5, 9, 2], seed=seed))
        for drafter in (lambda compile: specdec.ModelDrafter(draft, compile=compile), lambda compile: None):
            outputs = [
                specdec.Decoder(target, drafter(compile), specdec.Greedy(), specdec.FixedLength(k), compile=compile)
                .generate(ids, mask, max_new_tokens=24).tokens
                for compile in (False, True)
            ]
            assert outputs[0] == outputs[1]


def test_a_dense_cache_passes_no_mask_and_its_logits_equal_the_masked_path(target):
    """One unpadded row: forwards go without mask or positions, through prefill, decode, verify and rollback,
    and give the logits the masked path gives. Padding in the prompt, or a batch of two, keep the mask."""
    prompt = torch.tensor([random_prompts([6], seed=4)[0]])
    masks = []
    hook = target.register_forward_pre_hook(lambda module, args, kwargs: masks.append(kwargs.get("attention_mask")),
                                            with_kwargs=True)
    dense, masked = KVCache(target, 1, prompt.device, "target"), KVCache(target, 1, prompt.device, "target")
    masked.dense = False
    logits = []
    for cache in (dense, masked):
        first = cache.prefill_and_predict(prompt, torch.ones_like(prompt))  # [1, 1, V]
        drafts = torch.tensor([[5, 6, 7]])
        verify = cache.forward(drafts, torch.ones_like(drafts))  # [1, 3, V]
        cache.keep(torch.tensor([1]), 3, max_kept=1, min_kept=1)  # keep one draft, crop two
        after = cache.forward(drafts[:, :1], torch.ones_like(drafts[:, :1]))
        logits.append(torch.cat([first, verify, after], 1))
    assert all(mask is None for mask in masks[:3]) and all(mask is not None for mask in masks[3:])
    assert dense.dense and dense.num_slots == masked.num_slots == 8
    assert torch.allclose(logits[0], logits[1], atol=1e-12, rtol=0)
    hook.remove()
    padded = KVCache(target, 1, prompt.device, "target")
    padded.prefill(prompt, torch.tensor([[0, 1, 1, 1, 1, 1]]))
    assert not padded.dense and not KVCache(target, 2, prompt.device, "target").dense
