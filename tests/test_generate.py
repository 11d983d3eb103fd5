"""The front door: statistics identities, reproducibility, batch equivalence, and every bad input."""

import copy
import math

import pytest
import torch

import specdec
from specdec.emit import NonFiniteLogitsError
from conftest import hf_greedy, left_pad, random_prompts, tiny_gpt2


def test_stats_identities(target, draft):
    prompts = random_prompts([4, 9, 6], seed=1)
    ids, mask = left_pad(prompts)
    out = specdec.generate(target, ids, draft=draft, attention_mask=mask, k=4, max_new_tokens=20)
    s = out.stats
    assert 0 < s.accepted <= s.drafted
    assert s.emitted == sum(map(len, out.tokens)) == 60
    assert s.mean_accepted_length == s.emitted / s.target_calls
    assert s.acceptance_rate == s.accepted / s.drafted
    for row, tokens in zip(s.rows, out.tokens):
        assert row.emitted == len(tokens) and row.accepted <= row.drafted
        # Every call verifies drafts, the prefill too; the last may draft nothing (one token of budget left).
        verifications = row.target_calls
        assert row.position_attempts[0] == verifications - (row.drafted < 4 * verifications)
    first = s.per_position[0]
    assert first == sum(r.position_accepts[0] for r in s.rows) / sum(r.position_attempts[0] for r in s.rows)
    assert 0 <= s.expected_acceptance <= 1
    assert s.wall_seconds >= s.draft_seconds + s.target_seconds > 0 and s.ttft_seconds <= s.wall_seconds
    assert s.cost_ratio > 0


def test_baseline_stats(target):
    out = specdec.generate(target, torch.tensor([[5, 6, 7]]), max_new_tokens=12)
    s = out.stats
    assert (s.drafted, s.accepted, s.emitted, s.target_calls) == (0, 0, 12, 12)
    assert s.mean_accepted_length == 1 and math.isnan(s.acceptance_rate) and s.expected_acceptance is None


def test_same_seed_same_output_and_seeds_differ(target, draft):
    ids, mask = left_pad(random_prompts([5, 8], seed=2))
    run = lambda seed: specdec.generate(target, ids, draft=draft, attention_mask=mask, temperature=1.0, top_p=0.95,
                                        max_new_tokens=24, seed=seed).tokens  # noqa: E731
    assert run(7) == run(7)
    assert run(7) != run(8)


def test_each_row_of_a_batch_equals_the_row_alone_with_draft_equal_target(target):
    """With draft == target every draft is accepted (the bonus-token path, every step); at temperature 0 each row
    then depends only on its own prompt, whatever else is in the batch and whenever rows leave it."""
    prompts = random_prompts([3, 7, 5], seed=3)
    ids, mask = left_pad(prompts)
    batched = specdec.generate(target, ids, draft=target, attention_mask=mask, k=3, max_new_tokens=16)
    assert batched.tokens == [specdec.generate(target, torch.tensor([p]), draft=target, k=3,
                                               max_new_tokens=16).tokens[0] for p in prompts]


class CountForwards:
    def __init__(self, *models):
        self.calls = 0
        self.handles = [m.register_forward_hook(self.hook) for m in models]

    def hook(self, *_):
        self.calls += 1

    def remove(self):
        for h in self.handles:
            h.remove()


BAD_INPUTS = [
    ({"strategy": "medusa"}, ValueError, "unknown strategy 'medusa'; known strategies: greedy, speculative"),
    ({"k": 0}, ValueError, "k must be an integer >= 1, got 0"),
    ({"temperature": -1.0}, ValueError, "temperature must be >= 0"),
    ({"top_p": 1.2}, ValueError, r"top_p must be in \(0, 1\] or None, got 1.2"),
    ({"top_k": 0}, ValueError, "top_k must be an integer >= 1"),
    ({"max_new_tokens": 0}, ValueError, "max_new_tokens must be an integer >= 1"),
    ({"input_ids": torch.zeros(1, 0, dtype=torch.long)}, ValueError, "empty prompt"),
    ({"input_ids": torch.ones(1, 128, dtype=torch.long)}, ValueError, "at or beyond the context limit of 128"),
    ({"attention_mask": torch.ones(1, 3)}, ValueError, r"attention_mask must have the shape of input_ids \(1, 4\)"),
    ({"attention_mask": torch.tensor([[1, 1, 0, 0]])}, ValueError, "left-padded"),
    ({"attention_mask": torch.tensor([[0, 0, 0, 0]])}, ValueError, r"empty prompt in batch rows \[0\]"),
    ({"input_ids": torch.ones(4, dtype=torch.long)}, ValueError, r"shape \[B, T\]"),
    ({"input_ids": torch.ones(1, 4)}, TypeError, "integer token ids"),
    ({"strategy": "greedy", "temperature": 0.7}, ValueError, "strategy 'greedy' .* needs temperature 0"),
    ({"eos_token_id": "eos"}, ValueError, "eos_token_id must be"),
    ({"input_ids": torch.ones(1, 4, dtype=torch.long, device="meta")}, ValueError, "input_ids is on meta"),
    ({"draft": "gpt2"}, TypeError, "draft must be a causal LM, a Drafter, or None; got str"),
    ({"cache_layout": "paged"}, ValueError, "unknown cache layout 'paged'; known layouts: dynamic, static"),
    # Reliability pass: each of these used to fail deep inside torch, or not at all.
    ({"input_ids": torch.tensor([[1, 2, 97, 4]])}, ValueError, r"token id 97, outside the target's vocabulary \[0, 97\)"),
    ({"input_ids": torch.tensor([[1, -2, 3, 4]])}, ValueError, r"token id -2, outside the target's vocabulary"),
    ({"temperature": float("inf")}, ValueError, "temperature must be >= 0 and finite .* got inf"),
    ({"temperature": float("nan")}, ValueError, "temperature must be >= 0 and finite .* got nan"),
    ({"temperature": "1"}, TypeError, "temperature must be a number, got '1'"),
    ({"top_p": "0.9"}, TypeError, "top_p must be a number, got '0.9'"),
    ({"seed": "x"}, TypeError, "seed must be an integer, got 'x'"),
    ({"seed": 1.5}, TypeError, "seed must be an integer, got 1.5"),
    ({"k": "x"}, ValueError, "k must be an integer >= 1, got 'x'"),
    ({"draft_length": "x"}, TypeError, r"draft_length must be a draft-length policy .* got 'x'"),
    ({"eos_token_id": 97}, ValueError, r"eos_token_id 97 is outside the target's vocabulary \[0, 97\)"),
    ({"eos_token_id": [3, 500]}, ValueError, r"eos_token_id 500 is outside the target's vocabulary"),
    ({"attention_mask": torch.tensor([[0.5, 1.0, 1.0, 1.0]])}, ValueError, "only 0 .* and 1 .* got 0.5"),
    ({"attention_mask": torch.tensor([[2, 1, 1, 1]])}, ValueError, "only 0 .* and 1 .* got 2"),
]


@pytest.mark.parametrize("override, error, message", BAD_INPUTS, ids=[m[:30] for _, _, m in BAD_INPUTS])
def test_bad_input_is_rejected_before_any_forward_pass(target, draft, override, error, message):
    kwargs = {"input_ids": torch.tensor([[1, 2, 3, 4]]), "draft": draft} | override
    counter = CountForwards(target, draft)
    try:
        with pytest.raises(error, match=message):
            specdec.generate(target, **kwargs)
    finally:
        counter.remove()
    assert counter.calls == 0


@pytest.mark.parametrize("role", ["target", "draft"])
def test_a_model_in_training_mode_is_refused_by_name(target, draft, role):
    """Dropout would draw different tokens on every call, silently: refuse, naming the model and the fix."""
    model = {"target": target, "draft": draft}[role]
    model.train()
    try:
        with pytest.raises(ValueError, match=r"model 'GPT2LMHeadModel' is in training mode .* call model.eval\(\)"):
            specdec.generate(target, torch.tensor([[1, 2, 3]]), draft=draft)
    finally:
        model.eval()


def test_padding_may_hold_any_id_but_real_tokens_may_not():
    """Only tokens the mask marks real are fed; padding ids outside the vocabulary are harmless."""
    target = tiny_gpt2(0, layers=1)
    ids, mask = torch.tensor([[500, 1, 2]]), torch.tensor([[0, 1, 1]])
    assert len(specdec.generate(target, ids, attention_mask=mask, max_new_tokens=3).tokens[0]) == 3


def test_draft_with_another_vocabulary_is_rejected(target):
    other = tiny_gpt2(2, layers=1, vocab=50)
    with pytest.raises(ValueError, match="draft vocab_size=50, target vocab_size=97"):
        specdec.generate(target, torch.tensor([[1, 2]]), draft=other)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("broken", ["draft", "target"])
def test_nan_logits_raise_naming_the_model(broken, temperature):
    models = {"draft": tiny_gpt2(1, layers=1), "target": tiny_gpt2(0, layers=2)}
    with torch.no_grad():
        models[broken].lm_head.weight[3, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match=f"the {broken} model produced NaN/inf logits"):
        specdec.generate(models["target"], torch.tensor([[1, 2, 3]]), draft=models["draft"], max_new_tokens=8,
                         temperature=temperature)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_nan_logits_stop_the_baseline_too(temperature):
    target = tiny_gpt2(0, layers=2)
    with torch.no_grad():
        target.lm_head.weight[3, 0] = float("nan")
    with pytest.raises(NonFiniteLogitsError, match="the target model produced NaN/inf logits"):
        specdec.generate(target, torch.tensor([[1, 2, 3]]), max_new_tokens=8, temperature=temperature)


def test_untimed_phases_give_the_same_tokens_and_nan_phase_times(target, draft):
    ids = torch.tensor([[4, 5, 6]])
    timed = specdec.Decoder(target, specdec.ModelDrafter(draft)).generate(ids, max_new_tokens=10)
    untimed = specdec.Decoder(target, specdec.ModelDrafter(draft), time_phases=False).generate(ids, max_new_tokens=10)
    assert untimed.tokens == timed.tokens
    assert math.isnan(untimed.stats.draft_seconds) and math.isnan(untimed.stats.cost_ratio)
    assert untimed.stats.wall_seconds > 0 and timed.stats.target_seconds > 0


class RejectAll:
    """A custom rule with no ``greedy_at_point_masses``: the loop must call it even at temperature 0."""

    name, lossless = "reject_all", False

    def __call__(self, draft_tokens, draft_probs, target_probs, generator):
        assert draft_probs.shape == target_probs[:, :-1].shape  # point masses built for it, q and p alike
        return specdec.Verdict(torch.zeros_like(draft_tokens[:, 0]), target_probs[:, 0].argmax(-1))


@pytest.mark.parametrize("strategy", [RejectAll(), specdec.Typical(epsilon=1.0, delta=1.0)], ids=["custom", "typical"])
def test_strategies_not_greedy_on_point_masses_are_called_at_temperature_zero(target, draft, strategy):
    ids = torch.tensor([[4, 5, 6]])
    baseline = specdec.generate(target, ids, max_new_tokens=12)
    out = specdec.generate(target, ids, draft=draft, strategy=strategy, k=3, max_new_tokens=12)
    assert out.tokens == baseline.tokens  # the target's argmax, one token per step
    assert out.stats.accepted == 0 and out.stats.target_calls == 12


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_expected_acceptance_is_the_acceptance_rate_for_single_greedy_drafts(target, draft, drafter):
    """With k = 1 at temperature 0 every draft is verified and sum_x min(q, p) is 1 exactly when it is accepted,
    for model drafts and point-mass (n-gram) drafts alike."""
    ids, mask = left_pad(random_prompts([6, 9], seed=8))
    drafter = draft if drafter == "model" else specdec.NGramDrafter(max_ngram=2, min_ngram=1)
    s = specdec.generate(target, ids, draft=drafter, attention_mask=mask, k=1, max_new_tokens=30).stats
    assert 0 < s.accepted < s.drafted
    assert s.expected_acceptance == s.acceptance_rate


def count_forwards(*models):
    """Calls of each model and of its body (the body runs inside every model call, and alone in a draft's
    prefill), counted by forward pre-hooks: {name: [model calls, body calls]}."""
    counts = {name: [0, 0] for name in range(len(models))}
    handles = []
    for i, model in enumerate(models):
        for part, module in enumerate((model, model.base_model)):
            def count(*_, i=i, part=part):
                counts[i][part] += 1
            handles.append(module.register_forward_pre_hook(count))
    return counts, handles


def test_the_prefill_verifies_the_first_draft(target):
    """As in transformers' generate(): n new tokens cost the baseline n target forwards, the prefill's logits giving
    the first. As in its assisted generation, the first draft runs from the prompt and the target's prefill
    verifies it: with draft = target at temperature 0, k + 1 tokens cost one target forward. (Counted on
    transformers' forward, whose module hooks see every call; the lean forward runs the same steps.)"""
    ids = torch.tensor(random_prompts([7], seed=2))
    counts, handles = count_forwards(target)
    out = specdec.generate(target, ids, max_new_tokens=5, forward="transformers")
    for handle in handles:
        handle.remove()
    assert len(out.tokens[0]) == 5 and counts == {0: [5, 5]}
    assert (out.stats.first_step_emitted, out.stats.decode_tokens) == (1, 4) and out.stats.itl_seconds > 0
    same_as_target = copy.deepcopy(target)
    counts, handles = count_forwards(target, same_as_target)
    speculative = specdec.generate(target, ids, draft=same_as_target, strategy="greedy", k=4, max_new_tokens=5,
                                   forward="transformers")
    for handle in handles:
        handle.remove()
    assert speculative.tokens == out.tokens and speculative.stats.target_calls == 1
    assert (speculative.stats.first_step_emitted, speculative.stats.decode_tokens) == (5, 0)
    assert math.isnan(speculative.stats.itl_seconds)  # no token after the first step
    # One target forward with its head; four draft forwards, the first of them feeding the whole prompt.
    assert counts == {0: [1, 1], 1: [4, 4]}


def first_new_token_at(reference: list[int], start: int) -> int:
    """The first index from ``start`` whose token does not occur earlier in ``reference``."""
    return next(i for i in range(start, len(reference)) if reference[i] not in reference[:i])


def test_a_draft_stops_once_every_generating_row_has_drafted_an_eos(target):
    """Nothing drafted after an EOS could be emitted, so the draft stops there (as transformers' assisted generation
    does). Draft = target at temperature 0: the first draft runs from the prompt to the EOS, not to k."""
    prompt = random_prompts([6], seed=0)[0]
    reference = hf_greedy(target, prompt, 20)
    end = first_new_token_at(reference, 3)  # the EOS: draft position end of the first draft (from 0)
    eos = reference[end]
    out = specdec.generate(target, torch.tensor([prompt]), draft=target, strategy="greedy", k=12, max_new_tokens=20,
                           eos_token_id=eos)
    assert out.tokens == [reference[: end + 1]] and out.stats.drafted == out.stats.accepted == end + 1
    # Two rows: the draft goes on while one row has not drafted an EOS; each row still ends at its own EOS.
    other = random_prompts([8], seed=3)[0]
    ids, mask = left_pad([prompt, other])
    both = specdec.generate(target, ids, draft=target, attention_mask=mask, strategy="greedy", k=12,
                            max_new_tokens=20, eos_token_id=eos)
    assert both.tokens == [reference[: end + 1], hf_greedy(target, other, 20, eos_token_id=eos)]
    assert both.stats.rows[0].drafted == 12  # drafted on, for the other row
