"""The library's probes: odd dtypes, shapes, devices and values; custom parts with bugs; what the constructors
are handed; the helpers."""

from __future__ import annotations

import warnings
from typing import Callable

import numpy as np
import torch

from conftest import left_pad, random_prompts, tiny_gpt2
from probes.core import (
    CLEAR, CONFUSING, CORRECT, LIBRARY, RAGGED, SILENTLY_ACCEPTED, TRACEBACK, agreement, batch, generate, models,
    Outcome, probe, reference, refusal,
)


# --- Library: odd dtypes, shapes, devices and values ---------------------------------------------------------------

@probe(LIBRARY, CORRECT)
def int32_input_ids() -> Outcome:
    """input_ids as int32: the same tokens as int64."""
    return agreement(lambda: generate(batch()[0].int()), reference())


@probe(LIBRARY, CLEAR, before=CONFUSING)
def uint8_input_ids() -> Outcome:
    """input_ids as uint8 (an integer dtype the embedding refuses)."""
    return refusal(lambda: generate(batch()[0].to(torch.uint8)), "torch.uint8", "int64")


@probe(LIBRARY, CORRECT)
def strided_input_ids() -> Outcome:
    """Non-contiguous input_ids (every other column of a wider batch)."""
    wide = torch.tensor(random_prompts([12, 12, 12], seed=3))
    return agreement(lambda: generate(wide[:, ::2]), reference(wide[:, ::2].tolist()))


@probe(LIBRARY, CORRECT)
def expanded_input_ids() -> Outcome:
    """One prompt expanded (stride 0) to four rows."""
    return agreement(lambda: generate(batch()[0][:1].expand(4, -1)), [reference()[0]] * 4)


@probe(LIBRARY, CORRECT)
def bool_attention_mask() -> Outcome:
    """A bool attention mask on a ragged batch."""
    ids, mask = batch(RAGGED)
    return agreement(lambda: generate(ids, attention_mask=mask.bool()), reference(RAGGED))


@probe(LIBRARY, CORRECT)
def expanded_attention_mask() -> Outcome:
    """An attention mask expanded from one row."""
    return agreement(lambda: generate(attention_mask=torch.ones(1, 6, dtype=torch.long).expand(3, -1)), reference())


@probe(LIBRARY, CORRECT)
def negative_padding_ids() -> Outcome:
    """Padding positions holding -100 (a label id), masked out."""
    ids, mask = batch(RAGGED)
    return agreement(lambda: generate(ids.masked_fill(mask == 0, -100), attention_mask=mask), reference(RAGGED))


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def meta_input_ids_to_a_decoder() -> Outcome:
    """Decoder.generate with input_ids on the meta device (generate() checked devices, Decoder did not)."""
    import specdec

    return refusal(lambda: specdec.Decoder(models()[0]).generate(batch()[0].to("meta")), "meta", "cpu")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def meta_input_ids_to_the_device_step() -> Outcome:
    """The device step (step="device") given input_ids on the meta device."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), step="device")
    return refusal(lambda: decoder.generate(batch()[0].to("meta")), "meta", "cpu")


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_max_new_tokens() -> Outcome:
    """max_new_tokens as np.int64 (seeds and EOS ids took numpy integers, sizes did not)."""
    return agreement(lambda: generate(max_new_tokens=np.int64(10)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_k() -> Outcome:
    """k as np.int64."""
    return agreement(lambda: generate(k=np.int64(3)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_top_k() -> Outcome:
    """top_k=np.int64(1) at temperature 1: the argmax, so greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, top_k=np.int64(1)), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_float32_temperature() -> Outcome:
    """temperature as np.float32 (np.float64 passed, being a float subclass), with top_k=1: greedy tokens."""
    return agreement(lambda: generate(temperature=np.float32(0.7), top_k=1), reference())


@probe(LIBRARY, CLEAR)
def numpy_temperature_below_the_floor() -> Outcome:
    """temperature np.float64(1e-40), below the floor."""
    return refusal(lambda: generate(temperature=np.float64(1e-40)), "temperature", "1e-30")


@probe(LIBRARY, CORRECT)
def one_new_token_with_k_4() -> Outcome:
    """max_new_tokens=1 with k=4."""
    return agreement(lambda: generate(k=4, max_new_tokens=1), [row[:1] for row in reference()])


@probe(LIBRARY, CORRECT)
def k_larger_than_the_budget() -> Outcome:
    """k=8 with max_new_tokens=3."""
    return agreement(lambda: generate(k=8, max_new_tokens=3), [row[:3] for row in reference()])


@probe(LIBRARY, CORRECT)
def top_p_1e_minus_9() -> Outcome:
    """top_p=1e-9 at temperature 1 keeps only the top token: greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, top_p=1e-9), reference())


@probe(LIBRARY, CORRECT)
def min_p_1() -> Outcome:
    """min_p=1 at temperature 1 keeps only the top token: greedy tokens."""
    return agreement(lambda: generate(temperature=1.0, min_p=1.0), reference())


@probe(LIBRARY, CORRECT)
def temperature_1e30_drafting_with_the_target() -> Outcome:
    """temperature=1e30 (all but uniform) with the target as its own draft: every draft is accepted."""
    import specdec

    target = models()[0]
    return agreement(lambda: specdec.generate(target, batch()[0], draft=target, temperature=1e30, max_new_tokens=10)
                     .stats.acceptance_rate, 1.0)


@probe(LIBRARY, CORRECT)
def every_vocabulary_id_is_eos() -> Outcome:
    """eos_token_id listing all 97 ids: each row stops after one token."""
    return agreement(lambda: generate(eos_token_id=list(range(97))), [row[:1] for row in reference()])


@probe(LIBRARY, CORRECT)
def eos_ids_as_a_set() -> Outcome:
    """eos_token_id as a Python set."""
    eos = reference()[1][4]
    return agreement(lambda: generate(eos_token_id={eos, 96}), generate(eos_token_id=[eos, 96]))


@probe(LIBRARY, CORRECT)
def eos_equal_to_the_last_prompt_token() -> Outcome:
    """EOS equal to the prompt's last token: only an emitted EOS stops a row."""
    prompt = RAGGED[0]
    return agreement(lambda: generate(torch.tensor([prompt]), eos_token_id=prompt[-1], max_new_tokens=12),
                     reference([prompt], 12, prompt[-1]))


@probe(LIBRARY, CORRECT)
def the_target_drafting_for_itself() -> Outcome:
    """The same module object as draft and target."""
    return agreement(lambda: generate(draft=models()[0]), reference())


@probe(LIBRARY, CORRECT)
def float32_draft_for_a_float64_target() -> Outcome:
    """A float32 draft for a float64 target (greedy tokens are the target's)."""
    return agreement(lambda: generate(draft=tiny_gpt2(1, layers=1).float()), reference())


@probe(LIBRARY, CORRECT)
def bfloat16_draft() -> Outcome:
    """A bfloat16 draft for a float64 target."""
    return agreement(lambda: generate(draft=tiny_gpt2(1, layers=1).to(torch.bfloat16)), reference())


@probe(LIBRARY, CORRECT)
def seed_minus_one() -> Outcome:
    """seed=-1, which torch wraps to 2**64 - 1."""
    return agreement(lambda: generate(temperature=1.0, seed=-1), generate(temperature=1.0, seed=2**64 - 1))


@probe(LIBRARY, CORRECT)
def prompt_one_short_of_the_context_with_k_4() -> Outcome:
    """A prompt of 127 tokens (context 128) with k=4: one token fits."""
    prompt = random_prompts([127], seed=5)[0]
    return agreement(lambda: generate(torch.tensor([prompt]), k=4, max_new_tokens=5), reference([prompt], 1))


@probe(LIBRARY, CORRECT)
def a_million_new_tokens() -> Outcome:
    """max_new_tokens=10**6 with a 128-position context: the context bounds the output."""
    prompt = RAGGED[0]
    return agreement(lambda: generate(torch.tensor([prompt]), max_new_tokens=10**6), reference([prompt], 125))


@probe(LIBRARY, CORRECT)
def a_thousand_one_token_prompts() -> Outcome:
    """A batch of 1000 one-token prompts; some rows compared with the same prompt alone."""
    ids = torch.randint(1, 97, (1000, 1), generator=torch.Generator().manual_seed(0))
    rows = [0, 17, 999]
    return agreement(lambda: [generate(ids, k=3, max_new_tokens=4)[row] for row in rows],
                     reference([ids[row].tolist() for row in rows], 4))


@probe(LIBRARY, CORRECT)
def a_thousand_one_token_prompts_on_the_device_step() -> Outcome:
    """The same batch of 1000 one-token prompts on the device step."""
    import specdec

    target, draft = models()
    ids = torch.randint(1, 97, (1000, 1), generator=torch.Generator().manual_seed(0))
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(3),
                              step="device")
    rows = [0, 17, 999]
    return agreement(lambda: [decoder.generate(ids, max_new_tokens=4).tokens[row] for row in rows],
                     reference([ids[row].tolist() for row in rows], 4))


def batch_sizes_on_one_decoder(decoder, release_after: set[int]) -> list[list[list[int]]]:
    """Calls with batch sizes 1, 5, 2, 7 on one decoder, released after the sizes in ``release_after``."""
    results = []
    for size in (1, 5, 2, 7):
        prompts = random_prompts([3 + i for i in range(size)], seed=size)
        results.append(decoder.generate(*batch(prompts), max_new_tokens=8).tokens)
        if size in release_after:
            decoder.release()
    return results


def each_alone(sizes=(1, 5, 2, 7)) -> list[list[list[int]]]:
    return [reference(random_prompts([3 + i for i in range(size)], seed=size), 8) for size in sizes]


@probe(LIBRARY, CORRECT)
def batch_sizes_with_release_between_calls() -> Outcome:
    """One Decoder called with batch sizes 1, 5, 2, 7, released after every call."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft), specdec.Greedy(), specdec.FixedLength(3))
    return agreement(lambda: batch_sizes_on_one_decoder(decoder, {1, 5, 2, 7}), each_alone())


@probe(LIBRARY, CORRECT)
def static_caches_across_batch_sizes() -> Outcome:
    """Static caches and transformers' forward, batch sizes 1, 5, 2, 7, released once midway."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.ModelDrafter(draft, cache_layout="static", forward="transformers"),
                              specdec.Greedy(), specdec.FixedLength(3), cache_layout="static", forward="transformers")
    return agreement(lambda: batch_sizes_on_one_decoder(decoder, {5}), each_alone())


@probe(LIBRARY, CORRECT)
def int32_ids_for_every_drafter_and_policy() -> Outcome:
    """int32 ids and mask, a ragged batch whose rows end at an EOS at different steps, for each of 4 drafters x 4
    policies: each row equals its prompt alone."""
    import specdec

    target, draft = models()
    prompts = random_prompts([3, 7, 5, 9, 4], seed=11)
    eos = reference(prompts, 12)[1][3]
    ids, mask = batch(prompts)
    drafters = [lambda: specdec.ModelDrafter(draft), lambda: specdec.NGramDrafter(),
                lambda: specdec.TreeDrafter(draft, (2, 1)), lambda: specdec.EarlyExitDrafter(target, 1)]
    policies = [lambda: specdec.FixedLength(3), lambda: specdec.HeuristicLength(), lambda: specdec.ConfidenceLength(0.3, 5),
                lambda: specdec.CostOptimalLength()]

    def every_pairing():
        return [specdec.Decoder(target, make_drafter(), specdec.Speculative(), make_policy())
                .generate(ids.int(), mask.int(), 12, eos).tokens for make_drafter in drafters for make_policy in policies]
    return agreement(every_pairing, [reference(prompts, 12, eos)] * 16)


@probe(LIBRARY, CORRECT)
def a_tree_of_200_levels() -> Outcome:
    """TreeDrafter with 200 levels of one child, drafting 60 levels a step."""
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, specdec.TreeDrafter(draft, (1,) * 200), specdec.Greedy(),
                              specdec.FixedLength(60))
    return agreement(lambda: decoder.generate(batch()[0], max_new_tokens=10).tokens, reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def numpy_tree_branching() -> Outcome:
    """TreeDrafter branching (np.int64(2), 1): it was refused, naming the list, as if np.int64(2) were no integer."""
    import specdec

    return agreement(lambda: specdec.TreeDrafter(models()[1], (np.int64(2), 1)).branching, (2, 1))


@probe(LIBRARY, CORRECT, before=TRACEBACK)
def ngram_max_ngram_of_a_billion() -> Outcome:
    """NGramDrafter(max_ngram=10**9): its search looped over every n up to 10**9 each step (a hang)."""
    import specdec

    target = models()[0]
    decoder = specdec.Decoder(target, specdec.NGramDrafter(max_ngram=10**9), specdec.Greedy(), specdec.FixedLength(3))
    return agreement(lambda: decoder.generate(batch()[0], max_new_tokens=10).tokens, reference())


@probe(LIBRARY, CORRECT, before=CONFUSING)
def a_draft_with_a_shorter_context() -> Outcome:
    """A draft of 16 positions for a target of 128, max_new_tokens=30 after 6-token prompts: the output stops at the
    draft's context (10 tokens), as tests/test_cross_tokenizer.py expects; nothing said why, and now a warning does."""
    cut = [row[:10] for row in reference(new=30)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: generate(draft=tiny_gpt2(1, layers=1, positions=16), max_new_tokens=30), cut)
    said = [str(warning.message) for warning in caught if "drafter's context (16 positions)" in str(warning.message)]
    if outcome.kind == CORRECT and not said:
        return Outcome(CONFUSING, "the target's greedy tokens, cut at the draft's context (10 of 30), unexplained")
    return outcome


@probe(LIBRARY, CLEAR)
def nan_only_in_the_padding_tokens_embedding() -> Outcome:
    """NaN in the embedding of the padding id alone (no prompt uses it), a padded batch: NaN flows through the
    masked padding, and the call refuses."""
    target = tiny_gpt2(0, layers=3)
    with torch.no_grad():
        target.transformer.wte.weight[0] = float("nan")
    import specdec

    ids, mask = batch(RAGGED)
    return refusal(lambda: specdec.generate(target, ids, attention_mask=mask, max_new_tokens=6), "target", "NaN")


# --- Library: custom parts with bugs -------------------------------------------------------------------------------

def scripted_drafter(make: Callable[[int, int], object]):
    """A custom drafter whose proposal is ``make(batch_size, k)``: a drafter with a bug."""
    import specdec

    class Scripted(specdec.Drafter):
        name = "scripted"

        def start(self, input_ids, attention_mask):
            self.batch_size = input_ids.shape[0]

        def propose(self, k, sampling, generator, stop=None):
            return make(self.batch_size, k)

        def commit(self, outcome):
            """Learns nothing."""

    return Scripted()


def proposal(tokens: torch.Tensor, probs: torch.Tensor | None = None):
    from specdec.layout import Proposal

    return Proposal(tokens, probs)


def decode_with(drafter=None, policy=None, strategy=None, temperature: float = 1.0) -> list[list[int]]:
    import specdec

    target, draft = models()
    decoder = specdec.Decoder(target, drafter or specdec.ModelDrafter(draft), strategy or specdec.Speculative(),
                              policy or specdec.FixedLength(3), specdec.SamplingConfig(temperature=temperature))
    return decoder.generate(batch()[0], max_new_tokens=10).tokens


LONG = torch.long


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_more_than_k() -> Outcome:
    """A custom drafter proposing k + 5 tokens."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k + 5, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "k=")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_dropping_a_row() -> Outcome:
    """A custom drafter proposing for B - 1 rows."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b - 1, k, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "rows")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_floats() -> Outcome:
    """A custom drafter proposing float32 tokens."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k)))
    return refusal(lambda: decode_with(drafter), "scripted", "torch.float32")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_on_another_device() -> Outcome:
    """A custom drafter proposing tokens on the meta device."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k, dtype=LONG, device="meta")))
    return refusal(lambda: decode_with(drafter), "scripted", "meta")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_ids_outside_the_vocabulary() -> Outcome:
    """A custom drafter proposing token id 500 (vocabulary 97), greedy."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.full((b, k), 500, dtype=LONG)))
    return refusal(lambda: decode_with(drafter, temperature=0.0), "scripted", "vocabulary")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_proposing_negative_ids() -> Outcome:
    """A custom drafter proposing token id -1, sampling."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.full((b, k), -1, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "scripted", "vocabulary")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_returning_a_tensor() -> Outcome:
    """A custom drafter returning a bare tensor instead of a Proposal."""
    drafter = scripted_drafter(lambda b, k: torch.ones(b, k, dtype=LONG))
    return refusal(lambda: decode_with(drafter), "scripted", "Proposal")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_with_probs_over_another_vocabulary() -> Outcome:
    """A custom drafter whose q spans 5 tokens (the target's vocabulary: 97)."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, k, dtype=LONG), torch.full((b, k, 5), 0.2)))
    return refusal(lambda: decode_with(drafter), "scripted", "probs")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_drafter_building_a_one_dimensional_proposal() -> Outcome:
    """A custom drafter building Proposal(tokens [B]) (no draft axis)."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, dtype=LONG)))
    return refusal(lambda: decode_with(drafter), "tokens", "[B, N]")


@probe(LIBRARY, CORRECT)
def custom_drafter_proposing_nothing() -> Outcome:
    """A custom drafter proposing zero tokens when asked for k: plain greedy decoding."""
    drafter = scripted_drafter(lambda b, k: proposal(torch.ones(b, 0, dtype=LONG)))
    return agreement(lambda: decode_with(drafter, temperature=0.0), reference())


def scripted_policy(k: object, max_k: object = 4):
    """A custom draft-length policy answering ``k`` with ``max_k``: a policy with a bug."""
    import specdec

    class Scripted(specdec.DraftLengthPolicy):
        name = "scripted"

        @property
        def max_k(self):
            return max_k

        def next_k(self):
            return k

    return Scripted()


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_answering_a_float() -> Outcome:
    """A custom policy whose next_k() is 2.5."""
    return refusal(lambda: decode_with(policy=scripted_policy(2.5)), "scripted", "2.5")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_answering_beyond_its_max_k() -> Outcome:
    """A custom policy asking k=9 with max_k=4, sampling."""
    return refusal(lambda: decode_with(policy=scripted_policy(9, 4)), "scripted", "9", "max_k=4")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def policy_without_a_max_k() -> Outcome:
    """A custom policy whose max_k is None."""
    return refusal(lambda: decode_with(policy=scripted_policy(2, None)), "scripted", "max_k")


@probe(LIBRARY, CORRECT)
def policy_answering_zero() -> Outcome:
    """A custom policy answering k=0 every step: plain greedy decoding."""
    return agreement(lambda: decode_with(policy=scripted_policy(0), temperature=0.0), reference())


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def cost_optimal_with_an_infinite_prior_weight() -> Outcome:
    """CostOptimalLength(prior_weight=inf): NaN acceptance, then min() of an empty sequence at the first step."""
    import specdec

    return refusal(lambda: decode_with(policy=specdec.CostOptimalLength(prior_weight=float("inf"))), "prior_weight")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED)
def cost_optimal_with_an_infinite_margin() -> Outcome:
    """CostOptimalLength(margin=inf): no draft could ever be taken."""
    import specdec

    return refusal(lambda: specdec.CostOptimalLength(margin=float("inf")), "margin", "inf")


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def custom_verdict_on_another_device() -> Outcome:
    """A custom strategy returning its verdict on the meta device."""
    import specdec

    def rule(draft_tokens, draft_probs, target_probs, generator):
        zeros = torch.zeros(draft_tokens.shape[0], dtype=LONG, device="meta")
        return specdec.Verdict(zeros, zeros)
    return refusal(lambda: decode_with(strategy=rule), "function", "meta")


@probe(LIBRARY, SILENTLY_ACCEPTED)
def custom_chain_verdict_with_a_path() -> Outcome:
    """A custom chain rule returning a path other than 1..k: ignored (a chain's path is 1..k), output unharmed."""
    import specdec

    def rule(draft_tokens, draft_probs, target_probs, generator):
        verdict = specdec.Greedy()(draft_tokens, draft_probs, target_probs, generator)
        return specdec.Verdict(verdict.num_accepted, verdict.next_token, torch.ones_like(draft_tokens))
    outcome = agreement(lambda: decode_with(strategy=rule, temperature=0.0), reference())
    return Outcome(SILENTLY_ACCEPTED, "path ignored, tokens right") if outcome.kind == CORRECT else outcome


@probe(LIBRARY, CLEAR, before=TRACEBACK)
def check_lossless_with_ten_billion_samples() -> Outcome:
    """check_lossless(samples=10**10): the allocator's error, naming nothing."""
    import specdec
    from specdec.testing import check_lossless

    return refusal(lambda: check_lossless(specdec.Speculative(), samples=10**10), "samples")


@probe(LIBRARY, CORRECT, before=CONFUSING)
def check_lossless_with_a_numpy_k() -> Outcome:
    """check_lossless(k=np.int64(2)) on a lossless rule."""
    import specdec
    from specdec.testing import check_lossless

    return agreement(lambda: check_lossless(specdec.Speculative(), k=np.int64(2)).lossless, True)


@probe(LIBRARY, CORRECT)
def check_lossless_with_top_p_1e_minus_9() -> Outcome:
    """check_lossless under top_p=1e-9 (one possible continuation), 50 samples."""
    import specdec
    from specdec.testing import check_lossless

    sampling = specdec.SamplingConfig(temperature=1.0, top_p=1e-9)
    return agreement(lambda: check_lossless(specdec.Speculative(), sampling=sampling, samples=50).p_value, 1.0)


# --- Library: what the constructors are handed ---------------------------------------------------------------------

@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def base_model_without_a_head_as_the_draft() -> Outcome:
    """ModelDrafter(GPT2Model(...)): hidden states, not logits."""
    import specdec
    from transformers import GPT2Config, GPT2Model

    base = GPT2Model(GPT2Config(vocab_size=97, n_layer=1, n_embd=32, n_head=2, bos_token_id=0, eos_token_id=0))
    return refusal(lambda: specdec.ModelDrafter(base), "GPT2Model", "language-model head")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def linear_layer_as_the_draft() -> Outcome:
    """ModelDrafter(torch.nn.Linear(2, 2))."""
    import specdec

    return refusal(lambda: specdec.ModelDrafter(torch.nn.Linear(2, 2)), "ModelDrafter's model", "Linear")


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def draft_with_weights_on_the_meta_device() -> Outcome:
    """TreeDrafter of a draft moved to the meta device (no weights)."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(tiny_gpt2(1, layers=1).to("meta")), "meta device")


@probe(LIBRARY, CLEAR, issue=35)
def policy_class_as_draft_length() -> Outcome:
    """Decoder(..., draft_length=specdec.FixedLength) (the class)."""
    import specdec

    target, draft = models()
    return refusal(lambda: specdec.Decoder(target, specdec.ModelDrafter(draft), draft_length=specdec.FixedLength),
                   "draft_length", "FixedLength")


@probe(LIBRARY, CLEAR, issue=35)
def sampling_class_as_sampling() -> Outcome:
    """Decoder(..., sampling=specdec.SamplingConfig) (the class)."""
    import specdec

    return refusal(lambda: specdec.Decoder(models()[0], sampling=specdec.SamplingConfig), "sampling",
                   "SamplingConfig")


@probe(LIBRARY, CLEAR, before=CONFUSING, issue=35)
def drafter_class_as_the_draft() -> Outcome:
    """generate(draft=specdec.ModelDrafter) (the class): "got type"."""
    import specdec

    return refusal(lambda: specdec.generate(models()[0], batch()[0], draft=specdec.ModelDrafter), "draft",
                   "ModelDrafter")


@probe(LIBRARY, CLEAR, issue=35)
def cache_layout_in_capitals() -> Outcome:
    """ModelDrafter(draft, cache_layout="Static")."""
    import specdec

    return refusal(lambda: specdec.ModelDrafter(models()[1], cache_layout="Static"), "'Static'", "static")


# --- Library: the helpers -------------------------------------------------------------------------------------------

@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=35)
def logits_without_a_vocabulary_axis() -> Outcome:
    """logits_to_probs(torch.zeros(0), greedy): torch's "Expected reduction dim 0 to have non-zero size"."""
    from specdec.sampling import SamplingConfig, logits_to_probs

    return refusal(lambda: logits_to_probs(torch.zeros(0), SamplingConfig()), "logits", "(0,)")


@probe(LIBRARY, CORRECT, issue=35)
def integer_logits() -> Outcome:
    """logits_to_probs of an int64 tensor, greedy."""
    from specdec.sampling import SamplingConfig, logits_to_probs

    return agreement(lambda: logits_to_probs(torch.tensor([1, 5, 2]), SamplingConfig()).tolist(), [0.0, 1.0, 0.0])


@probe(LIBRARY, CLEAR, before=SILENTLY_ACCEPTED, issue=35)
def predicted_speedup_of_a_bool() -> Outcome:
    """predicted_speedup(True, 3, 0.1)."""
    import specdec

    return refusal(lambda: specdec.predicted_speedup(True, 3, 0.1), "alpha", "True")


@probe(LIBRARY, CORRECT, issue=35)
def predicted_speedup_of_numpy_scalars() -> Outcome:
    """predicted_speedup(np.float32(0.5), np.int64(3), np.float64(0.1))."""
    import specdec

    return agreement(lambda: round(specdec.predicted_speedup(np.float32(0.5), np.int64(3), np.float64(0.1)), 9),
                     round((1 + 0.5 + 0.25 + 0.125) / 1.3, 9))


@probe(LIBRARY, CORRECT, before=TRACEBACK, issue=35)
def left_pad_of_a_2d_numpy_array() -> Outcome:
    """left_pad(np.array([[1, 2], [3, 4]]))."""
    return agreement(lambda: [t.tolist() for t in left_pad(np.array([[1, 2], [3, 4]]))],
                     [[[1, 2], [3, 4]], [[1, 1], [1, 1]]])


@probe(LIBRARY, CORRECT, issue=35)
def left_pad_with_pad_id_minus_one() -> Outcome:
    """left_pad(ragged, pad_id=-1): padding outside the vocabulary is never fed."""
    return agreement(lambda: generate(*left_pad(RAGGED, pad_id=-1)[:1], attention_mask=left_pad(RAGGED)[1]),
                     reference(RAGGED))


@probe(LIBRARY, CLEAR, before=TRACEBACK, issue=35)
def left_pad_of_one_flat_prompt() -> Outcome:
    """left_pad([5, 6, 7]) (one prompt, not a list of prompts)."""
    return refusal(lambda: left_pad([5, 6, 7]), "prompts[0]", "5")
