"""Cache layouts and compaction change where slots live, never what the model sees: outputs stay exact."""

import pytest
import torch

import specdec
from specdec.cache import CachedModel
from conftest import hf_greedy, left_pad, random_prompts, tiny_gpt2, watch_forwards


def decoder(target, draft, layout, forward="auto"):
    return specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout=layout, forward=forward), specdec.Greedy(),
                           specdec.FixedLength(5), cache_layout=layout, forward=forward)


@pytest.mark.parametrize("layout", ["dynamic", "static"])
def test_ragged_batch_with_many_rejections_is_exact_in_both_layouts(target, draft, layout):
    prompts = random_prompts([3, 12, 7], seed=21)
    ids, mask = left_pad(prompts)
    out = decoder(target, draft, layout).generate(ids, mask, max_new_tokens=70)
    assert out.tokens == [hf_greedy(target, p, 70) for p in prompts]


def masked_cache(model, batch_size, layout="dynamic", capacity=64):
    return CachedModel(model, "target", forward="transformers", cache_layout=layout).new_cache(
        batch_size, capacity, torch.device("cpu"))


def feed_and_keep(cache, tokens, num_kept, max_kept):
    """Feed [B, n] tokens as one step's region and keep each row's first ``num_kept`` [B] of them."""
    cache.feed(tokens)
    kept = torch.arange(tokens.shape[1]) < torch.tensor(num_kept).unsqueeze(1)  # [B, n]
    cache.keep(kept, prefix=True, max_kept=max_kept)


def test_compaction_gathers_committed_slots_and_keeps_logits_exact(target):
    prompts = random_prompts([4, 9], seed=22)
    ids, mask = left_pad(prompts)
    cache = masked_cache(target, 2)
    cache.feed(ids, mask)
    cache.keep(mask.bool(), prefix=True, max_kept=ids.shape[1])
    holes = torch.tensor([[7, 8, 9], [10, 11, 12]])
    feed_and_keep(cache, holes, [0, 0], max_kept=0)  # every row rejects: cropped, no holes left
    assert cache.num_slots == ids.shape[1]
    feed_and_keep(cache, holes, [1, 3], max_kept=3)  # row 0 keeps one of three: two holes
    assert cache.num_slots == ids.shape[1] + 3
    committed_before = cache.mask.sum(-1).tolist()
    cache.compact()
    assert cache.mask.sum(-1).tolist() == committed_before
    assert cache.num_slots == max(committed_before)
    nxt = torch.tensor([[5], [6]])
    logits = cache.feed(nxt).logits[:, -1]
    expected = [target(torch.tensor([p + row + n])).logits[0, -1]
                for p, row, n in zip(prompts, ([7], [10, 11, 12]), ([5], [6]))]
    assert torch.allclose(logits, torch.stack(expected), atol=1e-10)


def test_static_cache_compacts_when_full_and_matches_dynamic(target, draft, monkeypatch):
    """A deliberately small static cache (prompt width + new tokens - 20 slots, not rounded up) forces compaction
    (and growth once compaction is not enough). Same seed, same tokens as the dynamic layout."""
    import specdec.cache as cache_module

    compactions = []
    original = cache_module.MaskedCache.compact
    monkeypatch.setattr(cache_module, "STATIC_CACHE_SLACK", -20)
    monkeypatch.setattr(cache_module, "STATIC_CAPACITY_STEP", 1)
    monkeypatch.setattr(cache_module.MaskedCache, "compact",
                        lambda self: compactions.append(self.label) or original(self))
    prompts = random_prompts([2, 10, 6], seed=23)
    ids, mask = left_pad(prompts)
    runs = {
        layout: specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout=layout, forward="transformers"),
                                specdec.Speculative(), specdec.FixedLength(5), specdec.SamplingConfig(temperature=1.0),
                                cache_layout=layout, forward="transformers",
                                retire_finished_rows=False,  # the static layout keeps rows: same batch, same stream
                                ).generate(ids, mask, max_new_tokens=40, seed=3)
        for layout in ("dynamic", "static")
    }
    assert runs["static"].tokens == runs["dynamic"].tokens
    assert compactions  # the same MaskedCache code compacts target and draft caches


def test_unknown_layout_and_forward_are_rejected(target):
    with pytest.raises(ValueError, match="unknown cache layout 'paged'; known layouts: dynamic, static"):
        CachedModel(target, "target", cache_layout="paged")
    with pytest.raises(ValueError, match="forward must be one of auto, lean, transformers, got 'fast'"):
        CachedModel(target, "target", forward="fast")


class WithoutBody(torch.nn.Module):
    """A causal LM with no ``base_model``: prefill must run the whole model."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def forward(self, **kwargs):
        return self.model(**kwargs)


@pytest.mark.parametrize("wrap", [False, True], ids=["body", "whole-model"])
def test_a_feed_without_logits_fills_the_cache_as_a_full_forward_does(target, wrap):
    """No logit column asked: the model's body runs alone (the whole model where it has no ``base_model``)."""
    model = WithoutBody(target) if wrap else target
    ids, mask = left_pad(random_prompts([5, 8], seed=23))
    full, body_only = masked_cache(model, 2), masked_cache(model, 2)
    assert (body_only.body is model) == wrap
    full.feed(ids, mask)
    body_only.feed(ids, mask, logit_columns=torch.arange(0))
    nxt = torch.tensor([[5], [6]])
    torch.testing.assert_close(body_only.feed(nxt).logits, full.feed(nxt).logits, rtol=0, atol=1e-12)


DRAFTERS = {
    "none": lambda target, draft: None,
    "model": lambda target, draft: specdec.ModelDrafter(draft),
    "ngram": lambda target, draft: specdec.NGramDrafter(max_ngram=2),
    "early_exit": lambda target, draft: specdec.EarlyExitDrafter(target, 1),
}


@pytest.mark.parametrize("forward", ["lean", "transformers"])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_finished_rows_leave_the_batch_and_greedy_results_stay_the_same(target, draft, drafter, forward):
    prompts = random_prompts([3, 9, 6, 4], seed=31)
    ids, mask = left_pad(prompts)
    eos = hf_greedy(target, prompts[0], 5)[-1]  # row 0 stops within five tokens; the others run on
    runs = {}
    for retire in (True, False):
        with watch_forwards(target) as shapes:
            decoder = specdec.Decoder(target, DRAFTERS[drafter](target, draft), draft_length=specdec.FixedLength(3),
                                      retire_finished_rows=retire, forward=forward)
            runs[retire] = (decoder.generate(ids, mask, max_new_tokens=24, eos_token_id=eos),
                            [shape[0] for shape in shapes])
    (retired, retired_widths), (kept, kept_widths) = runs[True], runs[False]
    assert retired.tokens == kept.tokens and retired.stats.rows == kept.stats.rows
    assert len(retired.tokens[0]) <= 5 < max(map(len, retired.tokens))
    assert set(kept_widths) == {4}
    assert retired_widths == sorted(retired_widths, reverse=True) and retired_widths[-1] < 4


def test_a_lean_cache_moves_the_rows_it_keeps_in_place_and_their_logits_stay_exact(target):
    """Rows leave a lean cache in place: the rows kept move to the front of the same buffers (row 0 stays, rows 2
    and 3 move up), and the next step's logits are those of a cache that only ever held the rows kept."""
    prompts = random_prompts([4, 9, 6, 3], seed=24)
    ids, mask = left_pad(prompts)
    runner = CachedModel(target, "target", forward="lean")
    cache = runner.new_cache(4, 32, torch.device("cpu"))
    cache.feed(ids, mask)
    cache.keep(mask.bool(), prefix=True, max_kept=ids.shape[1])
    buffers = [states.data_ptr() for states in cache.keys]
    cache.select_rows(torch.tensor([0, 2, 3]))
    assert [states.data_ptr() for states in cache.keys] == buffers and cache.keys[0].shape[0] == 3
    nxt = torch.tensor([[5], [6], [7]])
    logits = cache.feed(nxt).logits[:, -1]
    expected = [target(torch.tensor([prompts[row] + n])).logits[0, -1] for row, n in zip((0, 2, 3), ([5], [6], [7]))]
    assert torch.allclose(logits, torch.stack(expected), atol=1e-5)


def eos_finishing_one_row(outputs: list[list[int]], positions: range) -> tuple[int, int]:
    """A token that only one row emits, first at one of ``positions``: (the token, that position)."""
    for row, tokens in enumerate(outputs):
        for position in positions:
            token = tokens[position]
            others = [t for other, out in enumerate(outputs) if other != row for t in out]
            if token not in tokens[:position] and token not in others:
                return token, position
    raise AssertionError(f"no row's token at {positions} is its own: pick other prompts")


@pytest.mark.parametrize("finish", ["early", "late"])
def test_a_finished_row_leaves_only_while_enough_steps_are_left_to_repay_moving_the_rest(target, finish):
    """A row that finishes with many steps left leaves the batch at once; one that finishes with two steps left
    stays as holes (1 row x 2 steps < ROW_STEPS_PER_ROW_KEPT x 3 rows): moving the other rows' caches would cost
    more than the two forwards it still feeds. Greedy outputs are the same either way."""
    from specdec.decode import ROW_STEPS_PER_ROW_KEPT

    new_tokens = 24
    prompts = random_prompts([5, 8, 6, 7], seed=40)
    outputs = [hf_greedy(target, prompt, new_tokens) for prompt in prompts]
    positions = range(2, 8) if finish == "early" else range(new_tokens - 6, new_tokens - 1)
    eos, position = eos_finishing_one_row(outputs, positions)
    steps_left = new_tokens - position - 1
    assert (steps_left * 1 >= ROW_STEPS_PER_ROW_KEPT * 3) == (finish == "early")
    ids, mask = left_pad(prompts)
    with watch_forwards(target) as shapes:
        out = specdec.Decoder(target).generate(ids, mask, max_new_tokens=new_tokens, eos_token_id=eos)
    assert out.tokens == [hf_greedy(target, prompt, new_tokens, eos_token_id=eos) for prompt in prompts]
    widths = [shape[0] for shape in shapes]
    assert widths == [4] * (position + 1) + [3 if finish == "early" else 4] * steps_left


def test_static_caches_are_pooled_by_their_decoder_and_freed_by_release(target, draft):
    """Compiled code guards on the cache tensors and CUDA graphs replay on their addresses: a later call of the same
    Decoder and batch size gets the same tensors back, emptied; one that needs more room gets a larger cache, which
    replaces the pooled one; ``release`` frees them all. Each Decoder (and drafter) owns its own pool: no registry
    outlives them. Results equal the dynamic layout's either way."""
    ids, mask = left_pad(random_prompts([3, 8], seed=5))
    static = decoder(target, draft, "static", forward="transformers")

    def pooled_keys():  # the pooled key tensor of layer 0 per role (the tensor, not its address: memory is reused)
        return {role: runner.pool[2][0].layers[0].keys
                for role, runner in (("target", static.runner), ("draft", static.drafter.runner))}

    def run(decoder_, max_new_tokens):
        return decoder_.generate(ids, mask, max_new_tokens=max_new_tokens).tokens

    dynamic = decoder(target, draft, "dynamic", forward="transformers")
    first = run(static, 20)
    addresses = pooled_keys()
    assert run(static, 20) == first == run(dynamic, 20)
    assert all(pooled_keys()[role] is addresses[role] for role in addresses)
    other = decoder(target, draft, "static", forward="transformers")
    assert run(other, 20) == first and other.runner.pool[2][0].layers[0].keys is not addresses["target"]
    longer = run(static, 400)  # needs more than the first capacity (rounded up to 256 slots)
    assert pooled_keys()["target"] is not addresses["target"]
    assert pooled_keys()["target"].shape[2] > addresses["target"].shape[2]
    assert longer == run(dynamic, 400)
    static.release()
    assert not static.runner.pool and not static.drafter.runner.pool


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
    dense, masked = masked_cache(target, 1), masked_cache(target, 1)
    masked.leave_dense()
    logits = []
    for cache in (dense, masked):
        drafts = torch.tensor([[5, 6, 7]])
        verify = cache.feed(torch.cat([prompt, drafts], 1), logit_columns=torch.arange(5, 9)).logits  # [1, 4, V]
        kept = torch.arange(9) < 7  # the prompt and one draft: the region's first seven slots
        cache.keep(kept.unsqueeze(0), prefix=True, max_kept=7)
        after = cache.feed(drafts[:, :1]).logits
        logits.append(torch.cat([verify, after], 1))
    assert all(mask is None for mask in masks[:2]) and all(mask is not None for mask in masks[2:])
    assert dense.dense and dense.num_slots == masked.num_slots == 8
    assert torch.allclose(logits[0], logits[1], atol=1e-12, rtol=0)
    hook.remove()
    padded = masked_cache(target, 1)
    padded.feed(prompt, torch.tensor([[0, 1, 1, 1, 1, 1]]), logit_columns=torch.arange(0))
    assert not padded.dense and not masked_cache(target, 2).dense


def test_a_lean_cache_grows_past_its_first_capacity_even_with_a_fixed_span():
    """A compiled drafter's lean cache spans its whole capacity; once a call needs more it must grow, never cut
    the context: the logits after growing equal a full forward's."""
    target = tiny_gpt2(0, layers=1, positions=1024)
    cache = CachedModel(target, "draft", forward="lean").new_cache(1, 16, torch.device("cpu"), fixed_span=True)
    first = cache.capacity
    tokens = torch.tensor([random_prompts([first + 40], seed=9)[0]])
    for i in range(tokens.shape[1]):
        logits = cache.feed(tokens[:, i : i + 1]).logits
        cache.keep(torch.ones(1, 1, dtype=torch.bool), prefix=True, max_kept=1)
    assert cache.capacity > first and int(cache.length) == tokens.shape[1]
    torch.testing.assert_close(logits[0, -1], target(tokens).logits[0, -1], rtol=0, atol=1e-10)
    cache.fix_shapes(4 * cache.capacity)
    assert cache.capacity >= 4 * first and cache.fixed_span
