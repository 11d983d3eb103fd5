"""Drafters propose tokens; the decode loop decides what to keep and tells them through ``commit``.

The interface, with what a drafter may declare (``selects_rows``, ``models``), is ``specdec.interfaces.Drafter``.
Drafters here: ``ModelDrafter`` (a small LM), ``NoDrafter`` (the baseline), and in their own modules
``specdec.ngram.NGramDrafter`` (prompt lookup) and ``specdec.early_exit.EarlyExitDrafter`` (the target's first
layers).
"""

from __future__ import annotations

import torch

from specdec.cache import KVCache, static_capacity
from specdec.interfaces import Drafter, StopHook
from specdec.sampling import SamplingConfig, greedy_choice, logits_to_probs, sample, usable
from specdec.types import Proposal, StepOutcome

DRAFT_ROOM_GUESS = 128  # new tokens a static draft cache first makes room for; it grows if a call needs more


class ModelDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's vocabulary."""

    name = "model"

    def __init__(
        self, model: torch.nn.Module, label: str = "draft", cache_layout: str = "dynamic", compile: bool = False
    ):
        """``compile=True`` drafts through the compiled forward (``specdec.cache``) over a static cache."""
        self.model = model
        self.label = label
        self.compile = compile
        self.cache_layout = "static" if compile else cache_layout
        self.selects_rows = self.cache_layout == "dynamic"  # a static cache keeps its batch rows
        self.num_forwards = 0

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Cache the prompt but its last token, which the first ``propose`` feeds."""
        batch_size, width = input_ids.shape
        capacity = static_capacity(width, DRAFT_ROOM_GUESS)
        layout, device = self.cache_layout, input_ids.device
        self.cache = KVCache(self.model, batch_size, device, self.label, layout, capacity, self.compile)
        if input_ids.shape[1] > 1:
            self.cache.prefill(input_ids[:, :-1], attention_mask[:, :-1])
        # Tokens already emitted but not yet in this cache; unfed[:, j] is a hole where unfed_mask is 0.
        self.unfed = input_ids[:, -1:]  # [B, m]
        self.unfed_mask = torch.ones_like(self.unfed)  # [B, m]
        self.live = torch.ones_like(self.unfed)  # [B, 1] 0 for finished rows, which feed only holes
        self.num_forwards = 0

    def propose(
        self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None = None
    ) -> Proposal:
        feed, feed_mask = self.unfed, self.unfed_mask
        tokens, probs = [], []
        finite = torch.ones((), dtype=torch.bool, device=feed.device)
        for i in range(k):
            logits = self.cache.forward(feed, feed_mask)[:, -1]  # [B, V]
            if sampling.is_greedy:  # q is a point mass at the argmax: the token says it all
                token, step_usable = greedy_choice(logits)  # [B], []
            else:
                step_usable = usable(logits)
                step_probs = logits_to_probs(logits, sampling)  # [B, V]
                token = sample(step_probs, generator)  # [B]
                probs.append(step_probs)
            finite &= step_usable
            tokens.append(token)
            self.num_forwards += 1
            if stop is not None and i < k - 1 and stop(logits.float().softmax(-1)):
                break  # the cache has seen every drafted token but the last, as after a full draft
            feed, feed_mask = token.unsqueeze(1), self.live
        self.proposed = torch.stack(tokens, 1)  # [B, k]
        return Proposal(self.proposed, torch.stack(probs, 1) if probs else None, finite)

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B']."""
        self.cache.select_rows(index)
        self.unfed, self.unfed_mask, self.live = self.unfed[index], self.unfed_mask[index], self.live[index]

    def commit(self, outcome: StepOutcome) -> None:
        """Roll the cache back to the kept drafts and queue the tokens it has not seen."""
        k, next_token = outcome.k, outcome.next_token.unsqueeze(1)  # [B, 1]
        self.live = outcome.active_after.long().unsqueeze(1)  # [B, 1]
        if k == 0:  # nothing was drafted, so nothing fed: the new token joins the queue
            self.unfed = torch.cat([self.unfed, next_token], 1)
            self.unfed_mask = torch.cat([self.unfed_mask, torch.ones_like(next_token)], 1) * self.live
            return
        # The cache got the queue plus drafts 1..k-1; draft k was sampled but never fed.
        num_fed = k - 1
        kept = outcome.num_accepted.clamp(max=num_fed)  # [B]
        self.cache.keep(kept, num_fed, min(outcome.max_accepted, num_fed), min(outcome.min_accepted, num_fed))
        self.unfed, self.unfed_mask = next_token, self.live
        if outcome.max_accepted == k:  # rows that kept every draft must still feed draft k
            kept_all = (outcome.num_accepted == k).long().unsqueeze(1)  # [B, 1]
            self.unfed = torch.cat([self.proposed[:, -1:], next_token], 1)  # [B, 2]
            self.unfed_mask = torch.cat([kept_all, torch.ones_like(next_token)], 1) * self.live


class NoDrafter(Drafter):
    """Proposes nothing: the decode loop with it is plain autoregressive decoding (the baseline)."""

    name = "none"
    selects_rows = True

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """No state."""

    def propose(
        self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None = None
    ) -> Proposal:
        raise RuntimeError("NoDrafter proposes nothing; the loop must ask it for k = 0 only")

    def select_rows(self, index: torch.Tensor) -> None:
        """No state."""

    def commit(self, outcome: StepOutcome) -> None:
        """No state."""
