"""Reliability 2, library side: every path into the loop gets the checks ``generate`` gets, in one line, before
any forward; a custom strategy's verdict is checked; a Decoder used from many threads refuses rather than mixes
calls."""

from __future__ import annotations

import threading

import pytest
import torch

import specdec
from conftest import random_prompts, tiny_gpt2


@pytest.fixture(scope="module")
def other_vocab():
    return tiny_gpt2(5, layers=1, vocab=50)


def test_a_model_drafter_with_another_vocabulary_is_refused_by_the_decoder(target, other_vocab):
    with pytest.raises(ValueError, match=r"vocab_size=50 and the target 97.*specdec.CrossTokenizerDrafter"):
        specdec.Decoder(target, specdec.ModelDrafter(other_vocab))
    with pytest.raises(ValueError, match="vocab_size=50 and the target 97"):
        specdec.Decoder(target, specdec.TreeDrafter(other_vocab, (2,)))


@pytest.mark.parametrize("bad, message", [
    ("gpt2", "target must be"),
    (torch.nn.Linear(2, 2), "target must be"),
])
def test_a_target_that_is_not_a_causal_lm_is_refused(bad, message):
    with pytest.raises(TypeError, match=message):
        specdec.Decoder(bad)


def test_switches_and_strategy_objects_are_checked_by_the_decoder(target, draft):
    with pytest.raises(TypeError, match="compile must be True or False"):
        specdec.Decoder(target, specdec.ModelDrafter(draft), compile="false")
    with pytest.raises(TypeError, match="strategy must be an instance, got the class Speculative"):
        specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Speculative)
    with pytest.raises(ValueError, match="step must be one of auto, host, device, got 'gpu'"):
        specdec.Decoder(target, step="gpu")


@pytest.mark.parametrize("branching", [5, [[2], [1]], [], [0, 2], [9000]])
def test_bad_tree_shapes_are_refused_by_the_drafter(draft, branching):
    with pytest.raises(ValueError, match="branching"):
        specdec.TreeDrafter(draft, branching)


def test_a_huge_k_sizes_nothing_beyond_the_context(target, draft):
    """k = 10**12 is bounded by the context (a longer draft could never be verified): the call runs and equals k at
    the context's length."""
    ids = torch.tensor([random_prompts([5], seed=1)[0]])
    huge = specdec.generate(target, ids, draft=draft, k=10**12, max_new_tokens=6)
    bounded = specdec.generate(target, ids, draft=draft, k=target.config.n_positions, max_new_tokens=6)
    assert huge.tokens == bounded.tokens


def test_a_budget_larger_than_memory_is_refused_naming_max_new_tokens(target):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="max_new_tokens is too large"):
        specdec.generate(target, ids, max_new_tokens=10**13)


class OutOfRange(specdec.AcceptanceStrategy):
    """Keeps one draft more than proposed: a custom rule's bug."""

    name = "out_of_range"

    def __call__(self, draft_tokens, draft_probs, target_probs, generator):
        k = draft_tokens.shape[1]
        return specdec.Verdict(torch.full_like(draft_tokens[:, 0], k + 1), target_probs[:, 0].argmax(-1))


class WrongShape(specdec.AcceptanceStrategy):
    name = "wrong_shape"

    def __call__(self, draft_tokens, draft_probs, target_probs, generator):
        return specdec.Verdict(torch.zeros(1, dtype=torch.long), target_probs[:, 0].argmax(-1))


@pytest.mark.parametrize("step", ["host", "device"])
def test_a_custom_verdict_out_of_range_stops_the_call_naming_the_strategy(target, draft, step):
    ids = torch.tensor([random_prompts([5], seed=2)[0]] * 2)
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), OutOfRange(), specdec.FixedLength(2),
                              specdec.SamplingConfig(temperature=1.0), step=step)
    with pytest.raises(specdec.StrategyVerdictError, match="strategy 'out_of_range' returned a verdict out of range"):
        decoder.generate(ids, max_new_tokens=8)
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), WrongShape(), specdec.FixedLength(2),
                              specdec.SamplingConfig(temperature=1.0), step=step)
    with pytest.raises(ValueError, match=r"strategy 'wrong_shape' returned num_accepted with shape \(1,\)"):
        decoder.generate(ids, max_new_tokens=8)


def test_one_decoder_from_many_threads_works_or_refuses_at_once(target, draft):
    """Each call of a Decoder holds its drafter's and caches' state for the call: a concurrent call is refused in
    one line, never mixed into the running one. Calls that ran give the tokens a lone call gives."""
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(3))
    ids = torch.tensor([random_prompts([6], seed=3)[0]])
    expected = decoder.generate(ids, max_new_tokens=30).tokens
    results, errors = [], []
    barrier = threading.Barrier(8)

    def call():
        barrier.wait()
        try:
            results.append(decoder.generate(ids, max_new_tokens=30).tokens)
        except RuntimeError as error:
            errors.append(str(error))
    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) + len(errors) == 8 and results
    assert all(tokens == expected for tokens in results)
    assert all(error.startswith("this Decoder is generating in another thread") for error in errors)
