"""Drafters propose tokens; the decode loop decides what to keep and tells them through ``commit``.

The interface, with what a drafter may declare (``selects_rows``, ``models``), is ``specdec.interfaces.Drafter``.
Drafters here: ``ModelDrafter`` (a small LM), ``TreeDrafter`` (a small LM drafting a token tree, see
``specdec.tree``), ``NoDrafter`` (the baseline), and in their own modules
``specdec.ngram.NGramDrafter`` (prompt lookup) and ``specdec.early_exit.EarlyExitDrafter`` (the target's first
layers).
"""

from __future__ import annotations

import torch

from specdec.cache import KVCache, static_capacity
from specdec.interfaces import Drafter, StopHook
from specdec.sampling import SamplingConfig, finite_peaks, greedy_choice, logits_to_probs, sample, usable
from specdec.tree import kept_positions, path_tokens, tree_shape, tree_shape_on, truncated
from specdec.types import Proposal, StepOutcome

DRAFT_ROOM_GUESS = 128  # new tokens a static draft cache first makes room for; it grows if a call needs more


class ModelDrafter(Drafter):
    """Drafts autoregressively with a small causal LM that shares the target's vocabulary."""

    name = "model"
    needs_pair = True

    @classmethod
    def from_pair(cls, pair, compile: bool = False, **options) -> "ModelDrafter":
        cls.check_options(compile=compile, **options)
        return cls(pair.draft, compile=compile, **options)

    @classmethod
    def check_options(cls, compile: bool = False, **options) -> None:
        unknown = set(options) - {"label", "cache_layout"}
        if unknown:
            raise TypeError(f"ModelDrafter got unknown options {sorted(unknown)}; it takes label and cache_layout")

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
        tokens, peaks, probs = [], [], []  # [B] each per drafted token; peaks are checked once, after the loop
        for i in range(k):
            logits = self.cache.forward(feed, feed_mask)[:, -1]  # [B, V]
            if sampling.is_greedy:  # q is a point mass at the argmax: the token says it all
                token, peak = greedy_choice(logits)  # [B], [B]
            else:
                peak = logits.amax(-1)  # [B]
                step_probs = logits_to_probs(logits, sampling)  # [B, V]
                token = sample(step_probs, generator)  # [B]
                probs.append(step_probs)
            tokens.append(token)
            peaks.append(peak)
            self.num_forwards += 1
            if stop is not None and i < k - 1 and stop(token, logits):
                break  # the cache has seen every drafted token but the last, as after a full draft
            feed, feed_mask = token.unsqueeze(1), self.live
        self.proposed = torch.stack(tokens, 1)  # [B, k]
        finite = finite_peaks(torch.stack(peaks, 1))  # [] no NaN/inf in any draft step's logits
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
            self.unfed_mask = torch.cat([kept_all * self.live, self.live], 1)  # [B, 2]


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


class TreeDrafter(Drafter):
    """Drafts a token tree with a small causal LM: each node at depth i - 1 gets ``branching[i - 1]`` children.

    Level by level, one draft forward per level but the last: the children of the root come from the last
    committed context; each later level feeds the previous one under its ancestor mask. Children are the top-b
    tokens at temperature 0, else b i.i.d. samples of q (see the module docstring). Owns its KV cache, rolled back
    in ``commit``.
    """

    name = "tree"
    selects_rows = True
    drafts_trees = True
    needs_pair = True

    @classmethod
    def from_pair(cls, pair, compile: bool = False, **options) -> "TreeDrafter":
        cls.check_options(compile=compile, **options)
        return cls(pair.draft, **options)

    @classmethod
    def check_options(cls, compile: bool = False, branching=(2, 2, 1, 1), **options) -> None:
        unknown = set(options) - {"label"}
        if unknown:
            raise TypeError(f"TreeDrafter got unknown options {sorted(unknown)}; it takes branching and label")
        tree_shape(tuple(branching) if isinstance(branching, (list, tuple)) else branching)
        if compile:
            raise ValueError("token trees run eager on the dynamic cache layout: compile=true cannot draft trees")

    def __init__(self, model: torch.nn.Module, branching=(2, 2, 1, 1), label: str = "draft"):
        self.model = model
        self.label = label
        self.shape = tree_shape(tuple(branching) if isinstance(branching, (list, tuple)) else branching)
        self.num_forwards = 0

    def models(self) -> list[torch.nn.Module]:
        return [self.model]

    def start(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> None:
        """Cache the prompt but its last token, which the first ``propose`` feeds."""
        self.cache = KVCache(self.model, input_ids.shape[0], input_ids.device, self.label)
        if input_ids.shape[1] > 1:
            self.cache.prefill(input_ids[:, :-1], attention_mask[:, :-1])
        self.unfed = input_ids[:, -1:]  # [B, m] emitted tokens not yet in the cache
        self.unfed_mask = torch.ones_like(self.unfed)  # [B, m] 0: a hole
        self.live = torch.ones_like(self.unfed)  # [B, 1] 0 for finished rows
        self.shape_on = tree_shape_on(self.shape.branching, input_ids.device)
        self.proposed = input_ids[:, :0]  # [B, N] the last tree's nodes (none yet; rows may retire before one)
        self.num_forwards = 0

    def propose(
        self, k: int, sampling: SamplingConfig, generator: torch.Generator, stop: StopHook | None = None
    ) -> Proposal:
        shape = truncated(self.shape_on, k)
        logits = self.cache.forward(self.unfed, self.unfed_mask)[:, -1:]  # [B, 1, V] at the root
        self.num_forwards += 1
        levels, probs, finite = [], [], usable(logits)
        fed = 0  # tree positions fed so far (the levels but the last)
        for depth, b in enumerate(shape.branching, start=1):
            children, level_probs = choose_children(logits, b, sampling, generator)  # [B, n*b], [B, n, V]
            levels.append(children)
            if level_probs is not None:
                probs.append(level_probs)
            if depth == len(shape.branching):
                break
            n = children.shape[1]
            positions = torch.arange(fed + 1, fed + n + 1, device=children.device)  # this level's positions
            attend = shape.ancestors[positions][:, 1 : fed + n + 1]  # [n, fed + n]: ancestors among fed nodes
            logits = self.cache.forward_tree(children, attend, torch.full_like(positions, depth - 1),
                                             self.live.squeeze(1).bool())
            self.num_forwards += 1
            finite &= usable(logits)
            fed += n
        self.fed = fed
        self.proposed = torch.cat(levels, 1)  # [B, N]
        return Proposal(self.proposed, torch.cat(probs, 1) if probs else None, finite, shape)

    def select_rows(self, index: torch.Tensor) -> None:
        self.cache.select_rows(index)
        self.unfed, self.unfed_mask, self.live = self.unfed[index], self.unfed_mask[index], self.live[index]
        self.proposed = self.proposed[index]

    def commit(self, outcome: StepOutcome) -> None:
        """Keep the fed nodes of the accepted path, turn the other fed nodes into holes, queue the rest."""
        next_token = outcome.next_token.unsqueeze(1)  # [B, 1]
        self.live = outcome.active_after.long().unsqueeze(1)  # [B, 1]
        depth = outcome.k
        if depth == 0:  # nothing was drafted, so nothing fed: the new token joins the queue
            self.unfed = torch.cat([self.unfed, next_token], 1)
            self.unfed_mask = torch.cat([self.unfed_mask, torch.ones_like(next_token)], 1) * self.live
            return
        # The cache holds the queue, then the nodes of every level but the last (positions 1..fed).
        fed_depth = outcome.num_accepted.clamp(max=depth - 1)  # [B] accepted nodes the cache holds
        kept = kept_positions(outcome.path[:, : depth - 1], fed_depth + 1, self.fed + 1)[:, 1:]  # [B, fed]
        self.cache.keep_slots(kept)
        self.unfed, self.unfed_mask = next_token, self.live
        if outcome.max_accepted == depth:  # rows whose path reached the last level must still feed its node
            kept_all = (outcome.num_accepted == depth).long().unsqueeze(1)  # [B, 1]
            last = path_tokens(self.proposed, outcome.path[:, -1:])  # [B, 1]
            self.unfed = torch.cat([last, next_token], 1)  # [B, 2]
            self.unfed_mask = torch.cat([kept_all, torch.ones_like(next_token)], 1) * self.live


def choose_children(
    logits: torch.Tensor, b: int, sampling: SamplingConfig, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B, n, V] draft logits at n parents -> [B, n*b] children (each parent's b consecutively) and [B, n, V] q.

    Temperature 0: the top-b tokens (q is a point mass, judged on ids, so None). Otherwise b i.i.d. samples of q.
    """
    batch, n, vocab = logits.shape
    if sampling.is_greedy:
        return logits.topk(b, dim=-1).indices.reshape(batch, n * b), None
    q = logits_to_probs(logits, sampling)  # [B, n, V]
    draws = torch.multinomial(q.reshape(batch * n, vocab), b, replacement=True, generator=generator)  # [B*n, b]
    return draws.reshape(batch, n * b), q
