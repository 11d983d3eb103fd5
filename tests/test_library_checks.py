"""The library's argument checks (specdec/checks.py), the temperature floor and check_lossless's arguments: each
bad value is refused in one line naming it, and each accepted value decodes as it should."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from conftest import PROMPT, random_prompts, tiny_gpt2
from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

import specdec
from specdec.checks import (SEED_RANGE, check_allocation, check_bool, check_eos_ids, check_model, check_seed,
                            check_strategy_object, free_memory)
from specdec.sampling import MIN_TEMPERATURE, SamplingConfig
from specdec.testing import chi_square_p_value, check_lossless, exact_joint, minimum_samples, tiny_model


@pytest.fixture(scope="module")
def pair():
    return tiny_gpt2(0, layers=2), tiny_gpt2(1, layers=1)


def decode(pair, temperature: float, eos_token_id=None, seed: int = 0) -> list[list[int]]:
    target, draft = pair
    ids = torch.tensor(random_prompts([6, 6, 6], seed=3))
    out = specdec.generate(target, ids, draft=draft, k=3, max_new_tokens=12, temperature=temperature,
                           eos_token_id=eos_token_id, seed=seed)
    return out.tokens


# --- eos ids -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eos", [np.int64(7), torch.tensor(7), torch.tensor([7]), np.array([7, 9]),
                                 torch.tensor([7, 9]), (7, np.int32(9))],
                         ids=["np.int64", "0-d tensor", "1-element tensor", "np.array", "1-d tensor", "mixed tuple"])
def test_eos_ids_as_numpy_integers_or_tensors_are_converted(eos):
    ids = check_eos_ids(eos, torch.device("cpu"), vocab_size=97)
    assert ids.dtype == torch.long and ids.tolist() == torch.as_tensor(np.asarray(eos, dtype=np.int64)).flatten().tolist()


def test_an_eos_given_as_np_int64_stops_decoding_like_the_int(pair):
    plain = decode(pair, 0.0)
    eos = plain[0][4]  # a token the first row emits, so that row stops there
    assert decode(pair, 0.0, eos_token_id=np.int64(eos)) == decode(pair, 0.0, eos_token_id=int(eos))
    assert decode(pair, 0.0, eos_token_id=torch.tensor(eos)) == decode(pair, 0.0, eos_token_id=int(eos))
    assert len(decode(pair, 0.0, eos_token_id=int(eos))[0]) == plain[0].index(eos) + 1


@pytest.mark.parametrize("eos", [torch.tensor(7.0), np.float64(7), "7", [], [True], torch.tensor(True), [-1],
                                 torch.tensor([[7, 9]])])
def test_eos_ids_that_are_not_token_ids_are_refused(eos):
    with pytest.raises(ValueError, match="eos_token_id must be a token id, a list of token ids, or None"):
        check_eos_ids(eos, torch.device("cpu"))


# --- seeds ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [SEED_RANGE[0] - 1, SEED_RANGE[0], 0, SEED_RANGE[1], SEED_RANGE[1] + 1, 2**64])
def test_the_seed_range_is_the_one_torch_accepts(seed):
    try:
        torch.Generator().manual_seed(seed)
        torch_accepts = True
    except (ValueError, RuntimeError, OverflowError):
        torch_accepts = False
    if torch_accepts:
        assert check_seed(seed) == seed
    else:
        with pytest.raises(ValueError, match=r"seed must be in \[-2\*\*63, 2\*\*64 - 1\]"):
            check_seed(seed)


def test_seed_2_to_the_64_is_refused_by_generate_naming_the_seed(pair):
    with pytest.raises(ValueError, match=f"seed must be in .*got {2**64}"):
        decode(pair, 1.0, seed=2**64)
    with pytest.raises(TypeError, match="seed must be an integer, got True"):
        check_seed(True)
    assert check_seed(np.int64(5)) == 5


# --- sizes against memory ------------------------------------------------------------------------------------------

def test_an_allocation_larger_than_free_memory_is_refused_naming_the_parameter():
    free = free_memory(torch.device("cpu"))
    if free is None:
        pytest.skip("this system does not say how much memory is available")
    too_many = free // 4 + 1  # float32 elements one past the free bytes
    with pytest.raises(ValueError, match=r"^k=10\*\*12 is too large: it needs a tensor of [\d,]+ float32 elements"):
        check_allocation("k=10**12", too_many, torch.float32, "cpu")
    check_allocation("max_new_tokens", 1024, torch.float32, "cpu")


# --- models, strategies, switches ----------------------------------------------------------------------------------

def small_config() -> GPT2Config:
    return GPT2Config(vocab_size=11, n_positions=16, n_embd=8, n_layer=1, n_head=2, bos_token_id=None, eos_token_id=None)


def test_a_model_name_is_refused_with_how_to_load_it():
    with pytest.raises(TypeError, match=r"target must be a loaded model, got the name 'gpt2'; load it first, e\.g\. "
                                        r"AutoModelForCausalLM\.from_pretrained\('gpt2'\)"):
        check_model("target", "gpt2")
    with pytest.raises(TypeError, match="got the name 'gpt2'"):
        specdec.generate("gpt2", torch.tensor([[1, 2]]))


def test_a_model_without_an_lm_head_is_refused():
    with pytest.raises(TypeError, match="target GPT2Model has no language-model head"):
        check_model("target", GPT2Model(small_config()).eval())
    check_model("target", GPT2LMHeadModel(small_config()).eval())


def test_a_model_with_meta_tensors_is_refused():
    with torch.device("meta"):
        model = GPT2LMHeadModel(small_config())
    with pytest.raises(ValueError, match=r"draft has \d+ tensor\(s\) on the meta device, e\.g\. '.+': their weights "
                                         r"were never loaded"):
        check_model("draft", model)


@pytest.mark.parametrize("value", ["false", "true", 0, 1, None])
def test_switches_take_only_bools(value):
    with pytest.raises(TypeError, match=f"compile must be True or False, got {value!r}"):
        check_bool("compile", value)
    assert check_bool("compile", False) is False


def test_a_strategy_class_is_refused_and_instances_and_rules_pass():
    with pytest.raises(TypeError, match=r"strategy must be an instance, got the class Speculative; write Speculative\(\)"):
        check_strategy_object(specdec.Speculative)
    with pytest.raises(TypeError, match="got the name 'speculative'"):
        check_strategy_object("speculative")
    with pytest.raises(TypeError, match="strategy must be an acceptance strategy"):
        check_strategy_object(0.5)
    check_strategy_object(specdec.Speculative())
    check_strategy_object(lambda draft_tokens, draft_probs, target_probs, generator: None)


# --- the temperature floor -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [math.nextafter(MIN_TEMPERATURE, 0.0), 1e-38, 1e-40, 5e-324])
def test_temperatures_below_the_floor_are_refused(temperature):
    with pytest.raises(ValueError, match=r"temperature must be 0 \(greedy\) or at least 1e-30"):
        SamplingConfig(temperature=temperature)


def test_at_the_floor_sampling_is_the_argmax(pair):
    """At 1e-30 every tempered distribution is a point mass at the argmax, so speculative sampling emits the
    greedy tokens; below the floor (1e-40) it emitted the last vocabulary id, every step."""
    SamplingConfig(temperature=MIN_TEMPERATURE)
    assert decode(pair, MIN_TEMPERATURE, seed=4) == decode(pair, 0.0)


# --- check_lossless ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def default_minimum() -> int:
    """The fewest samples check_lossless accepts for its default models and sampling."""
    return minimum_samples(exact_joint(tiny_model(seed=10, layers=2), list(PROMPT), SamplingConfig(temperature=1.0), 3))


def test_check_lossless_refuses_too_few_samples_and_says_the_minimum(default_minimum):
    assert 1000 < default_minimum < 6000  # the default (6000) passes; the 1000 gave p = nan
    with pytest.raises(ValueError, match=f"samples=1000 is too few .* needs samples >= {default_minimum} "):
        check_lossless(specdec.Speculative(), samples=1000)


def test_check_lossless_at_its_minimum_gives_a_real_p_value(default_minimum):
    report = check_lossless(specdec.Speculative(), samples=default_minimum)
    assert 0 < report.p_value <= 1 and report.lossless and report.samples == default_minimum


@pytest.mark.parametrize("argument, message", [
    (dict(significance=2.0), r"significance must be in \(0, 1\), got 2.0"),
    (dict(significance=0), r"significance must be in \(0, 1\), got 0"),
    (dict(samples=0), "samples must be an integer >= 1, got 0"),
    (dict(samples=True), "samples must be an integer >= 1, got True"),
    (dict(length=0), "length must be an integer >= 1, got 0"),
    (dict(k=0), "k must be an integer >= 1, got 0"),
    (dict(seed=2**64), r"seed must be in \[-2\*\*63"),
    (dict(sampling="t1"), "sampling must be a specdec.SamplingConfig or None"),
    (dict(make_drafter="ngram"), "make_drafter must be a function"),
    (dict(target="gpt2"), "target must be a loaded model"),
])
def test_check_lossless_checks_its_arguments(argument, message):
    with pytest.raises((ValueError, TypeError), match=message):
        check_lossless(specdec.Speculative(), **argument)


def test_check_lossless_refuses_a_strategy_class():
    with pytest.raises(TypeError, match="write Speculative()"):
        check_lossless(specdec.Speculative)


def test_chi_square_is_exact_where_it_can_be_and_refuses_where_it_cannot():
    point_mass = torch.tensor([0.0, 1.0, 0.0])
    assert chi_square_p_value(torch.ones(10, dtype=torch.long), point_mass) == 1.0
    assert chi_square_p_value(torch.tensor([1, 1, 2]), point_mass) == 0.0  # an impossible outcome occurred
    probs = torch.tensor([0.9, 0.1])
    assert minimum_samples(probs) == 50
    with pytest.raises(ValueError, match="49 samples are too few .* it needs at least 50"):
        chi_square_p_value(torch.tensor([0] * 44 + [1] * 5), probs)
    assert chi_square_p_value(torch.tensor([0] * 45 + [1] * 5), probs) > 0.5


def test_a_rare_outcome_seen_once_is_not_evidence_against_the_distribution():
    """The pool of rare cells expects far fewer than 5; pooled alone it made one occurrence look like a p ~ 0
    misfit, so it joins the smallest large cell."""
    probs = torch.tensor([0.5, 0.5 - 1e-6, 1e-6])
    samples = torch.tensor([0] * 500 + [1] * 499 + [2])
    assert chi_square_p_value(samples, probs) > 0.5
