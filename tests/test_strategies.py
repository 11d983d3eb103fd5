"""Each acceptance rule tested for its own definition on hand-built distributions."""

import math

import pytest
import torch
from conftest import hf_greedy, left_pad, random_prompts

import specdec
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, one_hot_probs, usable
from specdec.rules import greedy_verdict
from specdec.strategies import Greedy, Speculative, TopK, Typical, make_strategy

GEN = torch.Generator().manual_seed(0)


def dist(*rows):
    t = torch.tensor(rows, dtype=torch.float32)
    return t / t.sum(-1, keepdim=True)


def test_greedy_accepts_the_prefix_matching_target_argmax():
    target = dist([1, 5, 1, 1], [6, 1, 1, 1], [1, 1, 7, 1], [1, 1, 1, 9]).expand(3, 4, 4)  # argmax 1, 0, 2, 3
    drafts = torch.tensor([[1, 0, 2], [1, 3, 2], [2, 0, 2]])
    verdict = Greedy()(drafts, one_hot_probs(drafts, 4), target, GEN)
    assert verdict.num_accepted.tolist() == [3, 1, 0]
    assert verdict.next_token.tolist() == [3, 0, 1]  # bonus argmax, then the corrections


def test_typical_accepts_exactly_the_tokens_above_its_threshold():
    rule = Typical(epsilon=0.3, delta=0.5)
    flat, peaked = dist([1, 1, 1, 1]), dist([97, 1, 1, 1])
    for p in (flat, peaked):
        entropy = -(p * p.log()).sum().item()
        threshold = min(0.3, 0.5 * math.exp(-entropy))
        assert rule.threshold(p).item() == pytest.approx(threshold)
        for token in range(4):
            drafts = torch.tensor([[token]])
            verdict = rule(drafts, one_hot_probs(drafts, 4), torch.stack([p[0], p[0]]).unsqueeze(0), GEN)
            assert verdict.num_accepted.item() == int(p[0, token].item() > threshold)


def test_topk_accepts_tokens_among_the_n_most_likely_with_mass():
    p = dist([5, 4, 3, 2, 1, 0])
    verify = torch.stack([p[0], p[0]]).unsqueeze(0)
    for token, accepted in [(0, 1), (1, 1), (2, 1), (3, 0), (5, 0)]:
        drafts = torch.tensor([[token]])
        assert TopK(n=3)(drafts, one_hot_probs(drafts, 6), verify, GEN).num_accepted.item() == accepted
    drafts = torch.tensor([[5]])  # in the top 6 of a 6-token vocabulary, but with zero probability
    assert TopK(n=6)(drafts, one_hot_probs(drafts, 6), verify, GEN).num_accepted.item() == 0


def test_speculative_accepts_surely_when_target_likes_the_token_more():
    p, q = dist([1, 3]), dist([3, 1])
    drafts = torch.tensor([[1]]).expand(1000, 1)
    verdict = Speculative()(drafts, q.expand(1000, 1, 2), torch.stack([p[0], p[0]]).expand(1000, 2, 2), GEN)
    assert bool((verdict.num_accepted == 1).all())


def test_speculative_acceptance_frequency_is_p_over_q_and_lenience_raises_it():
    p, q = dist([3, 1]), dist([1, 1])  # token 1: p = 0.25, q = 0.5 -> accept 1/2; lenience 0.5 -> accept 1
    drafts = torch.tensor([[1]]).expand(20_000, 1)
    target = torch.stack([p[0], p[0]]).expand(20_000, 2, 2)
    exact = Speculative()(drafts, q.expand(20_000, 1, 2), target, torch.Generator().manual_seed(1))
    lenient = Speculative(lenience=0.5)(drafts, q.expand(20_000, 1, 2), target, torch.Generator().manual_seed(1))
    assert exact.num_accepted.float().mean().item() == pytest.approx(0.5, abs=0.02)
    assert bool((lenient.num_accepted == 1).all())
    rejected = exact.num_accepted == 0
    assert bool((exact.next_token[rejected] == 0).all())  # residual max(0, p - q) has mass only on token 0


def test_strategies_reduce_to_sampling_p_with_no_drafts():
    p = dist([1, 2, 3, 4]).view(1, 1, 4)
    empty = torch.zeros(1, 0, dtype=torch.long)
    for rule in (Greedy(), Speculative(), Typical(), TopK()):
        verdict = rule(empty, torch.zeros(1, 0, 4), one_hot_probs(torch.tensor([[2]]), 4), GEN)
        assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [2]


@pytest.mark.parametrize("rule", [Greedy(), Speculative(), Speculative(lenience=0.3), Typical(), Typical(0.99, 5.0),
                                  TopK(n=1), TopK(n=5)], ids=repr)
def test_strategies_that_say_so_are_greedy_matching_on_point_masses(rule):
    """The loop judges these on token ids at temperature 0 (``greedy_verdict``); here, on random point masses
    (q at the draft, p at the target's choice, as temperature 0 makes them), the rule itself must agree."""
    g = torch.Generator().manual_seed(4)
    drafts = torch.randint(0, 3, (500, 4), generator=g)  # a small vocabulary so that drafts often match
    target_choice = torch.randint(0, 3, (500, 5), generator=g)
    verdict = rule(drafts, one_hot_probs(drafts, 6), one_hot_probs(target_choice, 6), g)
    expected = greedy_verdict(drafts, target_choice)
    assert rule.greedy_at_point_masses
    assert verdict.num_accepted.tolist() == expected.num_accepted.tolist()
    assert verdict.next_token.tolist() == expected.next_token.tolist()
    assert 0 < expected.num_accepted.float().mean() < 4  # both accepting and rejecting rows were exercised


def test_typical_with_a_threshold_of_one_is_not_greedy_on_point_masses():
    rule = Typical(epsilon=1.0, delta=1.0)  # threshold min(1, 1 * exp(-0)) = 1: nothing is accepted
    drafts = torch.tensor([[2, 2]])
    verdict = rule(drafts, one_hot_probs(drafts, 4), one_hot_probs(torch.tensor([[2, 2, 3]]), 4), GEN)
    assert not rule.greedy_at_point_masses
    assert verdict.num_accepted.tolist() == [0] and verdict.next_token.tolist() == [2]


def test_usable_logits_allow_ruled_out_tokens_but_not_nan_or_infinity():
    inf = float("inf")
    good = torch.tensor([[0.5, -inf, 2.0], [1.0, 1.0, -inf]])
    assert usable(good) and finite_peaks(greedy_choice(good)[1])
    assert greedy_choice(good)[0].tolist() == [2, 0]
    for bad in ([0.5, float("nan"), 2.0], [0.5, inf, 2.0], [-inf, -inf, -inf]):
        for dtype in (torch.float32, torch.float16):  # fp16: a peak near its largest value is still finite
            logits = torch.tensor([[0.0, 6e4, 2.0], bad], dtype=dtype)
            assert not usable(logits) and not finite_peaks(greedy_choice(logits)[1])
            assert usable(logits[:1]) and finite_peaks(greedy_choice(logits[:1])[1])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_greedy_choice_picks_the_first_maximum_like_torch_argmax(dtype):
    coarse = torch.randint(0, 4, (64, 3, 50), generator=torch.Generator().manual_seed(2)).to(dtype)  # many ties
    assert greedy_choice(coarse)[0].tolist() == coarse.argmax(-1).tolist()
    assert greedy_choice(torch.tensor([[1.0, 3.0, 3.0, 0.0]], dtype=dtype))[0].tolist() == [1]


def test_make_strategy_names_and_errors():
    assert isinstance(make_strategy("typical"), Typical)
    assert make_strategy(TopK(n=2)) == TopK(n=2)
    with pytest.raises(ValueError, match="unknown strategy 'medusa'; known strategies: greedy, speculative, typical, topk"):
        make_strategy("medusa")
    with pytest.raises(ValueError, match="lenience"):
        Speculative(lenience=0)
    with pytest.raises(ValueError, match="topk strategy n"):
        TopK(n=0)


def test_sampling_transform_matches_hand_computation():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    assert logits_to_probs(logits, SamplingConfig()).tolist() == [[1, 0, 0, 0, 0]]
    t = 0.5
    expected = torch.softmax(logits / t, -1)
    assert torch.allclose(logits_to_probs(logits, SamplingConfig(temperature=t)), expected)
    top2 = torch.softmax(logits[:, :2] / t, -1)
    assert torch.allclose(logits_to_probs(logits, SamplingConfig(temperature=t, top_k=2))[:, :2], top2)
    assert logits_to_probs(logits, SamplingConfig(temperature=t, top_k=2))[:, 2:].abs().sum() == 0
    full = torch.softmax(logits, -1)[0]  # [0.64, 0.23, 0.09, 0.03, 0.004]
    nucleus = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.9))[0]
    assert (nucleus > 0).tolist() == [True, True, True, False, False]  # 0.64 + 0.23 < 0.9 needs the third
    assert torch.allclose(nucleus[:3], full[:3] / full[:3].sum())
    min_p = logits_to_probs(logits, SamplingConfig(temperature=1.0, min_p=0.2))[0]
    assert (min_p > 0).tolist() == [True, True, False, False, False]  # 0.09 < 0.2 * 0.64


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": -0.1}, "temperature must be >= 0"),
    ({"top_k": 0}, "top_k must be an integer >= 1"),
    ({"top_p": 0.0}, r"top_p must be in \(0, 1\]"),
    ({"top_p": 1.5}, r"top_p must be in \(0, 1\]"),
    ({"min_p": 2.0}, r"min_p must be in \[0, 1\]"),
])
def test_sampling_config_rejects_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingConfig(**kwargs)


# --- synthetic acceptance (benchmarks at a controlled acceptance) -------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("acceptance", [0.3, 0.8])
def test_synthetic_acceptance_is_accepted_at_its_rate_through_the_loop(target, draft, temperature, acceptance):
    """Pooled over every verified draft position of a few hundred drafts, the acceptance frequency is within 4.5
    binomial standard deviations of the set rate, whatever the tokens (the draft and target are unrelated)."""
    ids, mask = left_pad(random_prompts([4, 7, 5, 6], seed=8))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.SyntheticAcceptance(acceptance),
                              specdec.FixedLength(4), specdec.SamplingConfig(temperature=temperature))
    out = decoder.generate(ids, mask, max_new_tokens=60, seed=1)
    attempts = sum(sum(row.position_attempts) for row in out.stats.rows)
    accepts = sum(sum(row.position_accepts) for row in out.stats.rows)
    assert attempts >= 200
    sigma = (acceptance * (1 - acceptance) / attempts) ** 0.5
    assert abs(accepts / attempts - acceptance) < 4.5 * sigma


def test_synthetic_acceptance_at_temperature_0_judges_token_ids_and_emits_the_targets_argmax(target, draft,
                                                                                             monkeypatch):
    """At temperature 0 no one-hot distributions are built and the strategy's probability path never runs; with
    acceptance 0 every draft is rejected, so the output is the target's own greedy decoding."""
    import specdec.verify as verify_module

    def refuse(*args):
        raise AssertionError("built one-hot distributions at temperature 0")

    monkeypatch.setattr(verify_module, "one_hot_probs", refuse)
    monkeypatch.setattr(specdec.SyntheticAcceptance, "__call__", refuse)
    prompt = random_prompts([6], seed=4)[0]
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.SyntheticAcceptance(0.0),
                              specdec.FixedLength(3))
    out = decoder.generate(torch.tensor([prompt]), None, max_new_tokens=12)
    assert out.stats.accepted == 0 and out.stats.drafted > 0
    assert out.tokens[0] == hf_greedy(target, prompt, 12)


def test_synthetic_acceptance_is_lossy_and_checks_its_rate():
    assert specdec.SyntheticAcceptance(0.5).lossless is False
    assert specdec.make_strategy("synthetic", acceptance=0.6).name == "synthetic"
    for bad, error in ((1.5, ValueError), (-0.1, ValueError), ("0.5", TypeError), (True, TypeError)):
        with pytest.raises(error, match=f"synthetic acceptance must be .*got {bad!r}"):
            specdec.SyntheticAcceptance(bad)
