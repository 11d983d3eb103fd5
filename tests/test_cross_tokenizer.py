"""The cross-tokenizer drafter: greedy equality with transformers across two tokenizers, exactness at T = 1 with
TLI, the same-tokenizer path, the draft cache's rebuilds, and pairs with two tokenizers through load_pair and the CLI.

Models. Where acceptance matters the models are *bigram* GPT-2s built by hand: the next token depends only on the
last one, and follows a story's tokens (the first time each token occurs; other tokens lead to EOS). A target and
a draft built on the same story with different tokenizers then write the same text in different tokens, so drafts
are often accepted, and the greedy outputs loop through the story's Unicode, digits, spaces and EOS. Tokenizers:
the two trained in test_token_bridge (byte-level BPE, GPT-2's "Ġ"; SentencePiece-style "▁"), character-level ones
built here for the chi-square test, the embedded pair's, and the real GPT-2 BPE for the slow test.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import hf_greedy, left_pad, tiny_overrides
from test_token_bridge import TEXTS, train_byte_level, train_metaspace
from tokenizers import Tokenizer, decoders, models
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

import specdec
from specdec.cross_tokenizer import CrossTokenizerDrafter
from specdec.interfaces import Drafter
from specdec.layout import Proposal
from specdec.models import EMBEDDED_DIR, gpt2_shaped_model, gpt2_tokenizer, load_pair, plan_pair
from specdec.testing import check_lossless, tiny_model
from specdec.token_bridge import TokenBridge

STORY = " ".join(TEXTS)  # leading spaces, punctuation runs, digits, accents, CJK, emoji, tabs and new lines
NEW_TOKENS = 30


def bigram_model(tokenizer, ids: list[int], positions: int = 256) -> GPT2LMHeadModel:
    """A float64 GPT-2 whose next token is the one that follows the last token in ``ids`` (then EOS), the first
    time it occurs there; EOS after any other token. One-hot embeddings, no position embeddings, blocks that add
    nothing (zero projections), and a head whose rows have mean 0, so layer norm keeps the argmax."""
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    ids = ids + [eos]
    successor = torch.full((vocab,), eos)
    for token, following in reversed(list(zip(ids, ids[1:]))):
        successor[token] = following
    config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=vocab + vocab % 2, n_layer=1, n_head=2,
                        tie_word_embeddings=False, bos_token_id=eos, eos_token_id=eos)
    model = GPT2LMHeadModel(config).double().eval().requires_grad_(False)
    for parameter in model.parameters():
        parameter.zero_()
    model.transformer.wte.weight[:, :vocab] = torch.eye(vocab, dtype=torch.float64)
    for norm in (model.transformer.ln_f, model.transformer.h[0].ln_1, model.transformer.h[0].ln_2):
        norm.weight.fill_(1)
    head = torch.zeros(vocab, config.n_embd, dtype=torch.float64)
    head[successor, torch.arange(vocab)] = 1.0
    model.lm_head.weight.copy_(head - head.mean(1, keepdim=True))
    return model


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    return {"byte_level": train_byte_level(400), "metaspace": train_metaspace(300)}


@pytest.fixture(scope="module")
def storytellers(tokenizers) -> dict:
    """Per tokenizer: a bigram model that tells STORY in that tokenizer's own tokens."""
    return {name: bigram_model(tokenizer, encode(tokenizer, STORY)) for name, tokenizer in tokenizers.items()}


def story_prompts(tokenizer) -> list[list[int]]:
    """Ragged prompts cut from the story's tokens: before "world", "quick", inside the digits, before the CJK, and
    one token before the end (that row writes it and EOS, and finishes first)."""
    story = encode(tokenizer, STORY)
    return [story_before(tokenizer, story, marker) for marker in ("world", "quick", "2345", "你好")] + [story[:-1]]


def story_before(tokenizer, story: list[int], marker: str) -> list[int]:
    """The story's tokens up to the last one that ends before ``marker`` first appears."""
    end = STORY.index(marker)
    return story[:max(n for n in range(1, len(story)) if len(tokenizer.decode(story[:n])) <= end)]


def greedy_run(target, drafter, prompts, eos, k=4, **options) -> specdec.GenerationOutput:
    ids, mask = left_pad(prompts)
    decoder = specdec.Decoder(target, drafter, specdec.Greedy(), specdec.FixedLength(k), **options)
    return decoder.generate(ids, mask, max_new_tokens=NEW_TOKENS, eos_token_id=eos)


CROSS = [("metaspace", "byte_level"), ("byte_level", "metaspace")]


@pytest.mark.parametrize("forward", ["auto", "transformers"])
@pytest.mark.parametrize("draft_name, target_name", CROSS, ids=[f"{d}-drafts-{t}" for d, t in CROSS])
def test_greedy_output_equals_transformers_across_two_tokenizers(tokenizers, storytellers, draft_name, target_name,
                                                                  forward):
    draft_tok, target_tok = tokenizers[draft_name], tokenizers[target_name]
    target, eos = storytellers[target_name], target_tok.eos_token_id
    prompts = story_prompts(target_tok)
    drafter = CrossTokenizerDrafter(storytellers[draft_name], draft_tok, target_tok, forward=forward)
    out = greedy_run(target, drafter, prompts, eos, forward=forward)
    expected = [hf_greedy(target, prompt, NEW_TOKENS, eos_token_id=eos) for prompt in prompts]
    assert out.tokens == expected
    assert expected[-1][-1] == eos and len(expected[-1]) < NEW_TOKENS  # a row ended at EOS, and left the batch
    written = target_tok.decode(sum(expected, []))
    assert "你" in written and any(character.isdigit() for character in written)
    assert out.stats.acceptance_rate > 0.3  # drafted text was accepted: kept drafts stayed in the draft cache
    assert drafter.stats.target_tokens > 0 and drafter.stats.draft_tokens > 0 and drafter.stats.rebuilds == 0


@pytest.mark.parametrize("k", [1, 3])
def test_a_batch_of_one_and_rows_that_stay_in_the_batch(tokenizers, storytellers, k):
    draft_tok, target_tok = tokenizers["byte_level"], tokenizers["metaspace"]
    target, eos = storytellers["metaspace"], target_tok.eos_token_id
    prompts = story_prompts(target_tok)
    expected = [hf_greedy(target, prompt, NEW_TOKENS, eos_token_id=eos) for prompt in prompts]
    alone = greedy_run(target, CrossTokenizerDrafter(storytellers["byte_level"], draft_tok, target_tok),
                       prompts[3:4], eos, k=k)
    assert alone.tokens == expected[3:4]
    staying = greedy_run(target, CrossTokenizerDrafter(storytellers["byte_level"], draft_tok, target_tok), prompts,
                         eos, k=k, retire_finished_rows=False)  # finished rows feed holes instead
    assert staying.tokens == expected


@pytest.mark.parametrize("name", ["byte_level", "metaspace"])
def test_the_text_path_with_one_tokenizer_keeps_every_draft_of_the_same_model(tokenizers, storytellers, name):
    """The storyteller emits its tokenizer's own encoding, so re-encoding its text changes no token: drafting
    through text with the target as its own draft accepts everything (counted without EOS: drafts past a row's EOS
    are never counted as accepted)."""
    tokenizer, model = tokenizers[name], storytellers[name]
    prompts = story_prompts(tokenizer)
    drafter = CrossTokenizerDrafter(model, tokenizer, tokenizer, translate="text")
    out = greedy_run(model, drafter, prompts, tokenizer.eos_token_id)
    assert drafter.bridge is not None
    assert out.tokens == [hf_greedy(model, p, NEW_TOKENS, eos_token_id=tokenizer.eos_token_id) for p in prompts]
    endless = greedy_run(model, CrossTokenizerDrafter(model, tokenizer, tokenizer, translate="text"), prompts, None)
    assert endless.tokens == [hf_greedy(model, p, NEW_TOKENS) for p in prompts]
    assert endless.stats.acceptance_rate == 1.0


def test_a_prompt_without_text_starts_the_draft_from_its_bos(tokenizers, storytellers):
    """A prompt of special tokens only has no text: the draft's context starts from its own BOS/EOS token."""
    draft_tok, target_tok = tokenizers["byte_level"], tokenizers["metaspace"]
    target, eos = storytellers["metaspace"], target_tok.eos_token_id
    prompts = [[target_tok.bos_token_id], encode(target_tok, STORY)[:5]]
    drafter = CrossTokenizerDrafter(storytellers["byte_level"], draft_tok, target_tok)
    out = greedy_run(target, drafter, prompts, None)
    assert out.tokens == [hf_greedy(target, prompt, NEW_TOKENS) for prompt in prompts]
    drafter.start(*left_pad(prompts))
    assert drafter.rows.draft_ids[0] == [draft_tok.eos_token_id]  # the byte-level tokenizer has no BOS: its EOS


def rewrite_case(tokenizer, reach: int) -> int:
    """The first cut of STORY after which one more character makes the tokenizer's encoding change its last
    ``reach`` tokens ("Hello wor" + "l" rewriting " w", "or")."""
    bridge = TokenBridge(tokenizer, tokenizer)
    for cut in range(1, len(STORY) - 1):
        ids = encode(tokenizer, STORY[:cut])
        if len(ids) - bridge.resync([ids], [len(ids)], [STORY[cut]])[0].keep == reach:
            return cut
    raise AssertionError(f"no rewrite of {reach} tokens in the story")


@pytest.mark.parametrize("hold_back, rebuilds", [(1, True), (2, False)])
def test_a_rewrite_past_the_held_back_tokens_rebuilds_the_draft_cache(tokenizers, hold_back, rebuilds):
    """The target writes one character as its own token where that makes the draft's encoding rewrite its last
    two tokens. A draft that only ever drafts EOS is always rejected, so every step commits one token and the
    character arrives after its context was cached: held back tokens absorb the rewrite, otherwise the draft
    cache is rebuilt. The output is right either way."""
    tokenizer = tokenizers["byte_level"]
    cut = rewrite_case(tokenizer, reach=2)
    before, character = encode(tokenizer, STORY[:cut]), encode(tokenizer, STORY[cut])
    # The target tells the text around the cut (few tokens: no bigram collides there) from 2 tokens before it.
    told = before[-3:] + character + encode(tokenizer, STORY[cut + 1 : cut + 20])
    target, eos = bigram_model(tokenizer, told), tokenizer.eos_token_id
    prompt = before[:-2]
    drafter = CrossTokenizerDrafter(bigram_model(tokenizer, []), tokenizer, tokenizer, hold_back=hold_back,
                                    translate="text")
    out = greedy_run(target, drafter, [prompt], eos)
    assert out.tokens[0][:3] == before[-2:] + character
    assert out.tokens == [hf_greedy(target, prompt, NEW_TOKENS, eos_token_id=eos)]
    assert (drafter.stats.rebuilds > 0) == rebuilds


@pytest.mark.parametrize("forward", ["auto", "transformers"])
def test_a_draft_with_fewer_positions_keeps_its_last_tokens_and_bounds_nothing(tokenizers, forward):
    """A draft of 16 positions drafting for a target of 256: across tokenizers the draft's context is its own
    re-encoding of the text, cut to its last tokens where it would outgrow the draft's positions (a rebuild), so
    prompts longer than 16 tokens decode, and the output is the target's greedy output to max_new_tokens, without
    a warning (transformers' forward would raise an index error past 16 positions)."""
    draft_tok, target_tok = tokenizers["byte_level"], tokenizers["metaspace"]
    target = bigram_model(target_tok, encode(target_tok, STORY))
    short_draft = bigram_model(draft_tok, encode(draft_tok, STORY), positions=16)
    prompts = [encode(target_tok, STORY)[:n] for n in (10, 20, 40)]
    drafter = CrossTokenizerDrafter(short_draft, draft_tok, target_tok, forward=forward)
    assert not drafter.bounds_context
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = greedy_run(target, drafter, prompts, None, k=12, forward=forward)
    assert drafter.stats.rebuilds > 0
    assert out.tokens == [hf_greedy(target, p, NEW_TOKENS) for p in prompts]


def test_a_draft_with_fewer_positions_samples_past_them(tokenizers):
    """At temperature 1 the same draft drafts at most half its positions a step (here k=20 asks for more) and
    every row reaches max_new_tokens."""
    draft_tok, target_tok = tokenizers["byte_level"], tokenizers["metaspace"]
    target = bigram_model(target_tok, encode(target_tok, STORY))
    short_draft = bigram_model(draft_tok, encode(draft_tok, STORY), positions=16)
    prompts = [encode(target_tok, STORY)[:n] for n in (20, 40)]
    decoder = specdec.Decoder(target, CrossTokenizerDrafter(short_draft, draft_tok, target_tok), specdec.Speculative(),
                              specdec.FixedLength(20), specdec.SamplingConfig(temperature=1.0))
    out = decoder.generate(*left_pad(prompts), max_new_tokens=NEW_TOKENS)
    assert [len(row) for row in out.tokens] == [NEW_TOKENS] * len(prompts)
    attempts = out.stats.totals.position_attempts  # [20]: draft positions 9..20 are never drafted
    assert sum(attempts[:8]) > 0 and sum(attempts[8:]) == 0


def test_a_model_drafter_with_fewer_positions_names_its_limit_as_the_drafters(target):
    short = tiny_model_with_positions(16)
    with pytest.raises(ValueError, match=r"beyond the drafter's context limit .* of 16 positions"):
        specdec.generate(target, torch.tensor([list(range(1, 21))]), draft=short)


def tiny_model_with_positions(positions: int) -> GPT2LMHeadModel:
    torch.manual_seed(1)
    config = GPT2Config(vocab_size=97, n_positions=positions, n_embd=32, n_layer=1, n_head=2)
    return GPT2LMHeadModel(config).double().eval().requires_grad_(False)


# --- The same tokenizer on both sides --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def embedded() -> specdec.ModelPair:
    return load_pair("embedded", device="cpu", dtype="float32")


def embedded_prompts(tokenizer, count: int) -> list[list[int]]:
    lines = (EMBEDDED_DIR.parent / "prompts" / "embedded_heldout.jsonl").read_text().splitlines()[:count]
    return [tokenizer(json.loads(line)["text"])["input_ids"] for line in lines]


def decode_all(pair, drafter, prompts, temperature: float, step: str = "host"
               ) -> tuple[list[list[int]], tuple[int, int, int]]:
    decoder = specdec.Decoder(pair.target, drafter, specdec.Speculative(), specdec.FixedLength(4),
                              specdec.SamplingConfig(temperature), step=step)
    ids, mask = left_pad(prompts)
    out = decoder.generate(ids, mask, max_new_tokens=24, eos_token_id=pair.tokenizer.eos_token_id, seed=3)
    return out.tokens, (out.stats.drafted, out.stats.accepted, out.stats.target_calls)


@pytest.mark.parametrize("temperature, step", [(0.0, "host"), (1.0, "host"), (0.0, "device")])
def test_with_one_tokenizer_it_drafts_exactly_as_the_model_drafter(embedded, temperature, step):
    prompts = embedded_prompts(embedded.tokenizer, 6)
    plain = decode_all(embedded, specdec.ModelDrafter(embedded.draft), prompts, temperature, step)
    drafter = CrossTokenizerDrafter.from_pair(embedded)
    assert drafter.bridge is None and drafter.drafts_on_device
    assert decode_all(embedded, drafter, prompts, temperature, step) == plain  # tokens, D, A, target calls


def test_through_text_the_embedded_pair_keeps_as_many_drafts_as_the_model_drafter(embedded):
    prompts = embedded_prompts(embedded.tokenizer, 8)
    tokens, (drafted, accepted, _) = decode_all(embedded, specdec.ModelDrafter(embedded.draft), prompts, 0.0)
    drafter = CrossTokenizerDrafter.from_pair(embedded, translate="text")
    text_tokens, (text_drafted, text_accepted, _) = decode_all(embedded, drafter, prompts, 0.0)
    assert text_tokens == tokens
    assert abs(text_accepted / text_drafted - accepted / drafted) <= 0.02
    assert 1 <= drafter.stats.draft_tokens_per_target_token <= 1.5 and drafter.stats.bridge_seconds > 0


# --- Temperature > 0: token-level intersection -----------------------------------------------------------------


def character_tokenizer(pieces: list[str]) -> PreTrainedTokenizerFast:
    """A tokenizer over the letters a-d whose tokens are ``pieces`` (ids in that order), decoded by joining."""
    merges = [(piece[:-1], piece[-1]) for piece in pieces if len(piece) > 1]
    core = Tokenizer(models.BPE(vocab={piece: i for i, piece in enumerate(pieces)}, merges=merges))
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=core)


# The target's 8 tokens and the draft's 10: "a", "b", "c", "d", "ab" and "cd" shared (at other ids); "ba", "dd"
# only the target's; "abc", "dc", "bb", "ca" only the draft's, whose mass TLI drops.
TARGET_PIECES = ["c", "ab", "a", "d", "b", "ba", "cd", "dd"]
DRAFT_PIECES = ["d", "b", "a", "c", "ab", "abc", "dc", "bb", "ca", "cd"]


def tli_drafter(made: list):
    target_tok, draft_tok = character_tokenizer(TARGET_PIECES), character_tokenizer(DRAFT_PIECES)

    def make(draft, target):
        made.append(CrossTokenizerDrafter(draft, draft_tok, target_tok, target_vocab_size=len(TARGET_PIECES)))
        return made[-1]
    return make


def test_the_character_tokenizers_share_what_the_test_says():
    bridge = TokenBridge(character_tokenizer(DRAFT_PIECES), character_tokenizer(TARGET_PIECES))
    shared = {DRAFT_PIECES[d]: TARGET_PIECES[t] for d, t in zip(bridge.shared_draft_ids.tolist(),
                                                                  bridge.shared_target_ids.tolist())}
    assert shared == {piece: piece for piece in ("a", "b", "c", "d", "ab", "cd")}


def test_tli_keeps_the_target_distribution_at_temperature_one():
    made = []
    report = check_lossless(specdec.Speculative(), make_drafter=tli_drafter(made), target=tiny_model(10, 2),
                            draft=tiny_model(12, 1, vocab=len(DRAFT_PIECES), init=0.1), samples=4000)
    assert report.lossless and 0.2 < report.acceptance_rate < 0.9, report
    assert made[0].stats.target_tokens == made[0].stats.draft_tokens > 0 and made[0].stats.no_shared_mass == 0


@pytest.mark.slow
def test_point_masses_where_the_filtered_draft_has_no_shared_mass_stay_exact():
    """top_k=2 leaves the draft's mass wholly on draft-only tokens at some steps: those propose a point mass."""
    made = []
    report = check_lossless(specdec.Speculative(), make_drafter=tli_drafter(made), target=tiny_model(10, 2),
                            draft=tiny_model(12, 1, vocab=len(DRAFT_PIECES), init=0.1),
                            sampling=specdec.SamplingConfig(1.0, top_k=2))
    assert report.lossless, report
    assert made[0].stats.no_shared_mass > 0


class MisreportedProbs(Drafter):
    """Proposes the cross-tokenizer drafter's tokens with the wrong distribution (q' squared, renormalised)."""

    def __init__(self, inner: CrossTokenizerDrafter):
        self.inner = inner

    def models(self):
        return self.inner.models()

    def start(self, input_ids, attention_mask):
        self.inner.start(input_ids, attention_mask)

    def propose(self, k, sampling, generator, stop=None):
        proposal = self.inner.propose(k, sampling, generator, stop)
        if proposal.probs is None:  # k = 0: nothing proposed
            return proposal
        wrong = proposal.probs ** 2
        return Proposal(proposal.tokens, wrong / wrong.sum(-1, keepdim=True), proposal.finite)

    def commit(self, outcome):
        self.inner.commit(outcome)


def test_the_chi_square_check_catches_a_misreported_distribution():
    made = []
    make = tli_drafter(made)
    report = check_lossless(specdec.Speculative(), make_drafter=lambda d, t: MisreportedProbs(make(d, t)),
                            target=tiny_model(10, 2), draft=tiny_model(12, 1, vocab=len(DRAFT_PIECES), init=0.1))
    assert not report.lossless, report


# --- Options, pairs with two tokenizers, the CLI ---------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"hold_back": 0}, "hold_back must be an integer >= 1"),
    ({"max_rounds": 1.5}, "max_rounds must be an integer >= 1"),
    ({"look_behind": True}, "look_behind must be an integer >= 1"),
    ({"translate": "ids"}, "translate must be one of auto, text, got 'ids'"),
    ({"forward": "fast"}, "forward must be one of auto, lean, transformers"),
])
def test_bad_options_are_refused_in_one_line(tokenizers, storytellers, options, message):
    with pytest.raises(ValueError, match=message):
        CrossTokenizerDrafter.check_options(**options)
    with pytest.raises(ValueError, match=message):
        CrossTokenizerDrafter(storytellers["byte_level"], tokenizers["byte_level"], tokenizers["metaspace"], **options)
    with pytest.raises(TypeError, match=r"unknown options \['k'\]; it takes look_behind"):
        CrossTokenizerDrafter.check_options(k=4)


def test_compiled_drafts_need_one_tokenizer(tokenizers, storytellers):
    with pytest.raises(ValueError, match="compile=True needs the same tokenizer on both sides"):
        CrossTokenizerDrafter(storytellers["byte_level"], tokenizers["byte_level"], tokenizers["metaspace"],
                              compile=True)


def test_a_target_wider_than_the_bridge_is_refused_by_the_decoder(tokenizers, storytellers):
    drafter = CrossTokenizerDrafter(storytellers["byte_level"], tokenizers["byte_level"], tokenizers["metaspace"])
    wider = bigram_model(tokenizers["byte_level"], [])  # 400 logits where the metaspace bridge has 300 tokens
    with pytest.raises(ValueError, match="the target has vocab_size=400 but this drafter was built for 300 target "
                                         "tokens; pass target_vocab_size"):
        specdec.Decoder(wider, drafter)


@pytest.fixture(scope="module")
def cross_dirs(tokenizers, tmp_path_factory) -> dict:
    """A saved tiny pair whose draft (metaspace, 300 tokens) and target (byte-level, 400) differ in tokenizer."""
    root = tmp_path_factory.mktemp("cross")
    dirs = {}
    for role, name, layers in (("draft", "metaspace", 1), ("target", "byte_level", 2)):
        tokenizer = tokenizers[name]
        torch.manual_seed(layers)
        config = GPT2Config(vocab_size=len(tokenizer), n_positions=128, n_embd=32, n_layer=layers, n_head=2,
                            eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.eos_token_id)
        dirs[role] = str(root / role)
        GPT2LMHeadModel(config).save_pretrained(dirs[role])
        tokenizer.save_pretrained(dirs[role])
    return dirs


def test_load_pair_takes_two_tokenizers_only_when_asked(cross_dirs, tokenizers):
    with pytest.raises(ValueError, match="different vocab_size: 300 vs 400; to draft across tokenizers use "
                                         "specdec.CrossTokenizerDrafter with load_pair"):
        load_pair(None, draft=cross_dirs["draft"], target=cross_dirs["target"], device="cpu")
    pair = load_pair(None, draft=cross_dirs["draft"], target=cross_dirs["target"], cross_tokenizer=True,
                     device="cpu")
    assert not pair.shares_tokenizer
    assert pair.draft_tokenizer.get_vocab() == tokenizers["metaspace"].get_vocab()
    assert pair.tokenizer.get_vocab() == tokenizers["byte_level"].get_vocab()
    drafter = CrossTokenizerDrafter.from_pair(pair)
    assert drafter.bridge.target_vocab_size == 400 and drafter.bridge.draft_vocab_size == 300
    same = plan_pair(None, draft=cross_dirs["target"], target=cross_dirs["target"],
                     draft_tokenizer=cross_dirs["target"], cross_tokenizer=True, device="cpu")
    assert same.shares_tokenizer  # one tokenizer source: nothing to cross
    with pytest.raises(TypeError, match="cross_tokenizer must be True or False, got 'yes'"):
        plan_pair(None, draft=cross_dirs["draft"], target=cross_dirs["target"], cross_tokenizer="yes")


def test_the_cli_refuses_two_tokenizers_for_other_drafters(cross_dirs, tiny):
    from experiments.config_checks import ConfigError, validate
    from test_cli_validation import compose_run

    base = [*tiny_overrides(tiny), f"pair.draft={cross_dirs['draft']}", f"pair.target={cross_dirs['target']}"]
    with pytest.raises(ConfigError, match="different vocab_size: 300 vs 400; .*drafter=cross_tokenizer "
                                          "pair.cross_tokenizer=true"):
        validate(compose_run([*base, "drafter=cross_tokenizer"]))
    with pytest.raises(ConfigError, match=r"tokenizers differ \(300 vs 400 tokens\), and only "
                                          r"drafter=cross_tokenizer drafts across them"):
        validate(compose_run([*base, "pair.cross_tokenizer=true"]))
    objects, _ = validate(compose_run([*base, "pair.cross_tokenizer=true", "drafter=cross_tokenizer"]))
    assert objects["drafter"] is None  # built by its factory once the pair is loaded


def test_a_run_with_two_tokenizers_writes_its_rows(cross_dirs, tiny, tmp_path, monkeypatch):
    from test_experiments import main, rows_of

    run_dir = tmp_path / "run"
    main([*tiny_overrides(tiny, num_prompts=2, max_new_tokens=6, warmup=0), f"pair.draft={cross_dirs['draft']}",
          f"pair.target={cross_dirs['target']}", "pair.cross_tokenizer=true", "drafter=cross_tokenizer",
          f"hydra.run.dir={run_dir}"], monkeypatch)
    rows = rows_of(run_dir)
    assert len(rows) == 2 and all(row["emitted"] == 6 and row["drafter"] == "cross_tokenizer" for row in rows)
    assert rows[0]["drafter_translate"] == "auto" and rows[0]["drafter_hold_back"] == 2


# --- The pair: GPT-2 small (random weights, the real GPT-2 BPE) drafting for the embedded target ---------


@pytest.mark.slow
def test_gpt2_small_drafts_for_the_embedded_target_with_transformers_greedy_output(embedded):
    target_tok = embedded.tokenizer
    draft_tok = gpt2_tokenizer()
    draft = gpt2_shaped_model("gpt2", torch.device("cpu"), torch.float32)
    prompts = [target_tok(text)["input_ids"] for text in TEXTS] + embedded_prompts(target_tok, 1)
    drafter = CrossTokenizerDrafter(draft, draft_tok, target_tok, target_vocab_size=embedded.target.config.vocab_size)
    out = greedy_run(embedded.target, drafter, prompts, target_tok.eos_token_id, k=3)
    assert out.tokens == [hf_greedy(embedded.target, p, NEW_TOKENS, eos_token_id=target_tok.eos_token_id)
                          for p in prompts]
    assert drafter.bridge.num_shared > 1000 and drafter.stats.target_tokens > 0
