"""How two vocabularies relate and how text moves between them: what a cross-tokenizer drafter stands on.

No model here, only the two tokenizers:

- **Token-level intersection (TLI)** (Timor et al. 2025, "Lossless speculative decoding for heterogeneous
  vocabularies"): the draft tokens whose text is exactly one target token's text, as id maps both ways, and the
  draft distribution restricted to them. Sampling a target token from ``restrict(q)`` and judging it with the
  usual speculative rule against ``restrict(q)`` is exact, since that is the distribution the token was drawn from.
  A token's text is what decoding it after a plain anchor adds, so "Ġthe" and "▁the" both read " the"; special
  tokens, byte fragments and text containing U+FFFD (which decoding cannot tell from a fragment) never map.
- **Text to target tokens** (transformers' universal assisted generation): the target tokens that a drafted
  continuation's text encodes to, as the target tokenizer encodes the committed text and the continuation together.
  At temperature 0 any proposal is exact (the target judges every token), so this only has to be a good guess.
- **Resynchronisation**: after a verdict, how many of the draft's tokens stay valid and which draft tokens follow.

A token's text depends on its neighbours (a word's leading space, a merge across two tokens, a character split
over byte tokens), so text is always decoded with the tokens before it and re-encoded over a look-behind window
of the last tokens. Tokenizers are host code: rows are lists of ints, and every tokenizer call is one batched call.

Row state the caller keeps (the drafter owns it): a row's **synced** prefixes, ``draft_ids[:draft_synced]`` and
``target_ids[:target_synced]``, spell the same text. Committed target tokens past ``target_synced`` are *pending*:
they end inside a character (byte-level tokens), so their text is not yet whole.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specdec.checks import check_tokenizer as check_transformers_tokenizer

REPLACEMENT = "\ufffd"  # what decoding gives for bytes that are not (yet) a whole UTF-8 character
ANCHOR = "a"  # plain text decoded before each single token, so its own leading space or join shows
MAX_CHARACTER_TOKENS = 4  # a character is at most 4 UTF-8 bytes, so at most 3 trailing tokens can be incomplete


class Restricted(NamedTuple):
    """A draft distribution restricted to the shared tokens, on the target's vocabulary."""

    probs: torch.Tensor  # [..., V_target] renormalised over shared tokens; all zeros where no_shared_mass
    no_shared_mass: torch.Tensor  # [...] bool: the draft put no probability on any shared token


@dataclass(frozen=True)
class CommittedText:
    """The whole-character text that a row's committed tokens add, and how far it reaches."""

    text: str
    end: int  # ids[start:end] spell text; ids[end:] end inside a character and stay pending


@dataclass(frozen=True)
class Resync:
    """Where a row's draft context stands after new committed text: ``draft_ids[:keep] + feed`` spells the
    committed text as the draft tokenizer encodes it, so the draft cache stays valid up to ``keep``."""

    keep: int  # leading draft tokens (cache entries) that stay valid
    feed: list[int]  # draft tokens to feed after them


class TokenBridge:
    """The relation between a draft and a target tokenizer (transformers tokenizers).

    ``draft_vocab_size`` / ``target_vocab_size`` are the models' logit widths (default: the tokenizers' id
    ranges); ids past a tokenizer's range (padded embeddings) never map, and a smaller width leaves ids out.
    ``look_behind`` committed tokens are re-encoded with new text, enough to cover the last word before it
    (transformers uses 10)."""

    def __init__(self, draft_tokenizer, target_tokenizer, look_behind: int = 10,
                 draft_vocab_size: int | None = None, target_vocab_size: int | None = None):
        if not isinstance(look_behind, int) or look_behind < 1:
            raise ValueError(f"look_behind must be a positive int (tokens), got {look_behind!r}")
        draft_size = check_tokenizer(draft_tokenizer, "draft", draft_vocab_size)
        target_size = check_tokenizer(target_tokenizer, "target", target_vocab_size)
        self.draft_tokenizer, self.target_tokenizer, self.look_behind = draft_tokenizer, target_tokenizer, look_behind
        self.draft_specials = special_ids(draft_tokenizer)
        self.target_specials = special_ids(target_tokenizer)
        draft_shared, target_shared = shared_tokens(token_texts(draft_tokenizer, draft_size, self.draft_specials),
                                                    token_texts(target_tokenizer, target_size, self.target_specials))
        self.shared_draft_ids = torch.tensor(draft_shared, dtype=torch.long)  # [S]
        self.shared_target_ids = torch.tensor(target_shared, dtype=torch.long)  # [S], same text as shared_draft_ids
        self.draft_to_target = torch.full((draft_size,), -1, dtype=torch.long)  # [V_draft]
        self.draft_to_target[self.shared_draft_ids] = self.shared_target_ids
        self.target_to_draft = torch.full((target_size,), -1, dtype=torch.long)  # [V_target]
        self.target_to_draft[self.shared_target_ids] = self.shared_draft_ids

    @property
    def draft_vocab_size(self) -> int:
        return self.draft_to_target.shape[0]

    @property
    def target_vocab_size(self) -> int:
        return self.target_to_draft.shape[0]

    @property
    def num_shared(self) -> int:
        return self.shared_draft_ids.shape[0]

    def to(self, device: torch.device | str) -> TokenBridge:
        """Moves the id maps to ``device`` (where the draft's probabilities live), in place; returns self."""
        for name in ("shared_draft_ids", "shared_target_ids", "draft_to_target", "target_to_draft"):
            setattr(self, name, getattr(self, name).to(device))
        return self

    def restrict(self, draft_probs: torch.Tensor) -> Restricted:
        """``q'(t) = q(d) / sum_{shared d'} q(d')`` for each shared pair (d, t), 0 on target tokens not shared."""
        if not draft_probs.is_floating_point() or draft_probs.shape[-1] != self.draft_vocab_size:
            raise ValueError(f"draft_probs must be floating point [..., {self.draft_vocab_size}] (the draft "
                             f"vocabulary), got {draft_probs.dtype} {tuple(draft_probs.shape)}")
        shared = draft_probs[..., self.shared_draft_ids]  # [..., S]
        mass = shared.sum(dim=-1, keepdim=True)  # [..., 1]
        probs = draft_probs.new_zeros(*draft_probs.shape[:-1], self.target_vocab_size)  # [..., V_target]
        # Rows without shared mass divide zeros by the smallest normal number: zeros, never NaN.
        probs[..., self.shared_target_ids] = shared / mass.clamp_min(torch.finfo(mass.dtype).tiny)
        return Restricted(probs, mass.squeeze(-1) <= 0)

    def target_text(self, target_ids: list[list[int]], starts: list[int]) -> list[CommittedText]:
        """The text each row's committed target tokens ``target_ids[start:]`` add, in whole characters."""
        check_rows(target_ids, starts, "starts")
        contexts = [row[max(0, n - self.look_behind):n] for row, n in zip(target_ids, starts)]
        texts, lengths = whole_character_texts(self.target_tokenizer, contexts,
                                               [row[n:] for row, n in zip(target_ids, starts)])
        return [CommittedText(text, n + length) for text, n, length in zip(texts, starts, lengths)]

    def to_target(self, target_ids: list[list[int]], target_synced: list[int], draft_ids: list[list[int]],
                  draft_synced: list[int]) -> list[list[int]]:
        """The target tokens each row's drafted continuation ``draft_ids[draft_synced:]`` encodes to after the
        committed ``target_ids``: the target tokenizer's encoding of the look-behind window's text followed by the
        drafted text, past the window's own encoding and the row's pending tokens. The last token is left out
        (more text could still merge into it) unless the draft ended its text with EOS, which then becomes the
        target's EOS. A row gets no tokens where that encoding does not begin with the window's own and the
        pending tokens (the drafted text would merge into a committed token)."""
        check_rows(target_ids, target_synced, "target_synced")
        check_rows(draft_ids, draft_synced, "draft_synced")
        if len(draft_ids) != len(target_ids):
            raise ValueError(f"draft_ids has {len(draft_ids)} rows but target_ids has {len(target_ids)}")
        drafted, ended = self.drafted_texts(draft_ids, draft_synced)
        starts = window_starts(target_ids, target_synced, self.look_behind, self.target_specials)
        windows = decode(self.target_tokenizer, [row[s:n] for row, s, n in zip(target_ids, starts, target_synced)])
        with_drafted = encode(self.target_tokenizer, [window + text for window, text in zip(windows, drafted)])
        alone = encode(self.target_tokenizer, windows)
        eos = self.target_tokenizer.eos_token_id
        return [continuation(tokens, own + row[n:], eos if has_eos else None)
                for tokens, own, row, n, has_eos in zip(with_drafted, alone, target_ids, target_synced, ended)]

    def drafted_texts(self, draft_ids: list[list[int]], draft_synced: list[int]) -> tuple[list[str], list[bool]]:
        """Each row's drafted text up to the draft's EOS and its last whole character, and whether it had EOS."""
        eos = self.draft_tokenizer.eos_token_id
        cuts = [cut_at(row[n:], eos) for row, n in zip(draft_ids, draft_synced)]
        contexts = [row[max(0, n - self.look_behind):n] for row, n in zip(draft_ids, draft_synced)]
        texts = appended_texts(self.draft_tokenizer, contexts, [drafted for drafted, _ in cuts])
        return [text.rstrip(REPLACEMENT) for text in texts], [has_eos for _, has_eos in cuts]

    def resync(self, draft_ids: list[list[int]], draft_synced: list[int], new_text: list[str]) -> list[Resync]:
        """Each row's draft context after ``new_text`` is committed after ``draft_ids[:draft_synced]``:
        the draft tokenizer's encoding of the look-behind window's text and the new text is compared with the
        row's draft tokens from the window on (drafted ones included, so accepted drafts keep their cache).
        A window starts cleanly where its encoding begins with the row's own token there and decodes back to
        the window's text (so that token means the same alone as in the row); otherwise it reaches back."""
        check_rows(draft_ids, draft_synced, "draft_synced")
        if len(new_text) != len(draft_ids):
            raise ValueError(f"new_text has {len(new_text)} rows but draft_ids has {len(draft_ids)}")
        tokenizer = self.draft_tokenizer
        starts = window_starts(draft_ids, draft_synced, self.look_behind, self.draft_specials)
        results: list[Resync | None] = [None] * len(draft_ids)
        pending = list(range(len(draft_ids)))
        while pending:  # rounds over the rows whose window did not start cleanly; each starts further back
            windows = decode(tokenizer, [draft_ids[i][starts[i]:draft_synced[i]] for i in pending])
            encoded = encode(tokenizer, [window + new_text[i] for window, i in zip(windows, pending)])
            retry = []
            for i, window, tokens, decoded in zip(pending, windows, encoded, decode(tokenizer, encoded)):
                matched = common_prefix_length(draft_ids[i][starts[i]:], tokens)
                clean = matched > 0 and decoded.startswith(window)
                earlier = None if clean else earlier_start(draft_ids[i], starts[i], draft_synced[i],
                                                           self.look_behind, self.draft_specials)
                if earlier is None:
                    results[i] = Resync(keep=starts[i] + matched, feed=tokens[matched:])
                else:
                    starts[i] = earlier
                    retry.append(i)
            pending = retry
        return results


def check_tokenizer(tokenizer, role: str, vocab_size: int | None) -> int:
    """The id range the maps cover; one clear error for a tokenizer the bridge cannot use."""
    check_transformers_tokenizer(f"{role} tokenizer", tokenizer)
    if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
        raise ValueError(f"{role}_vocab_size must be a positive int, got {vocab_size!r}")
    return vocab_size or id_range(tokenizer, role)


def id_range(tokenizer, role: str) -> int:
    """The ids a tokenizer encodes to lie in [0, id_range): its largest id + 1 (added tokens included)."""
    try:
        vocab = tokenizer.get_vocab()
    except NotImplementedError:
        vocab = {}
    if not vocab:
        raise ValueError(f"{role} tokenizer {type(tokenizer).__name__} has no vocabulary (get_vocab() is empty)")
    return max(vocab.values()) + 1


def special_ids(tokenizer) -> set[int]:
    """Ids that stand for control, not text: they never map and never begin a re-encoding window."""
    added = tokenizer.added_tokens_decoder
    return set(tokenizer.all_special_ids) | {i for i, token in added.items() if token.special}


def decode(tokenizer, rows: list[list[int]]) -> list[str]:
    if not rows:
        return []
    return tokenizer.batch_decode(rows, skip_special_tokens=True, clean_up_tokenization_spaces=False)


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    if not texts:
        return []
    return tokenizer(list(texts), add_special_tokens=False)["input_ids"]


def token_texts(tokenizer, vocab_size: int, specials: set[int]) -> list[str | None]:
    """The text each id adds after a plain anchor (so a leading space or a join shows as it does mid-text);
    None for special tokens, ids that add nothing, and byte fragments that are not whole characters."""
    ids = range(min(vocab_size, max(tokenizer.get_vocab().values()) + 1))
    anchor = encode(tokenizer, [ANCHOR])[0]
    head = decode(tokenizer, [anchor])[0]
    pieces = decode(tokenizer, [anchor + [i] for i in ids])
    texts = [piece[len(head):] if piece.startswith(head) else None for piece in pieces]
    texts = [None if i in specials or not text or REPLACEMENT in text else text for i, text in zip(ids, texts)]
    return texts + [None] * (vocab_size - len(texts))


def shared_tokens(draft_texts: list[str | None], target_texts: list[str | None]) -> tuple[list[int], list[int]]:
    """Pairs (draft id, target id) with the same text, where that text is one id in each vocabulary."""
    draft_ids, target_ids = unique_ids(draft_texts), unique_ids(target_texts)
    common = sorted(draft_ids.keys() & target_ids.keys(), key=draft_ids.get)
    return [draft_ids[text] for text in common], [target_ids[text] for text in common]


def unique_ids(texts: list[str | None]) -> dict[str, int]:
    """text -> id for the texts exactly one id has."""
    counts = Counter(text for text in texts if text is not None)
    return {text: i for i, text in enumerate(texts) if text is not None and counts[text] == 1}


def check_rows(rows: list[list[int]], positions: list[int], name: str) -> None:
    if len(positions) != len(rows):
        raise ValueError(f"{name} has {len(positions)} entries for {len(rows)} rows")
    bad = [(i, n, len(row)) for i, (row, n) in enumerate(zip(rows, positions)) if not 0 <= n <= len(row)]
    if bad:
        row, n, length = bad[0]
        raise ValueError(f"{name}[{row}] = {n} is outside row {row}'s {length} tokens (0..{length} allowed)")


def cut_at(tokens: list[int], eos: int | None) -> tuple[list[int], bool]:
    """The tokens before the first EOS, and whether there was one."""
    if eos is None or eos not in tokens:
        return tokens, False
    return tokens[:tokens.index(eos)], True


def appended_texts(tokenizer, contexts: list[list[int]], tails: list[list[int]]) -> list[str]:
    """The text each tail adds after its context tokens (decoding the tail alone would lose a leading space
    or a join)."""
    heads = decode(tokenizer, contexts)
    fulls = decode(tokenizer, [context + tail for context, tail in zip(contexts, tails)])
    split = [i for i, (head, full) in enumerate(zip(heads, fulls)) if not full.startswith(head)]
    if split:
        raise ValueError(f"row {split[0]}: its synced tokens end inside a character, so the text after them is "
                         f"not defined; synced positions must fall between whole characters")
    return [full[len(head):] for head, full in zip(heads, fulls)]


def whole_character_texts(tokenizer, contexts: list[list[int]], tails: list[list[int]]
                          ) -> tuple[list[str], list[int]]:
    """``appended_texts`` up to the last whole character, and how many leading tail tokens spell it: trailing
    tokens that end inside a character are left out."""
    lengths = [len(tail) for tail in tails]
    texts = appended_texts(tokenizer, contexts, tails)
    for _ in range(MAX_CHARACTER_TOKENS - 1):  # rounds, each leaving out one more token of the incomplete rows
        incomplete = [i for i, text in enumerate(texts) if text.endswith(REPLACEMENT) and lengths[i] > 0]
        for i in incomplete:
            lengths[i] -= 1
        shorter = appended_texts(tokenizer, [contexts[i] for i in incomplete],
                                 [tails[i][:lengths[i]] for i in incomplete])
        for i, text in zip(incomplete, shorter):
            texts[i] = text
    return texts, lengths


def after_last_special(tokens: list[int], specials: set[int]) -> int:
    """The first position after the last special token (0 if none): text before it is never re-encoded, as
    decoding drops special tokens."""
    return next((i + 1 for i in range(len(tokens) - 1, -1, -1) if tokens[i] in specials), 0)


def window_starts(rows: list[list[int]], synced: list[int], look_behind: int, specials: set[int]) -> list[int]:
    """Where each row's look-behind window of synced tokens starts."""
    lows = [max(0, n - look_behind) for n in synced]
    return [low + after_last_special(row[low:n], specials) for row, low, n in zip(rows, lows, synced)]


def earlier_start(row: list[int], start: int, synced: int, look_behind: int, specials: set[int]) -> int | None:
    """The next window start to try, one token further back (after look_behind tries, back to the row's start
    or its last special token), or None where there is nowhere further back to go."""
    floor = after_last_special(row[:start], specials)
    if start <= floor:
        return None
    return floor if synced - start >= 2 * look_behind else start - 1


def common_prefix_length(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def continuation(tokens: list[int], prefix: list[int], eos: int | None) -> list[int]:
    """The tokens after ``prefix`` (a window's own encoding and the pending tokens) if ``tokens`` begin with it;
    all of them and ``eos`` where the text ended with EOS, else all but the last (undetermined) one."""
    if tokens[:len(prefix)] != prefix:
        return []
    new = tokens[len(prefix):]
    return new[:-1] if eos is None else new + [eos]


def same_tokens(draft_tokenizer, target_tokenizer) -> bool:
    """Whether ids mean the same tokens on both sides: one vocabulary (token -> id) and the same special ids."""
    if draft_tokenizer is target_tokenizer:
        return True
    return (draft_tokenizer.get_vocab() == target_tokenizer.get_vocab()
            and set(draft_tokenizer.all_special_ids) == set(target_tokenizer.all_special_ids))
