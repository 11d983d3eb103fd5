"""At temperature 0 speculative decoding must reproduce the target's own greedy decoding token for token.

This is the test that catches cache rollback and position bugs: every k, batch 1 and a ragged batch, a draft
that agrees with everything (draft == target) and an unrelated one that is rejected often.
"""

import pytest
import torch

import specdec
from conftest import hf_greedy, left_pad, random_prompts

NEW_TOKENS = 24


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("same_draft", [True, False], ids=["draft==target", "unrelated-draft"])
def test_batch_of_one_equals_transformers_greedy(target, draft, k, same_draft):
    prompt = random_prompts([9], seed=k)[0]
    reference = hf_greedy(target, prompt, NEW_TOKENS)
    out = specdec.generate(target, torch.tensor([prompt]), draft=target if same_draft else draft, k=k,
                           max_new_tokens=NEW_TOKENS)
    assert out.tokens == [reference]
    if same_draft:
        assert out.stats.acceptance_rate == 1.0


@pytest.mark.parametrize("k", [1, 2, 4, 7])
@pytest.mark.parametrize("same_draft", [True, False], ids=["draft==target", "unrelated-draft"])
def test_ragged_batch_rows_equal_transformers_greedy(target, draft, k, same_draft):
    prompts = random_prompts([5, 11, 2], seed=10 + k)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, draft=target if same_draft else draft, attention_mask=mask, k=k,
                           max_new_tokens=NEW_TOKENS)
    assert out.tokens == [hf_greedy(target, p, NEW_TOKENS) for p in prompts]


@pytest.mark.parametrize("strategy", ["greedy", "speculative", "typical", "topk"])
def test_every_strategy_is_greedy_at_temperature_zero(target, draft, strategy):
    prompts = random_prompts([6, 3], seed=3)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, draft=draft, attention_mask=mask, strategy=strategy, k=3, max_new_tokens=16)
    assert out.tokens == [hf_greedy(target, p, 16) for p in prompts]


def test_baseline_equals_transformers_greedy(target):
    prompts = random_prompts([4, 8], seed=4)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, attention_mask=mask, max_new_tokens=NEW_TOKENS)
    assert out.tokens == [hf_greedy(target, p, NEW_TOKENS) for p in prompts]


def test_rows_stop_at_their_own_eos(target, draft):
    prompts = random_prompts([5, 7, 3], seed=5)
    greedy = [hf_greedy(target, p, NEW_TOKENS) for p in prompts]
    eos = greedy[0][6]  # a token row 0 emits; other rows may or may not emit it
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, draft=draft, attention_mask=mask, k=4, max_new_tokens=NEW_TOKENS,
                           eos_token_id=eos)
    expected = [hf_greedy(target, p, NEW_TOKENS, eos_token_id=eos) for p in prompts]
    assert out.tokens == expected
    assert out.tokens[0][-1] == eos and len(out.tokens[0]) <= 7
    assert any(len(row) == NEW_TOKENS for row in expected[1:]) or any(row[-1] == eos for row in expected[1:])


def test_context_limit_stops_each_row_at_the_last_position(draft):
    from conftest import tiny_gpt2

    short_target = tiny_gpt2(0, layers=3, positions=32)
    short_draft = tiny_gpt2(1, layers=1, positions=32)
    prompts = random_prompts([26, 20, 30], seed=6)
    ids, mask = left_pad(prompts)
    out = specdec.generate(short_target, ids, draft=short_draft, attention_mask=mask, k=7, max_new_tokens=50)
    assert [len(row) for row in out.tokens] == [32 - len(p) for p in prompts]
    assert out.tokens == [hf_greedy(short_target, p, 32 - len(p)) for p in prompts]


def test_long_ragged_generation_with_many_rejections_matches_rows_run_alone(target, draft):
    """Rejected slots pile up as holes in batched caches; each row must still equal its solo run."""
    prompts = random_prompts([3, 14, 8, 1], seed=7)
    ids, mask = left_pad(prompts)
    batched = specdec.generate(target, ids, draft=draft, attention_mask=mask, k=5, max_new_tokens=90)
    solo = [specdec.generate(target, torch.tensor([p]), draft=draft, k=5, max_new_tokens=90).tokens[0] for p in prompts]
    assert batched.tokens == solo
    assert batched.tokens == [hf_greedy(target, p, 90) for p in prompts]
