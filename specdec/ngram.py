"""Prompt lookup (n-gram) drafting: guess that the text continues as it did after the last time it read the same.

For each row, find the most recent earlier occurrence of the longest suffix of its tokens (prompt and output so
far) of length n in [min_ngram, max_ngram], and propose the tokens that followed it. No model, so no
distribution: ``Proposal.probs`` is None, which the loop treats as a point mass q = onehot(draft), and the
``speculative`` strategy stays lossless (accept x with probability p(x), else sample p with x removed).

Continuation. With the match at start s, the continuation starts at c = s + n and the suffix ends at the row's
length len, so only shift = len - c tokens of it exist. Treating drafted tokens as history too, token j of the
draft is history[c + j] = history[c + (j mod shift)]: a match right before the suffix proposes the loop it is in.

No match. Rows without any match propose their last token k times: every row of a batch must propose k tokens,
and this guess costs nothing extra (the strategy simply rejects it unless the target repeats the token).

State, all on the device: ``history`` [B, capacity] each row's tokens left-aligned (left padding dropped) and
``lengths`` [B]; slots at or past a row's length are junk and never matched. ``commit`` appends each row's
``num_new`` emitted tokens. Matching is batched tensor work (unfolded windows compared with the suffix); the
only Python loop is over n.
"""

from __future__ import annotations

import torch

from specdec.checks import check_draft_length
from specdec.interfaces import Drafter, StopHook
from specdec.sampling import SamplingConfig
from specdec.layout import Proposal
from specdec.types import StepOutcome


class NGramDrafter(Drafter):
    """Prompt-lookup drafter: continue the longest (n <= max_ngram) most recent match of the current suffix."""

    name = "ngram"
    selects_rows = True
    trusted_proposals = True

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        self.max_ngram = check_draft_length("max_ngram", max_ngram)
        self.min_ngram = check_draft_length("min_ngram", min_ngram)
        if self.min_ngram > self.max_ngram:
            raise ValueError(f"need min_ngram <= max_ngram, got min_ngram={min_ngram}, max_ngram={max_ngram}")

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Store each row's prompt without its left padding."""
        batch_size, width = input_ids.shape
        self.lengths = attention_mask.sum(-1)  # [B]
        padding = (width - self.lengths).unsqueeze(1)  # [B, 1]
        source = (padding + torch.arange(width, device=input_ids.device)).clamp(max=width - 1)  # [B, T]
        self.history = torch.zeros(batch_size, 2 * width + 64, dtype=torch.long, device=input_ids.device)
        self.history[:, :width] = input_ids.gather(1, source)  # [B, T] left-aligned
        self.max_length = width  # host upper bound on lengths.max(): slices the search without a sync

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B']."""
        self.history, self.lengths = self.history[index], self.lengths[index]

    def match(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[B] start of the chosen match (-1: none) and [B] its n (0: none)."""
        history = self.history[:, : self.max_length]  # [B, L]
        device = history.device
        lengths = self.lengths.unsqueeze(1)  # [B, 1]
        best_start = torch.full_like(self.lengths, -1)  # [B]
        best_n = torch.zeros_like(self.lengths)  # [B]
        # Longest first, from the longest n with a window before the suffix (not max_ngram: it may be 10**9).
        for n in range(min(self.max_ngram, self.max_length - 1), self.min_ngram - 1, -1):
            suffix_index = (lengths - n + torch.arange(n, device=device)).clamp_min(0)  # [B, n]
            suffix = history.gather(1, suffix_index)  # [B, n]
            windows = history.unfold(1, n, 1)  # [B, L-n+1, n]
            starts = torch.arange(windows.shape[1], device=device)  # [L-n+1]
            # An earlier window with at least one real token after it (this excludes the suffix itself).
            matches = (windows == suffix.unsqueeze(1)).all(-1) & (starts <= lengths - n - 1)  # [B, L-n+1]
            latest = torch.where(matches, starts, -1).amax(-1)  # [B]
            take = (latest >= 0) & (best_start < 0)  # [B] rows whose longest match is this n
            best_start = torch.where(take, latest, best_start)
            best_n = torch.where(take, n, best_n)
        return best_start, best_n

    def propose(
        self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None = None
    ) -> Proposal:
        """k tokens per row; deterministic, so sampling, generator and stop (no distribution to judge) are unused."""
        best_start, best_n = self.match()  # [B], [B]
        found = best_start >= 0  # [B]
        continuation = best_start + best_n  # [B]
        shift = (self.lengths - continuation).clamp_min(1)  # [B] tokens of the continuation already seen
        offset = torch.arange(k, device=shift.device).unsqueeze(0) % shift.unsqueeze(1)  # [B, k]
        index = torch.where(found.unsqueeze(1), continuation.unsqueeze(1) + offset, self.lengths.unsqueeze(1) - 1)
        return Proposal(self.history.gather(1, index), None)  # [B, k]

    def commit(self, outcome: StepOutcome) -> None:
        """Append each row's emitted tokens (the first num_new of new_tokens) to its history."""
        width = outcome.new_tokens.shape[1]  # k + 1
        if self.max_length + width > self.history.shape[1]:
            batch_size, capacity = self.history.shape
            grown = self.history.new_zeros(batch_size, max(width, capacity))  # at least double
            self.history = torch.cat([self.history, grown], 1)
        slots = self.lengths.unsqueeze(1) + torch.arange(width, device=self.lengths.device)  # [B, k+1]
        self.history.scatter_(1, slots, outcome.new_tokens)  # slots past num_new are junk past the new length
        self.lengths = self.lengths + outcome.num_new
        self.max_length += max(outcome.host.max_accepted + 1, 0)  # num_new <= num_accepted + 1 on active rows
