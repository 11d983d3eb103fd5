"""The probes of the drafters: trees and dynamic trees, and the cross-tokenizer drafter."""

from __future__ import annotations

import functools
import warnings

import numpy as np
import torch

from conftest import hf_greedy, left_pad, random_prompts, tiny_gpt2
from probes.core import (
    CLEAR, CONFUSING, CORRECT, LIBRARY, SILENTLY_WRONG, TRACEBACK, agreement, batch, decoded_with, models, Outcome,
    probe, reference, refusal, small_models,
)


# --- Library: trees and dynamic trees --------------------------------------------------------------------------------

@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def tree_branching_as_a_numpy_array() -> Outcome:
    """TreeDrafter(draft, np.array([2, 1])): a 1-d array of children was refused as "not a list"."""
    import specdec

    return agreement(lambda: decoded_with(specdec.TreeDrafter(models()[1], np.array([2, 1]))), reference())


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def tree_branching_as_a_tensor() -> Outcome:
    """TreeDrafter(draft, torch.tensor([2, 2, 1]))."""
    import specdec

    return agreement(lambda: specdec.TreeDrafter(models()[1], torch.tensor([2, 2, 1])).branching, (2, 2, 1))


@probe(LIBRARY, CLEAR, issue=35)
def tree_branching_with_a_float() -> Outcome:
    """TreeDrafter branching [2, 1.0]."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(models()[1], [2, 1.0]), "branching", "[2, 1.0]")


@probe(LIBRARY, CLEAR, issue=35)
def tree_of_4094_nodes() -> Outcome:
    """TreeDrafter branching of eleven 2s (2 + 4 + ... + 2048 = 4094 nodes)."""
    import specdec

    return refusal(lambda: specdec.TreeDrafter(models()[1], (2,) * 11), "4094 nodes", "1024")


@probe(LIBRARY, CORRECT, issue=35)
def tree_as_wide_as_the_vocabulary() -> Outcome:
    """TreeDrafter (8, 1) on a pair with 8 token ids: every token is a child of the root."""
    import specdec

    target, draft = small_models()
    prompt = random_prompts([5], seed=4, vocab=8)[0]
    return agreement(lambda: specdec.generate(target, torch.tensor([prompt]), draft=specdec.TreeDrafter(draft, (8, 1)),
                                              k=2, max_new_tokens=8).tokens, [hf_greedy(target, prompt, 8)])


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_with_numpy_sizes() -> Outcome:
    """DynamicTreeDrafter(draft, np.int64(8), np.int64(3), np.int64(2))."""
    import specdec

    drafter = specdec.DynamicTreeDrafter(models()[1], np.int64(8), np.int64(3), np.int64(2))
    return agreement(lambda: decoded_with(drafter), reference())


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_of_one_node() -> Outcome:
    """DynamicTreeDrafter(draft, 1, 1, 1): a chain of one draft token."""
    import specdec

    return agreement(lambda: decoded_with(specdec.DynamicTreeDrafter(models()[1], 1, 1, 1)), reference())


@probe(LIBRARY, CLEAR, issue=35)
def dynamic_tree_budget_of_true() -> Outcome:
    """DynamicTreeDrafter(draft, node_budget=True)."""
    import specdec

    return refusal(lambda: specdec.DynamicTreeDrafter(models()[1], node_budget=True), "node_budget", "True")


@probe(LIBRARY, CORRECT, issue=35)
def dynamic_tree_sampling_under_top_k_1() -> Outcome:
    """A dynamic tree at temperature 1 with top_k=1 sampling (q a point mass; 4 draws without replacement from it):
    the target's argmax, so greedy tokens."""
    import specdec

    target, draft = models()
    return agreement(lambda: specdec.generate(target, batch()[0], draft=specdec.DynamicTreeDrafter(draft, 8, 3, 4),
                                              k=3, max_new_tokens=10, temperature=1.0, top_k=1).tokens, reference())


@probe(LIBRARY, CLEAR, issue=35)
def dynamic_tree_on_the_device_step() -> Outcome:
    """step="device" with a dynamic tree (drafted on the host)."""
    import specdec

    drafter = specdec.DynamicTreeDrafter(models()[1], 8, 3, 2)
    return refusal(lambda: decoded_with(drafter, step="device"), "step='device'", "dynamic_tree")


@probe(LIBRARY, CORRECT, issue=35)
def static_tree_over_static_caches() -> Outcome:
    """A token tree with the target's cache preallocated (cache_layout="static")."""
    import specdec

    drafter = specdec.TreeDrafter(models()[1], (2, 1))
    return agreement(lambda: decoded_with(drafter, cache_layout="static"), reference())


@probe(LIBRARY, CLEAR, issue=35)
def tree_with_compile() -> Outcome:
    """compile=True with a token tree."""
    import specdec

    return refusal(lambda: decoded_with(specdec.TreeDrafter(models()[1], (2, 1)), compile=True), "compile=True")


@probe(LIBRARY, CLEAR, issue=35)
def tree_judged_by_a_plain_function() -> Outcome:
    """A token tree with a custom callable strategy (no tree rule)."""
    import specdec

    target, draft = models()
    rule = lambda *args: None  # noqa: E731 - a rule that is never called
    return refusal(lambda: specdec.generate(target, batch()[0], draft=specdec.TreeDrafter(draft), strategy=rule,
                                            temperature=1.0), "no rule for token trees")


@probe(LIBRARY, CORRECT, issue=35)
def early_exit_on_the_device_step() -> Outcome:
    """EarlyExitDrafter(target, 2) on the device step."""
    import specdec

    return agreement(lambda: decoded_with(specdec.EarlyExitDrafter(models()[0], 2), step="device"), reference())


# --- Library: the cross-tokenizer drafter ---------------------------------------------------------------------------

@functools.cache
def cross_material() -> dict:
    """Two tokenizers trained in tests/test_token_bridge (byte-level BPE, SentencePiece-style), a bigram target and
    draft telling one story in each (tests/test_cross_tokenizer), and a word-level tokenizer sharing no token with
    them."""
    from test_cross_tokenizer import STORY, bigram_model, encode
    from test_token_bridge import train_byte_level, train_metaspace
    from tokenizers import Tokenizer, models as token_models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_level, metaspace = train_byte_level(400), train_metaspace(300)
    words = ["<unk>", "<eos>", "THE", "QUICK", "BROWN", "FOX"]
    core = Tokenizer(token_models.WordLevel(vocab={word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    upper = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", eos_token="<eos>")
    story = encode(metaspace, STORY)
    return {"draft_tok": byte_level, "target_tok": metaspace, "upper": upper,
            "target": bigram_model(metaspace, story), "draft": bigram_model(byte_level, encode(byte_level, STORY)),
            "prompts": [story[:8], story[20:31]], "bigram_model": bigram_model, "encode": encode, "story": STORY}


def across(drafter, temperature: float = 0.0, new: int = 12, k: int = 4, seed: int = 0, **sampling) -> list[list[int]]:
    """The bigram target's tokens on the cross-tokenizer prompts, drafted by ``drafter``."""
    import specdec

    material = cross_material()
    decoder = specdec.Decoder(material["target"], drafter, specdec.Speculative(), specdec.FixedLength(k),
                              specdec.SamplingConfig(temperature, **sampling))
    return decoder.generate(*left_pad(material["prompts"]), max_new_tokens=new, seed=seed).tokens


def across_greedy(new: int = 12) -> list[list[int]]:
    material = cross_material()
    return [hf_greedy(material["target"], prompt, new) for prompt in material["prompts"]]


def cross_drafter(draft=None, draft_tok=None, **options):
    from specdec.cross_tokenizer import CrossTokenizerDrafter

    material = cross_material()
    return CrossTokenizerDrafter(material["draft"] if draft is None else draft,
                                 material["draft_tok"] if draft_tok is None else draft_tok, material["target_tok"],
                                 **options)


@probe(LIBRARY, CORRECT, before=TRACEBACK, issue=35)
def tokenizers_sharing_no_token_sampling() -> Outcome:
    """A draft whose word-level tokenizer spells no token as the target's does, at temperature 1: torch's argmax of
    an empty set. It now proposes nothing, with a warning at construction: the target's own sampling."""
    import specdec

    material = cross_material()
    ids, mask = left_pad(material["prompts"])
    plain = specdec.generate(material["target"], ids, attention_mask=mask, max_new_tokens=12, temperature=1.0).tokens
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: across(cross_drafter(tiny_gpt2(3, layers=1, vocab=len(material["upper"])),
                                                         material["upper"]), temperature=1.0), plain)
    if outcome.kind == CORRECT and not any("spell no token the same" in str(w.message) for w in caught):
        return Outcome(CONFUSING, "nothing proposed, and no warning said why")
    return outcome


@probe(LIBRARY, CORRECT, issue=35)
def tokenizers_sharing_no_token_greedy() -> Outcome:
    """The same drafter at temperature 0: the text path, the target's greedy tokens."""
    material = cross_material()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        drafter = cross_drafter(tiny_gpt2(3, layers=1, vocab=len(material["upper"])), material["upper"])
    return agreement(lambda: across(drafter), across_greedy())


@probe(LIBRARY, CORRECT, issue=35)
def cross_tokenizer_sampling_under_top_p_1e_minus_9() -> Outcome:
    """Across tokenizers at temperature 1 with top_p=1e-9 (q' a point mass): the target's greedy tokens."""
    return agreement(lambda: across(cross_drafter(), temperature=1.0, top_p=1e-9), across_greedy())


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def cross_tokenizer_numpy_options() -> Outcome:
    """look_behind=np.int64(5), hold_back=np.int64(1): refused as "must be an integer >= 1, got np.int64(5)"."""
    return agreement(lambda: across(cross_drafter(look_behind=np.int64(5), hold_back=np.int64(1))), across_greedy())


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_translate_in_capitals() -> Outcome:
    """translate="TEXT"."""
    return refusal(lambda: cross_drafter(translate="TEXT"), "translate", "'TEXT'")


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_without_hold_back() -> Outcome:
    """hold_back=0."""
    return refusal(lambda: cross_drafter(hold_back=0), "hold_back", "0")


@probe(LIBRARY, CORRECT, issue=35)
def cross_tokenizer_prompt_id_past_the_tokenizer() -> Outcome:
    """A target with 20 padded embedding ids past its tokenizer's, and a prompt holding one of them (no text)."""
    material = cross_material()
    width = len(material["target_tok"]) + 20
    padded = tiny_gpt2(0, layers=1, vocab=width)
    prompt = material["prompts"][0] + [width - 5]
    import specdec

    drafter = cross_drafter(target_vocab_size=width)
    return agreement(lambda: specdec.Decoder(padded, drafter).generate(torch.tensor([prompt]), max_new_tokens=8).tokens,
                     [hf_greedy(padded, prompt, 8)])


@probe(LIBRARY, CLEAR, issue=35)
def cross_tokenizer_draft_in_training_mode() -> Outcome:
    """A cross-tokenizer drafter whose draft was put in training mode after it was built."""
    material = cross_material()
    draft_tok = material["draft_tok"]
    draft = material["bigram_model"](draft_tok, material["encode"](draft_tok, material["story"]))
    drafter = cross_drafter(draft)
    draft.train()
    return refusal(lambda: across(drafter), "training mode")


@probe(LIBRARY, CORRECT, before=CONFUSING, issue=35)
def cross_tokenizer_k_40_with_a_16_position_draft() -> Outcome:
    """k=40 and 30 new tokens with a draft of 16 positions (the target has 256): a step drafts at most 8 draft
    tokens, and the output is the target's greedy output to the end."""
    material = cross_material()
    short = material["bigram_model"](material["draft_tok"], material["encode"](material["draft_tok"],
                                                                             material["story"]), positions=16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        outcome = agreement(lambda: across(cross_drafter(short), new=30, k=40), across_greedy(30))
    warned = any("drafter's context" in str(warning.message) for warning in caught)
    return Outcome(CONFUSING, f"cut short, with a warning: {outcome.detail}") if outcome.kind == SILENTLY_WRONG \
        and warned else outcome


@probe(LIBRARY, CLEAR, issue=35)
def token_bridge_look_behind_of_zero() -> Outcome:
    """TokenBridge(draft_tok, target_tok, look_behind=0)."""
    from specdec.token_bridge import TokenBridge

    material = cross_material()
    return refusal(lambda: TokenBridge(material["draft_tok"], material["target_tok"], look_behind=0), "look_behind")
