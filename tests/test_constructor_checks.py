"""Reliability 3, library side (issue 35): constructors validate what they are handed (a model is a model, a
tokenizer a tokenizer, a vocabulary fits the ids it will see, a tree fits the vocabulary), and the newest helpers
name their arguments. Each refusal is one line naming the value and what is allowed, before any forward."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import hf_greedy, random_prompts, tiny_gpt2
from transformers import AutoTokenizer

import specdec
from specdec.batching import left_pad
from specdec.cross_tokenizer import CrossTokenizerDrafter
from specdec.models import plan_pair
from specdec.sampling import SamplingConfig, logits_to_probs
from specdec.stats import predicted_speedup


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert "\n" not in message and len(message) < 400, message
    return message


@pytest.fixture(scope="module")
def small():
    """A target and a draft whose vocabulary holds 8 token ids."""
    return tiny_gpt2(0, layers=2, vocab=8), tiny_gpt2(1, layers=1, vocab=8)


@pytest.fixture(scope="module")
def word_tokenizer(tiny):
    """The tiny pair's word-level tokenizer (71 ids)."""
    return AutoTokenizer.from_pretrained(tiny["target"])


# --- trees wider than the vocabulary --------------------------------------------------------------------------------

def test_a_dynamic_tree_wider_than_the_vocabulary_is_refused_by_its_constructor(small):
    with pytest.raises(ValueError) as error:
        specdec.DynamicTreeDrafter(small[1], node_budget=12, depth=2, top_k=12)
    assert "top_k=12 gives a node 12 children, more than the draft's vocabulary of 8 tokens" in one_line(error)


def test_a_static_tree_wider_than_the_vocabulary_is_refused_by_its_constructor(small):
    with pytest.raises(ValueError) as error:
        specdec.TreeDrafter(small[1], (12,))
    assert "branching [12] gives a node 12 children, more than the draft's vocabulary of 8 tokens" in one_line(error)


def test_a_tree_as_wide_as_the_vocabulary_decodes_the_targets_greedy_tokens(small):
    target, draft = small
    prompt = random_prompts([4], seed=2, vocab=8)[0]
    for drafter in (specdec.TreeDrafter(draft, (8, 1)), specdec.DynamicTreeDrafter(draft, 16, 2, 8)):
        out = specdec.generate(target, torch.tensor([prompt]), draft=drafter, k=2, max_new_tokens=8)
        assert out.tokens == [hf_greedy(target, prompt, 8)]


# --- strings (and None) where models and tokenizers belong ----------------------------------------------------------

@pytest.mark.parametrize("make", [specdec.ModelDrafter, specdec.TreeDrafter, specdec.DynamicTreeDrafter],
                         ids=["model", "tree", "dynamic_tree"])
def test_a_model_name_where_a_model_belongs_is_refused(make):
    with pytest.raises(TypeError) as error:
        make("gpt2")
    message = one_line(error)
    assert f"{make.__name__}'s model must be a loaded model, got the name 'gpt2'" in message
    assert "from_pretrained('gpt2')" in message


def test_a_tokenizer_name_none_or_a_bare_tokenizer_is_refused_by_the_cross_tokenizer_drafter(draft, word_tokenizer):
    with pytest.raises(TypeError) as error:
        CrossTokenizerDrafter(draft, "gpt2", word_tokenizer)
    assert "draft_tokenizer must be a loaded tokenizer, got the name 'gpt2'" in one_line(error)
    with pytest.raises(TypeError) as error:
        CrossTokenizerDrafter(draft, None, None)
    assert "draft_tokenizer must be a transformers tokenizer, got None" in one_line(error)
    with pytest.raises(TypeError) as error:
        CrossTokenizerDrafter(draft, word_tokenizer, word_tokenizer.backend_tokenizer)
    assert "target_tokenizer Tokenizer has no batch_decode" in one_line(error)
    with pytest.raises(TypeError, match="CrossTokenizerDrafter's model must be a loaded model, got the name 'gpt2'"):
        CrossTokenizerDrafter("gpt2", word_tokenizer, word_tokenizer)


# --- vocabularies that do not fit their tokenizers ------------------------------------------------------------------

def test_a_draft_model_smaller_than_its_own_tokenizer_is_refused(word_tokenizer):
    """The draft encodes the text with its tokenizer: an id past its vocabulary was an index error at T=0 and T=1."""
    small_draft = tiny_gpt2(1, layers=1, vocab=50)
    with pytest.raises(ValueError) as error:
        CrossTokenizerDrafter(small_draft, word_tokenizer, word_tokenizer, translate="text")
    assert "the draft model's vocab_size=50 is smaller than the draft tokenizer's 71 token ids" in one_line(error)


def test_a_target_vocab_size_smaller_than_the_target_tokenizer_is_refused(word_tokenizer):
    draft = tiny_gpt2(1, layers=1, vocab=len(word_tokenizer))
    with pytest.raises(ValueError) as error:
        CrossTokenizerDrafter(draft, word_tokenizer, word_tokenizer, target_vocab_size=60, translate="text")
    assert "target_vocab_size=60 is smaller than the target tokenizer's 71 token ids" in one_line(error)
    with pytest.raises(ValueError, match="target_vocab_size must be an integer >= 1, got 0"):
        CrossTokenizerDrafter(draft, word_tokenizer, word_tokenizer, target_vocab_size=0)


def test_vocabularies_larger_than_their_tokenizers_are_accepted(word_tokenizer):
    """Padded embeddings (a model wider than its tokenizer) are common and fine: the ids fit."""
    draft = tiny_gpt2(1, layers=1, vocab=len(word_tokenizer) + 9)
    drafter = CrossTokenizerDrafter(draft, word_tokenizer, word_tokenizer, target_vocab_size=97, translate="text")
    assert drafter.bridge.target_vocab_size == 97 and drafter.bridge.draft_vocab_size == len(word_tokenizer) + 9


# --- the helpers name their arguments -------------------------------------------------------------------------------

@pytest.mark.parametrize("prompts, error_type, named", [
    ("abc", TypeError, "prompts must be a list of prompts, each a list of token ids, got 'abc'"),
    ([[1, 2], []], ValueError, "prompts[1] is empty: every prompt needs at least one token"),
    ([[1, 2], "ab"], ValueError, "prompts[1] must be a list of token ids (integers), got 'ab'"),
    ([[1.5]], ValueError, "prompts[0] must be a list of token ids (integers), got [1.5]"),
    (5, TypeError, "prompts must be a list of prompts"),
    ([], ValueError, "left_pad needs at least one prompt, got none"),
])
def test_left_pad_names_its_argument(prompts, error_type, named):
    with pytest.raises(error_type) as error:
        left_pad(prompts)
    assert named in one_line(error)


def test_left_pad_takes_tuples_tensors_and_numpy_rows():
    ids, mask = left_pad([(1, 2), torch.tensor([3]), [torch.tensor(4), 5, 6]])
    assert ids.tolist() == [[0, 1, 2], [0, 0, 3], [4, 5, 6]] and mask.tolist() == [[0, 1, 1], [0, 0, 1], [1, 1, 1]]


def test_logits_to_probs_names_its_arguments():
    with pytest.raises(TypeError) as error:
        logits_to_probs(torch.zeros(3), "greedy")
    assert "sampling must be a specdec.SamplingConfig" in one_line(error) and "'greedy'" in str(error.value)
    with pytest.raises(TypeError, match=r"logits must be a \[..., V\] tensor, got \[0.0, 1.0\]"):
        logits_to_probs([0.0, 1.0], SamplingConfig())
    assert logits_to_probs(torch.tensor([0.0, 2.0, 1.0]), SamplingConfig()).tolist() == [0.0, 1.0, 0.0]


@pytest.mark.parametrize("alpha, k, cost_ratio, named", [
    (1.5, 4, 0.1, "alpha must be an acceptance rate in [0, 1]"),
    (-0.1, 4, 0.1, "alpha must be an acceptance rate in [0, 1]"),
    (0.5, -1, 0.1, "k must be an integer >= 0"),
    (0.5, 2.5, 0.1, "k must be an integer >= 0"),
    (0.5, 4, -0.1, "cost_ratio must be a finite number >= 0"),
    (0.5, 4, math.inf, "cost_ratio must be a finite number >= 0"),
    ("0.5", 4, 0.1, "alpha must be a number"),
])
def test_predicted_speedup_refuses_values_outside_their_range(alpha, k, cost_ratio, named):
    with pytest.raises((ValueError, TypeError)) as error:
        predicted_speedup(alpha, k, cost_ratio)
    assert named in one_line(error)


def test_predicted_speedup_keeps_its_formula_and_passes_nan_through():
    assert predicted_speedup(0.5, 2, 0.1) == pytest.approx((1 + 0.5 + 0.25) / 1.2)
    assert predicted_speedup(1.0, 3, 0.0) == 4.0 and predicted_speedup(0.0, 0, 0.0) == 1.0
    assert math.isnan(predicted_speedup(math.nan, 2, 0.1)) and math.isnan(predicted_speedup(0.5, 2, math.nan))


# --- the decoder's parts --------------------------------------------------------------------------------------------

def test_a_model_passed_as_the_drafter_is_refused_in_one_line_saying_to_wrap_it(target, draft):
    with pytest.raises(TypeError) as error:
        specdec.Decoder(target, draft)
    message = one_line(error)
    assert "got a GPT2LMHeadModel; wrap a model in specdec.ModelDrafter(model)" in message
    assert "Embedding" not in message


@pytest.mark.parametrize("with_draft", [True, False], ids=["with a draft", "without a draft"])
def test_a_strategy_class_is_refused_up_front_naming_the_class(target, draft, with_draft):
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(TypeError) as error:
        specdec.generate(target, ids, draft=draft if with_draft else None, strategy=specdec.Speculative)
    assert "strategy must be an instance, got the class Speculative; write Speculative()" in one_line(error)


def test_a_prompt_beyond_a_drafts_shorter_context_names_the_drafters_limit(target):
    short = tiny_gpt2(1, layers=1, positions=16)
    ids = torch.tensor([random_prompts([20], seed=1)[0]])
    with pytest.raises(ValueError) as error:
        specdec.generate(target, ids, draft=short)
    assert ("prompt of 20 tokens is at or beyond the drafter's context limit (its model's, shorter than the "
            "target's) of 16 positions") in one_line(error)
    with pytest.raises(ValueError, match=r"at or beyond the context limit of 128 positions"):
        specdec.generate(target, torch.tensor([random_prompts([130], seed=1)[0]]))


def test_a_short_draft_still_warns_that_it_stops_rows_early(target):
    """A ModelDrafter's model bounds each row (its cache cannot hold more); the warning names both contexts."""
    short = tiny_gpt2(1, layers=1, positions=16)
    prompt = random_prompts([6], seed=1)[0]
    with pytest.warns(UserWarning, match=r"the drafter's context \(16 positions\) is shorter than the target's"):
        out = specdec.generate(target, torch.tensor([prompt]), draft=short, max_new_tokens=30)
    assert out.tokens == [hf_greedy(target, prompt, 10)]


# --- identical tokenizers in two places ------------------------------------------------------------------------------

def test_two_copies_of_one_tokenizer_are_one_tokenizer_even_across_tokenizers(tiny):
    """The tiny pair's draft and target each hold a copy of one tokenizer: with cross_tokenizer=True the pair
    shares it (compared by content, not by path), so any drafter may draft and the context is both models'."""
    plan = plan_pair(None, draft=tiny["draft"], target=tiny["target"], cross_tokenizer=True, device="cpu",
                     dtype="float32")
    assert plan.shares_tokenizer and plan.context_limit == 128


def test_a_cross_tokenizer_pair_is_bounded_by_the_targets_context_alone(tiny, word_tokenizer, tmp_path):
    """A draft of 16 positions: with the pair's own tokenizer it bounds the pair's context (a ModelDrafter's cache
    cannot hold more); with another tokenizer it does not (the cross-tokenizer drafter fits its own context)."""
    from test_token_bridge import train_byte_level

    short = tiny_gpt2(1, layers=1, vocab=len(word_tokenizer), positions=16)
    short.save_pretrained(tmp_path / "short")
    word_tokenizer.save_pretrained(tmp_path / "short")
    train_byte_level(100).save_pretrained(tmp_path / "other")
    shared = plan_pair(None, draft=str(tmp_path / "short"), target=tiny["target"], cross_tokenizer=True,
                       device="cpu", dtype="float32")
    across = plan_pair(None, draft=str(tmp_path / "short"), target=tiny["target"], cross_tokenizer=True,
                       draft_tokenizer=str(tmp_path / "other"), device="cpu", dtype="float32")
    assert shared.shares_tokenizer and shared.context_limit == 16
    assert not across.shares_tokenizer and across.context_limit == 128


def test_the_same_tokenizer_object_on_both_sides_is_a_model_drafter(word_tokenizer):
    drafter = CrossTokenizerDrafter(tiny_gpt2(1, layers=1, vocab=len(word_tokenizer)), word_tokenizer, word_tokenizer)
    assert drafter.bridge is None and drafter.bounds_context


# --- trained drafters check at construction what generate needs (issue 43) ------------------------------------------

@pytest.fixture(scope="module")
def head_target():
    return tiny_gpt2(0, layers=2)


def test_an_eagle_head_in_another_dtype_than_its_target_is_refused_at_construction(head_target):
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead

    with pytest.raises(ValueError) as error:
        EagleDrafter(EagleHead(head_target).half(), head_target)
    assert "fc.weight is float16 on cpu, the target float64 on cpu; move it with .to(" in one_line(error)


def test_medusa_heads_in_another_dtype_or_width_are_refused_at_construction(head_target):
    from specdec.heads import MedusaHeads
    from specdec.medusa import MedusaDrafter

    with pytest.raises(ValueError) as error:
        MedusaDrafter(MedusaHeads(head_target, 2).half(), head_target)
    assert "blocks.0.weight is float16" in one_line(error)
    with pytest.raises(ValueError) as error:
        MedusaDrafter(MedusaHeads(tiny_gpt2(1, layers=1, width=48), 2), head_target)
    assert "hidden states of width 48; the target's are 32 wide" in one_line(error)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("draft_ids, shown", [([], "got an empty list"), ([1, 97], "token id 97, outside"),
                                              ([-1, 3], "token id -1, outside")])
def test_draft_ids_empty_or_outside_the_vocabulary_are_refused(head_target, kind, draft_ids, shown):
    from specdec.heads import EagleHead, MedusaHeads

    with pytest.raises(ValueError) as error:
        {"eagle": EagleHead, "medusa": MedusaHeads}[kind](head_target, draft_ids=draft_ids)
    assert shown in one_line(error)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_a_head_whose_draft_ids_were_changed_after_construction_is_refused_by_the_drafter(head_target, kind):
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead, MedusaHeads
    from specdec.medusa import MedusaDrafter

    head = {"eagle": EagleHead, "medusa": MedusaHeads}[kind](head_target, draft_ids=[1, 2, 3])
    head.draft_ids[2] = 500  # e.g. a buffer loaded from a damaged file
    with pytest.raises(ValueError) as error:
        {"eagle": EagleDrafter, "medusa": MedusaDrafter}[kind](head, head_target)
    assert "token id 500, outside the target's vocabulary [0, 97)" in one_line(error)


@pytest.mark.parametrize("tree, shown", [
    ((8, 3), "tree must be [node_budget, depth, top_k] (three integers) or None, got (8, 3)"),
    ("big", "tree must be [node_budget, depth, top_k] (three integers) or None, got 'big'"),
    ((200, 2, 150), "tree top_k=150 gives a node 150 children, more than the draft's vocabulary of 97 tokens"),
])
def test_eagle_trees_of_the_wrong_shape_or_wider_than_the_vocabulary_are_refused(head_target, tree, shown):
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead

    with pytest.raises(ValueError) as error:
        EagleDrafter(EagleHead(head_target), head_target, tree=tree)
    assert shown in one_line(error)


def test_an_eagle_tree_wider_than_the_reduced_vocabulary_is_refused(head_target):
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead

    with pytest.raises(ValueError) as error:
        EagleDrafter(EagleHead(head_target, draft_ids=[1, 2, 3]), head_target, tree=(8, 2, 5))
    assert "top_k=5 gives a node 5 children, more than the draft's vocabulary of 3 tokens" in one_line(error)


def test_a_medusa_tree_wider_than_the_vocabulary_is_refused(head_target):
    from specdec.heads import MedusaHeads
    from specdec.medusa import MedusaDrafter

    with pytest.raises(ValueError) as error:
        MedusaDrafter(MedusaHeads(head_target, 2), head_target, tree=(150, 1))
    assert "tree [150, 1] gives a node 150 children, more than the draft's vocabulary of 97" in one_line(error)


def test_a_medusa_tree_wider_than_the_reduced_vocabulary_is_refused(head_target):
    from specdec.heads import MedusaHeads
    from specdec.medusa import MedusaDrafter

    with pytest.raises(ValueError) as error:
        MedusaDrafter(MedusaHeads(head_target, 2, draft_ids=[1, 2, 3]), head_target, tree=(2, 5))
    assert "tree [2, 5] gives a node 5 children, more than the draft's vocabulary of 3 tokens" in one_line(error)


def test_eagle_feature_layers_beyond_the_target_are_refused(head_target):
    from specdec.heads import EagleHead

    with pytest.raises(ValueError) as error:
        EagleHead(head_target, feature_layers=(99,))
    assert "layers [99] must be distinct hidden-state indices in [-3, 2] for a target of 2 blocks" in one_line(error)


def test_a_checkpoint_whose_feature_layers_were_edited_is_refused_and_the_saved_one_loads(head_target, tmp_path):
    import json

    from specdec.checkpoints import CONFIG_FILE, save_drafter
    from specdec.eagle import EagleDrafter
    from specdec.heads import EagleHead

    head = EagleHead(head_target, feature_layers=(0, 1, 2))
    save_drafter(tmp_path, "eagle", head, head.options, head_target)
    loaded = EagleDrafter.from_pretrained(tmp_path, head_target)
    assert loaded.head.feature_layers == (0, 1, 2)
    config = json.loads((tmp_path / CONFIG_FILE).read_text())
    config["options"]["feature_layers"] = [1, 2, 0]  # the same shapes, other features
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config))
    with pytest.raises(ValueError) as error:
        EagleDrafter.from_pretrained(tmp_path, head_target)
    assert "gives options" in one_line(error) and "but its weights were saved with" in str(error.value)


@pytest.mark.parametrize("content, shown", [("[]", "holds a JSON list, not an object"),
                                            ('{"kind": "eagle", "options": {}}', "no 'target'"),
                                            ('{"kind": "eagle", "target": {}}', "no 'options'")])
def test_a_damaged_drafter_config_is_refused_in_one_line(tmp_path, content, shown):
    from specdec.checkpoints import CONFIG_FILE, read_drafter_config

    (tmp_path / CONFIG_FILE).write_text(content)
    with pytest.raises(ValueError) as error:
        read_drafter_config(tmp_path, "eagle")
    assert shown in one_line(error)
