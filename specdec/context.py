"""A model's view of the sequences being decoded: its KV cache and its queue (``CachedContext``).

The queue holds the emitted tokens the cache has not seen yet: the whole prompt before the first step, then what a
step emitted last (its next token, and the last proposed token when that was kept but never fed). A step's first
``feed`` sends the queue, followed by the proposal's nodes (the target, all at once) or by nothing (a drafter, which
then feeds its drafts level by level). ``commit`` ends the step: the cache keeps the queue's real tokens and the fed
nodes on the accepted path that were emitted (``KVCache.keep``, the one rollback), and the queue becomes what was
emitted but not fed. The owner of a context (the decode loop for the target, a drafter for its model) touches the
cache through nothing else.
"""

from __future__ import annotations

import torch

from specdec.cache import KVCache, TreeFeed, adopted
from specdec.layout import VerifyLayout
from specdec.types import HostSync


class CachedContext:
    """A KV cache and its queue (see the module docstring). ``prompt`` [B, T] is queued whole; ``prompt_mask``
    [B, T] marks its left padding, or is None for a prompt without any."""

    def __init__(self, cache: KVCache, prompt: torch.Tensor, prompt_mask: torch.Tensor | None):
        self.cache = cache
        self.queue = prompt  # [B, m]
        self.queue_valid = prompt_mask  # [B, m] 0 for holes; None: every queued token is real
        self.queue_owned = False  # the queue is the caller's prompt: never written in place
        self.prefill = True  # the first feed's width follows the prompt: eager
        self.start_step()

    def start_step(self) -> None:
        self.queue_fed = 0  # queued tokens fed this step (the whole queue, at the step's first feed)
        self.queue_count: torch.Tensor | None = None  # [B] real tokens among them
        self.fed_nodes = 0  # proposal nodes fed this step

    def feed(self, nodes: torch.Tensor | None = None, layout: VerifyLayout | None = None,
             active: torch.Tensor | None = None, num_logits: int = 1) -> torch.Tensor:
        """Feed the queue if this step has not yet, then ``nodes`` [B, n]: the next n of ``layout``'s positions,
        holes in rows where ``active`` [B] is False (None: every row generates). Returns the [B, num_logits, V]
        logits of the last columns fed."""
        parts, valid_parts = [], []
        if not self.queue_fed:
            parts.append(self.queue)
            valid_parts.append(self.queue_valid)
        if nodes is not None:
            parts.append(nodes)
            valid_parts.append(None if active is None else active.long().unsqueeze(1).expand_as(nodes))
        tokens = torch.cat(parts, 1) if len(parts) > 1 else parts[0]  # [B, n]
        valid = self.combine_valid(parts, valid_parts)
        tree = None if layout is None or layout.causal else self.tree_feed(layout, nodes.shape[1])
        n = tokens.shape[1]
        columns = torch.arange(n - num_logits, n, device=tokens.device)  # [num_logits]
        logits = self.cache.feed(tokens, valid, tree, columns, prefill=self.prefill)
        self.prefill = False
        if not self.queue_fed:
            self.queue_fed = self.queue.shape[1]
            self.queue_count = self.queue.new_full(self.queue.shape[:1], self.queue_fed) \
                if self.queue_valid is None else self.queue_valid.sum(-1)
        self.fed_nodes += 0 if nodes is None else nodes.shape[1]
        return logits

    @staticmethod
    def combine_valid(parts: list[torch.Tensor], valid_parts: list[torch.Tensor | None]) -> torch.Tensor | None:
        """[B, n] the validity of the concatenated parts, None where every part is all real."""
        if all(valid is None for valid in valid_parts):
            return None
        filled = [torch.ones_like(part) if valid is None else valid.long() for part, valid in zip(parts, valid_parts)]
        return torch.cat(filled, 1)

    def tree_feed(self, layout: VerifyLayout, num_nodes: int) -> TreeFeed:
        """Where a tree's next ``num_nodes`` nodes (and the queue, at the step's first feed) sit in the region:
        queued tokens run causally; a node sits its depth after the root (the queue's last real token) and attends
        the queue and its ancestors. A layout with a tree per row gives [B, n] offsets and a [B, n, R] attend."""
        device = self.queue.device
        first = self.fed_nodes  # nodes fed before this feed
        node_attend = layout.node_attention(device)[..., first : first + num_nodes, : first + num_nodes]  # [(B,) n, n']
        queue_width = self.queue_fed or self.queue.shape[1]
        queue_seen = node_attend.new_ones(*node_attend.shape[:-1], queue_width)  # [(B,) n, m]
        node_rows = torch.cat([queue_seen, node_attend], -1)  # [(B,) n, R]
        node_offsets = layout.node_offsets(device)[..., first : first + num_nodes]  # [(B,) n]
        if self.queue_fed:
            root = (self.queue_count - 1).unsqueeze(1)  # [B, 1]
            return TreeFeed(root + node_offsets, node_rows)
        valid = self.queue_valid if self.queue_valid is not None else torch.ones_like(self.queue)
        queue_offsets = valid.cumsum(-1) - 1  # [B, m] ranks among the real queued tokens
        root = queue_offsets[:, -1:]  # [B, 1]; left padding keeps the last queued token real
        offsets = torch.cat([queue_offsets, root + node_offsets], 1)  # [B, m + n]
        queue_rows = torch.ones(queue_width, queue_width, dtype=torch.bool, device=device).tril()  # [m, m]
        queue_rows = torch.cat([queue_rows, queue_rows.new_zeros(queue_width, num_nodes)], 1)  # [m, R]
        queue_rows = queue_rows.expand(*node_rows.shape[:-2], -1, -1)  # [(B,) m, R]
        return TreeFeed(offsets, torch.cat([queue_rows, node_rows], -2))

    def commit(self, layout: VerifyLayout, path: torch.Tensor, num_new: torch.Tensor, next_token: torch.Tensor,
               proposed: torch.Tensor, active_after: torch.Tensor, host: HostSync | None) -> None:
        """End the step. ``num_new`` [B]: tokens each row emitted (its kept proposals, then ``next_token`` [B]);
        ``path`` [B, d] the accepted path in ``proposed`` [B, N]; ``active_after`` [B] bool the rows still
        generating. ``host``: the step's host copies where the loop read them (they let the cache crop and the
        queue stay one token wide), None on a step that reads nothing."""
        next_token = next_token.unsqueeze(1)  # [B, 1]
        next_valid = None if host is not None and host.num_active == active_after.shape[0] else \
            active_after.long().unsqueeze(1)  # [B, 1]
        if not self.queue_fed:  # nothing fed this step: the new token joins the queue
            valid = self.combine_valid([self.queue, next_token], [self.queue_valid, next_valid])
            self.replace_queue(torch.cat([self.queue, next_token], 1), valid, in_place=False)
            return
        emitted_drafts = (num_new - 1).clamp_min(0)  # [B]
        kept_nodes = layout.kept_nodes(path, emitted_drafts, self.fed_nodes)  # [B, fed]
        kept = torch.cat([kept_nodes.new_ones(kept_nodes.shape[0], self.queue_fed), kept_nodes], 1)  # [B, R]
        prefix = layout.causal or not self.fed_nodes  # kept nodes a prefix of the fed ones (or none fed)
        max_kept = None
        if host is not None and prefix:
            max_kept = self.queue_fed + min(max(host.max_new - 1, 0), self.fed_nodes)
        self.cache.keep(kept, prefix=prefix, max_kept=max_kept)
        queue, queue_valid = next_token, next_valid
        last_unfed = self.fed_nodes < layout.num_nodes  # the proposal's last level was never fed
        if last_unfed and (host is None or host.max_new - 1 >= layout.depth):
            whole_path = emitted_drafts == layout.depth  # [B] rows that emitted the unfed last node
            last = layout.path_tokens(proposed, path)[:, -1:]  # [B, 1]
            last_valid = None if host is not None and host.min_new - 1 >= layout.depth and next_valid is None \
                else (whole_path & active_after).long().unsqueeze(1)  # [B, 1]
            queue = torch.cat([last, next_token], 1)  # [B, 2]
            queue_valid = self.combine_valid([last, next_token], [last_valid, next_valid])
        self.replace_queue(queue, queue_valid, in_place=host is None)
        self.start_step()

    def replace_queue(self, queue: torch.Tensor, valid: torch.Tensor | None, in_place: bool) -> None:
        """The new queue; ``in_place`` (a step that reads nothing back, and may be replayed) writes it into the
        queue's own tensors where their shapes allow, so a replayed step reads what the last one wrote."""
        fits = (self.queue_owned and self.queue.shape == queue.shape and valid is not None
                and self.queue_valid is not None and self.queue_valid.shape == valid.shape)
        if in_place and fits:
            self.queue.copy_(queue)
            self.queue_valid.copy_(valid)
            return
        self.queue, self.queue_valid, self.queue_owned = queue, valid, True

    def device_state(self) -> dict[str, torch.Tensor]:
        """The queue and the cache's device state, by name (``specdec.device_loop``; lean caches)."""
        state = {"queue": self.queue, **{f"cache.{name}": t for name, t in self.cache.device_state().items()}}
        if self.queue_valid is not None:
            state["queue_valid"] = self.queue_valid
        return state

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors (a kept capture's), holding this context's values."""
        self.queue = adopted(state["queue"], self.queue)
        if self.queue_valid is not None:
            self.queue_valid = adopted(state["queue_valid"], self.queue_valid)
        self.queue_owned = True
        self.cache.adopt_device_state({name.removeprefix("cache."): t for name, t in state.items()
                                       if name.startswith("cache.")})

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] (between steps)."""
        self.cache.select_rows(index)
        self.queue = self.queue[index]
        self.queue_valid = None if self.queue_valid is None else self.queue_valid[index]

    def keep_prefix(self, num_kept: torch.Tensor, max_kept: int, queue: torch.Tensor,
                    queue_valid: torch.Tensor | None) -> None:
        """End the step of a context re-encoded from text (``specdec.cross_tokenizer``): each row keeps the first
        ``num_kept`` [B] real tokens it fed this step (its queued ones, which end the queue after its left
        padding, then its nodes, all real in a row that keeps any), and the queue becomes ``queue`` [B, m]
        (``queue_valid`` [B, m] 0 on left padding, None where all is real) in place of what was queued.
        ``max_kept`` (host): no row keeps a fed column at or past it."""
        fed = self.queue_fed + self.fed_nodes
        if fed:
            first_real = (self.queue_fed - self.queue_count).unsqueeze(1)  # [B, 1] after the queue's left padding
            columns = torch.arange(fed, device=num_kept.device)  # [R]
            kept = (columns >= first_real) & (columns < first_real + num_kept.unsqueeze(1))  # [B, R]
            self.cache.keep(kept, prefix=True, max_kept=max_kept)
        self.replace_queue(queue, queue_valid, in_place=False)
        self.start_step()
