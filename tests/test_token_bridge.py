"""The token bridge between two vocabularies: TLI maps and restriction, drafted text to target tokens, draft resync.

Tokenizers: two trained here on a small corpus (a byte-level BPE, GPT-2's "Ġ" convention, and a SentencePiece-style
BPE, the "▁" convention), the real GPT-2 BPE and the embedded pair's 8192-token byte-level BPE. The references are
the tokenizers' own encodings of whole texts, and for TLI the raw vocabulary strings read through each convention."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import bytes_to_unicode

from specdec.models import EMBEDDED_DIR, gpt2_tokenizer
from specdec.token_bridge import TokenBridge, common_prefix_length

CORPUS = [  # what the two small tokenizers are trained on: other sentences than TEXTS, with their characters
    "A small brown dog ran over the hills and far away, then slept.",
    "Is this the one? Yes, it is... or isn't it?! Nobody knows.",
    "Prices rose 7% in 1999; apples cost $4.20 and pears 13 cents.",
    "The café in the old straße served naïve tourists über-sweet crêpes — 你好, 世界! 🙂",
    "Tabs\tand\nnew lines,   runs of spaces, and quotes: 'single' \"double\".",
    "We jump, we hop, we wait; then the lazy fox sleeps there quickly.",
] * 10
# Word boundaries that re-encode differently: leading spaces, whitespace runs, multi-byte characters, digit runs,
# punctuation runs, contractions.
TEXTS = [
    "Hello world, hello there! It's a test; isn't it? Yes... it is!!! Wait?!",
    "The quick brown fox jumps over the lazy dog. 12345 apples cost $3.50 in 2024.",
    "naïve café — über straße 你好 世界 🙂 emoji and   spaces\ttabs\nnew lines  end",
]


def wrap(tokenizer: Tokenizer, **special) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)


def train_byte_level(vocab_size: int) -> PreTrainedTokenizerFast:
    """GPT-2's convention: bytes as characters, a leading space as "Ġ"."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return wrap(tokenizer, eos_token="<|end|>")


def train_metaspace(vocab_size: int) -> PreTrainedTokenizerFast:
    """SentencePiece's convention: a space as "▁", one prepended to the text, and stripped again when decoding."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    alphabet = sorted(set("".join(CORPUS + TEXTS)))  # every character is a token: no <unk> in the texts
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<unk>"], initial_alphabet=alphabet))
    return wrap(tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


TOKENIZERS = {
    "byte_level": lambda: train_byte_level(400),
    "metaspace": lambda: train_metaspace(300),
    "gpt2": gpt2_tokenizer,
    "embedded": lambda: AutoTokenizer.from_pretrained(EMBEDDED_DIR / "tokenizer"),
}
CROSS_PAIRS = [("byte_level", "metaspace"), ("metaspace", "byte_level"), ("embedded", "gpt2"),
               ("gpt2", "metaspace"), ("metaspace", "gpt2")]


@pytest.fixture(scope="module")
def tokenizers() -> dict:
    return {name: build() for name, build in TOKENIZERS.items()}


@pytest.fixture(scope="module")
def bridge(tokenizers):
    """bridge(draft name, target name, look_behind): built once per module."""
    built = {}

    def make(draft: str, target: str, look_behind: int = 10) -> TokenBridge:
        key = (draft, target, look_behind)
        if key not in built:
            built[key] = TokenBridge(tokenizers[draft], tokenizers[target], look_behind=look_behind)
        return built[key]
    return make


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


BYTE_OF_CHARACTER = {char: byte for byte, char in bytes_to_unicode().items()}  # byte-level BPE's spelling


def raw_text(tokenizer, token: str) -> str | None:
    """A vocabulary entry's text read through its convention, independently of decoding: byte-level entries are
    bytes spelled as characters, "▁" is a space. None for bytes that are not whole UTF-8 characters, and for text
    with U+FFFD in it, which decoding cannot tell from such bytes (GPT-2 has 8 such tokens)."""
    if tokenizer.backend_tokenizer.decoder.__class__.__name__ == "Metaspace":
        return token.replace("▁", " ")
    try:
        text = bytes(BYTE_OF_CHARACTER[char] for char in token).decode("utf-8")
    except UnicodeDecodeError:
        return None
    return None if "\ufffd" in text else text


def expected_shared(draft_tokenizer, target_tokenizer) -> set[tuple[int, int]]:
    """(draft id, target id) for every non-special text that is exactly one entry in each vocabulary."""
    def by_text(tokenizer) -> dict[str, list[int]]:
        texts: dict[str, list[int]] = {}
        for token, i in tokenizer.get_vocab().items():
            text = raw_text(tokenizer, token)
            if text and i not in tokenizer.all_special_ids:
                texts.setdefault(text, []).append(i)
        return {text: ids for text, ids in texts.items() if len(ids) == 1}
    draft, target = by_text(draft_tokenizer), by_text(target_tokenizer)
    return {(draft[text][0], target[text][0]) for text in draft.keys() & target.keys()}


@pytest.mark.parametrize("draft, target", CROSS_PAIRS + [("byte_level", "gpt2"), ("gpt2", "embedded")])
def test_tli_maps_exactly_the_tokens_with_identical_text(bridge, tokenizers, draft, target):
    b = bridge(draft, target)
    shared = set(zip(b.shared_draft_ids.tolist(), b.shared_target_ids.tolist()))
    assert shared == expected_shared(tokenizers[draft], tokenizers[target])
    assert shared, "the pair shares no token: the comparison would be empty"
    draft_ids, target_ids = b.shared_draft_ids, b.shared_target_ids
    assert torch.equal(b.draft_to_target[draft_ids], target_ids)
    assert torch.equal(b.target_to_draft[b.draft_to_target[draft_ids]], draft_ids)
    assert (b.draft_to_target >= 0).sum() == (b.target_to_draft >= 0).sum() == b.num_shared
    assert (b.draft_to_target[list(tokenizers[draft].all_special_ids)] == -1).all()


def test_same_tokenizer_shares_every_whole_character_token(bridge, tokenizers):
    b = bridge("gpt2", "gpt2")
    ids = b.shared_draft_ids
    assert torch.equal(ids, b.shared_target_ids)
    fragments = sum(raw_text(tokenizers["gpt2"], token) is None for token in tokenizers["gpt2"].get_vocab())
    assert b.num_shared == b.draft_vocab_size - 1 - fragments  # all but <|endoftext|> and the byte fragments
    assert fragments > 0


def test_restrict_moves_the_shared_mass_to_the_target_ids_renormalised(bridge):
    b = bridge("embedded", "gpt2")
    g = torch.Generator().manual_seed(0)
    draft_probs = torch.rand(2, 3, b.draft_vocab_size, generator=g, dtype=torch.float64).softmax(-1)  # [2, 3, V_d]
    restricted = b.restrict(draft_probs)
    assert restricted.probs.shape == (2, 3, b.target_vocab_size)
    assert not restricted.no_shared_mass.any()
    torch.testing.assert_close(restricted.probs.sum(-1), torch.ones(2, 3, dtype=torch.float64))
    shared_mass = draft_probs[..., b.shared_draft_ids].sum(-1, keepdim=True)  # [2, 3, 1]
    torch.testing.assert_close(restricted.probs[..., b.shared_target_ids],
                               draft_probs[..., b.shared_draft_ids] / shared_mass)
    unshared = torch.ones(b.target_vocab_size, dtype=torch.bool)
    unshared[b.shared_target_ids] = False
    assert (restricted.probs[..., unshared] == 0).all()


def test_restrict_round_trips_a_point_mass_and_flags_rows_without_shared_mass(bridge):
    b = bridge("metaspace", "byte_level")
    draft_id = int(b.shared_draft_ids[len(b.shared_draft_ids) // 2])
    unshared_id = int((b.draft_to_target == -1).nonzero()[-1])
    draft_probs = torch.zeros(3, b.draft_vocab_size)  # [3, V_d] float32
    draft_probs[0, draft_id] = 1.0
    draft_probs[1, unshared_id] = 1.0  # all mass on a token the target does not have
    draft_probs[2, [draft_id, unshared_id]] = 0.5
    restricted = b.restrict(draft_probs)
    assert restricted.no_shared_mass.tolist() == [False, True, False]
    assert not restricted.probs.isnan().any()
    assert (restricted.probs[1] == 0).all()
    for row in (0, 2):
        target_id = int(restricted.probs[row].argmax())
        assert restricted.probs[row, target_id] == 1.0
        assert b.target_to_draft[target_id] == draft_id


def test_restrict_refuses_a_distribution_over_another_vocabulary(bridge):
    b = bridge("byte_level", "metaspace")
    with pytest.raises(ValueError, match=f"{b.draft_vocab_size}"):
        b.restrict(torch.rand(2, b.target_vocab_size))
    with pytest.raises(ValueError, match="floating point"):
        b.restrict(torch.ones(2, b.draft_vocab_size, dtype=torch.long))


def test_padded_model_vocabularies_map_nothing_past_the_tokenizer(tokenizers):
    draft, target = tokenizers["byte_level"], tokenizers["metaspace"]
    b = TokenBridge(draft, target, draft_vocab_size=len(draft) + 7, target_vocab_size=len(target) + 3)
    assert b.draft_to_target.shape == (len(draft) + 7,) and b.target_to_draft.shape == (len(target) + 3,)
    assert (b.draft_to_target[len(draft):] == -1).all() and (b.target_to_draft[len(target):] == -1).all()
    assert b.restrict(torch.rand(len(draft) + 7).softmax(-1)).probs.shape == (len(target) + 3,)


def split_cases(draft_tokenizer, target_tokenizer, text: str):
    """Every split of text after a draft token: (target context, draft row, draft split, expected target tokens).
    Expected: the target tokenizer's own encoding of the whole text after the context's tokens, less the last
    token (it could merge with more text); none where that encoding does not begin with the context's tokens."""
    draft_full, target_full = encode(draft_tokenizer, text), encode(target_tokenizer, text)
    for split in range(1, len(draft_full)):
        prefix = draft_tokenizer.decode(draft_full[:split])
        if prefix.endswith("\ufffd"):  # the split falls inside a character: no text to commit
            continue
        context = encode(target_tokenizer, prefix)
        begins = target_full[:len(context)] == context
        yield context, draft_full, split, target_full[len(context):-1] if begins else []


@pytest.mark.parametrize("look_behind", [2, 10])
@pytest.mark.parametrize("draft, target", CROSS_PAIRS)
def test_drafted_text_becomes_the_target_tokenizers_own_encoding(bridge, tokenizers, draft, target, look_behind):
    b = bridge(draft, target, look_behind)
    proposed = nonempty = 0
    for text in TEXTS:
        cases = list(split_cases(tokenizers[draft], tokenizers[target], text))
        contexts, rows, splits, expected = (list(column) for column in zip(*cases))
        # one batch of ragged rows per text
        assert b.to_target(contexts, [len(c) for c in contexts], rows, splits) == expected
        proposed += len(cases)
        nonempty += sum(map(bool, expected))
    assert nonempty > proposed / 2  # most splits propose tokens: the comparison is not between empty lists


def test_a_batch_gives_each_row_what_it_gives_alone(bridge, tokenizers):
    b = bridge("embedded", "gpt2")
    cases = [case for text in TEXTS for case in split_cases(tokenizers["embedded"], tokenizers["gpt2"], text)][::5]
    contexts, rows, splits, _ = (list(column) for column in zip(*cases))
    batched = b.to_target(contexts, [len(c) for c in contexts], rows, splits)
    alone = [b.to_target([c], [len(c)], [r], [s])[0] for c, r, s in zip(contexts, rows, splits)]
    assert batched == alone and any(batched)


def test_a_committed_token_the_draft_would_merge_into_gets_no_proposal(tokenizers, bridge):
    b = bridge("embedded", "gpt2")
    gpt2, embedded = tokenizers["gpt2"], tokenizers["embedded"]
    context = encode(gpt2, "Hello wor")  # "Hello", " wor"; "Hello world" is "Hello", " world"
    assert encode(gpt2, "Hello world")[:len(context)] != context
    draft_context = encode(embedded, "Hello wor")
    drafted = draft_context + encode(embedded, "ld, hello there")
    assert embedded.decode(drafted) == "Hello world, hello there"
    assert b.to_target([context], [len(context)], [drafted], [len(draft_context)]) == [[]]


def test_a_draft_that_ends_its_text_proposes_every_token_and_the_target_eos(tokenizers, bridge):
    b = bridge("embedded", "gpt2")
    gpt2, embedded = tokenizers["gpt2"], tokenizers["embedded"]
    context, draft_context = encode(gpt2, "Hello"), encode(embedded, "Hello")
    drafted = encode(embedded, "Hello world.") + [embedded.eos_token_id] + encode(embedded, " ignored")
    assert b.to_target([context], [len(context)], [drafted], [len(draft_context)]) == [
        encode(gpt2, "Hello world.")[len(context):] + [gpt2.eos_token_id]]


def test_committed_text_stops_before_a_character_split_over_tokens(bridge, tokenizers):
    gpt2 = tokenizers["gpt2"]
    ids = encode(gpt2, "Hi 你好")  # each CJK character is two byte-level tokens
    rows = [ids[:end] for end in range(1, len(ids) + 1)]
    spans = bridge("embedded", "gpt2").target_text(rows, [1] * len(rows))
    for row, span in zip(rows, spans):
        whole = gpt2.decode(row[:span.end])
        assert "\ufffd" not in whole and span.text == whole[len(gpt2.decode(row[:1])):]
        assert all("\ufffd" in gpt2.decode(row[:end]) for end in range(span.end + 1, len(row) + 1))
    assert [span.end for span in spans] == [1, 2, 2, 4, 4, 6]  # the ends of the whole characters, read off above


def test_pending_tokens_of_a_split_character_lead_the_proposal(bridge, tokenizers):
    b = bridge("embedded", "gpt2")
    gpt2, embedded = tokenizers["gpt2"], tokenizers["embedded"]
    committed = encode(gpt2, "Hi 你好")[:-1]  # ends inside "好"
    span = b.target_text([committed], [0])[0]
    assert span.text == "Hi 你" and span.end == len(committed) - 1
    draft_context = encode(embedded, span.text)
    drafted = encode(embedded, "Hi 你好 world is here")
    assert drafted[:len(draft_context)] == draft_context
    full = encode(gpt2, "Hi 你好 world is here")
    assert b.to_target([committed], [span.end], [drafted], [len(draft_context)]) == [full[len(committed):-1]]


def resync_cases(draft_tokenizer, text: str):
    """The draft context spells text up to a cut and has drafted a guess past it; the committed text then keeps
    some of the guess and goes elsewhere. Yields (draft row, synced, new text, the draft's encoding of it all)."""
    for cut in range(1, len(text), 2):
        context = encode(draft_tokenizer, text[:cut])
        row = encode(draft_tokenizer, text[:cut + 12])
        if row[:len(context)] != context:  # the guess rewrote the context's last token: not a drafted row
            continue
        for accepted in (0, 5, 12):
            new = text[cut:cut + accepted] + "Yes"
            yield row, len(context), new, encode(draft_tokenizer, text[:cut] + new)


@pytest.mark.parametrize("look_behind", [2, 10])
@pytest.mark.parametrize("draft", list(TOKENIZERS))
def test_resync_keeps_the_longest_valid_prefix(bridge, tokenizers, draft, look_behind):
    b = bridge(draft, "gpt2", look_behind)
    kept_drafted = 0
    for text in TEXTS:
        rows, synced, new, canonical = (list(column) for column in zip(*resync_cases(tokenizers[draft], text)))
        results = b.resync(rows, synced, new)  # one batch of ragged rows per text
        for row, n, result, expected in zip(rows, synced, results, canonical):
            assert result.keep == common_prefix_length(row, expected)
            assert row[:result.keep] + result.feed == expected
            kept_drafted += max(0, result.keep - n)
    assert kept_drafted > 0  # accepted drafts keep their cache


def test_resync_rewrites_a_context_token_that_new_text_merges_into(bridge, tokenizers):
    b = bridge("gpt2", "metaspace")
    gpt2 = tokenizers["gpt2"]
    row = encode(gpt2, "Hello wor")
    [result] = b.resync([row], [len(row)], ["ld"])
    assert result.keep == len(row) - 1 and row[:result.keep] + result.feed == encode(gpt2, "Hello world")


def test_resync_from_a_bos_only_context_encodes_the_whole_prompt(bridge, tokenizers):
    metaspace = tokenizers["metaspace"]
    b = bridge("metaspace", "gpt2")
    [result] = b.resync([[metaspace.bos_token_id]], [1], ["Hello world"])
    assert result.keep == 1 and result.feed == encode(metaspace, "Hello world")


def test_unusable_tokenizers_and_rows_get_one_clear_error(tokenizers):
    good = tokenizers["byte_level"]
    raw = good.backend_tokenizer  # a tokenizers.Tokenizer: no batch_decode, not callable
    with pytest.raises(TypeError, match="draft tokenizer Tokenizer has no batch_decode, __call__, all_special_ids"):
        TokenBridge(raw, good)

    class NoVocabulary:
        all_special_ids, added_tokens_decoder, eos_token_id = [], {}, None

        def get_vocab(self):
            raise NotImplementedError

        batch_decode = __call__ = get_vocab
    with pytest.raises(ValueError, match="target tokenizer NoVocabulary has no vocabulary"):
        TokenBridge(good, NoVocabulary())
    with pytest.raises(ValueError, match="look_behind must be a positive int"):
        TokenBridge(good, good, look_behind=0)
    b = TokenBridge(good, good)
    with pytest.raises(ValueError, match=r"draft_synced\[1\] = 9 is outside row 1's 2 tokens"):
        b.resync([[1, 2], [3, 4]], [2, 9], ["a", "b"])
    with pytest.raises(ValueError, match="new_text has 1 rows but draft_ids has 2"):
        b.resync([[1, 2], [3, 4]], [2, 2], ["a"])
    with pytest.raises(ValueError, match="target_synced has 1 entries for 2 rows"):
        b.to_target([[1], [2]], [1], [[1], [2]], [1, 1])
