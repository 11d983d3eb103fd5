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
from specdec.types import ModelOutput, StepOutcome


class CachedContext:
    """A KV cache and its queue (see the module docstring). ``prompt`` [B, T] is queued whole; ``prompt_mask``
    [B, T] marks its left padding, or is None for a prompt without any; ``prompt_features`` [B, T, F], for a model
    that reads features beside its tokens."""

    def __init__(self, cache: KVCache, prompt: torch.Tensor, prompt_mask: torch.Tensor | None,
                 prompt_features: torch.Tensor | None = None):
        self.cache = cache
        self.queue = prompt  # [B, m]
        self.queue_valid = prompt_mask  # [B, m] 0 for holes; None: every queued token is real
        self.queue_features = prompt_features  # [B, m, F] or None
        self.queue_owned = False  # the queue is the caller's prompt: never written in place
        self.prefill = True  # the first feed's width follows the prompt: eager
        self.fixed_shapes = False  # every step has the same shapes: the queue is rewritten in place (``fix_shapes``)
        self.start_step()

    def start_step(self) -> None:
        self.queue_fed = 0  # queued tokens fed this step (the whole queue, at the step's first feed)
        self.queue_count: torch.Tensor | None = None  # [B] real tokens among them
        self.fed_nodes = 0  # proposal nodes fed this step

    def fix_shapes(self, slots: int) -> None:
        """Make room for ``slots`` cache slots and keep every later step's shapes fixed, the queue's included, so a
        captured step replays over the same tensors (``specdec.device_loop``)."""
        self.cache.fix_shapes(slots)
        self.fixed_shapes = True

    def feed(self, nodes: torch.Tensor | None = None, layout: VerifyLayout | None = None,
             active: torch.Tensor | None = None, num_logits: int = 1, node_features: torch.Tensor | None = None,
             hidden_layers: tuple[int, ...] = ()) -> ModelOutput:
        """Feed the queue if this step has not yet, then ``nodes`` [B, n]: the next n of ``layout``'s positions,
        holes in rows where ``active`` [B] is False (None: every row generates), with ``node_features`` [B, n, F]
        where the context carries features. Returns the [B, num_logits, V] logits of the last columns fed, and the
        ``hidden_layers`` asked for at every column fed (``ModelOutput``)."""
        parts, valid_parts, feature_parts = [], [], []
        if not self.queue_fed:
            parts.append(self.queue)
            valid_parts.append(self.queue_valid)
            feature_parts.append(self.queue_features)
        if nodes is not None:
            parts.append(nodes)
            valid_parts.append(None if active is None else active.long().unsqueeze(1).expand_as(nodes))
            feature_parts.append(node_features)
        tokens = torch.cat(parts, 1) if len(parts) > 1 else parts[0]  # [B, n]
        valid = self.combine_valid(parts, valid_parts)
        features = None if self.queue_features is None else torch.cat(feature_parts, 1)  # [B, n, F]
        tree = None if layout is None or layout.causal else self.tree_feed(layout, nodes.shape[1])
        n = tokens.shape[1]
        columns = torch.arange(n - num_logits, n, device=tokens.device)  # [num_logits]
        output = self.cache.feed(tokens, valid, tree, columns, prefill=self.prefill, hidden_layers=hidden_layers,
                                 features=features)
        self.prefill = False
        if not self.queue_fed:
            self.queue_fed = self.queue.shape[1]
            self.queue_count = self.queue.new_full(self.queue.shape[:1], self.queue_fed) \
                if self.queue_valid is None else self.queue_valid.sum(-1)
        self.fed_nodes += 0 if nodes is None else nodes.shape[1]
        return output

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

    def commit(self, outcome: StepOutcome) -> None:
        """End the step from its outcome: the cache keeps the queue's real tokens and the fed nodes on the accepted
        path that were emitted; the queue becomes the emitted tokens it has not seen (the next token, and the
        proposal's last token where it was emitted but never fed). A context fed nothing this step queues the next
        token behind what it had queued."""
        next_token = outcome.next_token.unsqueeze(1)  # [B, 1]
        next_valid = None if outcome.all_active_after else outcome.active_after.long().unsqueeze(1)  # [B, 1]
        if not self.queue_fed:
            queue = torch.cat([self.queue, next_token], 1)
            valid = self.combine_valid([self.queue, next_token], [self.queue_valid, next_valid])
            self.keep(next_token.new_zeros(next_token.shape[0], 0, dtype=torch.bool), True, None, queue, valid)
            return
        layout = outcome.layout
        emitted_drafts = (outcome.num_new - 1).clamp_min(0)  # [B]
        kept_nodes = layout.kept_nodes(outcome.path, emitted_drafts, self.fed_nodes)  # [B, fed]
        kept = torch.cat([kept_nodes.new_ones(kept_nodes.shape[0], self.queue_fed), kept_nodes], 1)  # [B, R]
        prefix = layout.causal or not self.fed_nodes  # kept nodes a prefix of the fed ones (or none fed)
        max_kept = self.queue_fed + min(outcome.most_drafts_emitted, self.fed_nodes) if prefix else None
        queue, queue_valid = next_token, next_valid
        if self.fed_nodes < layout.num_nodes and outcome.most_drafts_emitted >= layout.depth:
            # The proposal's last level was never fed, and some row emitted its node: queue it before the next token.
            last = outcome.new_tokens[:, layout.depth - 1 : layout.depth]  # [B, 1] the path's last token where emitted
            every_row = outcome.fewest_drafts_emitted >= layout.depth and next_valid is None
            last_valid = None if every_row else \
                ((emitted_drafts == layout.depth) & outcome.active_after).long().unsqueeze(1)  # [B, 1]
            queue = torch.cat([last, next_token], 1)  # [B, 2]
            queue_valid = self.combine_valid([last, next_token], [last_valid, next_valid])
        self.keep(kept, prefix, max_kept, queue, queue_valid)

    def kept_prefix(self, num_kept: torch.Tensor) -> torch.Tensor:
        """[B, R] the slots fed this step that keep each row's first ``num_kept`` [B] real tokens (its queued ones,
        which end the queue after its left padding, then its nodes, all real in a row that keeps any)."""
        fed = self.queue_fed + self.fed_nodes
        if not fed:
            return num_kept.new_zeros(num_kept.shape[0], 0, dtype=torch.bool)
        first_real = (self.queue_fed - self.queue_count).unsqueeze(1)  # [B, 1] after the queue's left padding
        columns = torch.arange(fed, device=num_kept.device)  # [R]
        return (columns >= first_real) & (columns < first_real + num_kept.unsqueeze(1))  # [B, R]

    def keep(self, kept: torch.Tensor, prefix: bool, max_kept: int | None, queue: torch.Tensor,
             queue_valid: torch.Tensor | None, queue_features: torch.Tensor | None = None) -> None:
        """End the step, the one rollback: of the slots fed this step, the cache keeps those where ``kept`` [B, R]
        holds (``prefix``: each row's first valid ones; ``max_kept``, a host bound: none at or past this column);
        the queue becomes ``queue`` [B, m] (``queue_valid`` [B, m] 0 on left padding, None where all is real;
        ``queue_features`` [B, m, F] where the context carries features)."""
        if kept.shape[1]:
            self.cache.keep(kept, prefix=prefix, max_kept=max_kept)
        self.replace_queue(queue, queue_valid, queue_features)
        self.start_step()

    def replace_queue(self, queue: torch.Tensor, valid: torch.Tensor | None,
                      features: torch.Tensor | None) -> None:
        """The new queue; with fixed shapes it is written into the queue's own tensors where their shapes allow, so
        a replayed step reads what the last one wrote (tensors the step made, such as its next token, are never
        written: a drafter may keep them)."""
        if self.fixed_shapes and self.fits(queue, valid, features):
            self.queue.copy_(queue)
            self.queue_valid.copy_(valid)
            if features is not None:
                self.queue_features.copy_(features)
            return
        if self.fixed_shapes:  # later steps write into these: they must be the context's own, not views of the step's
            queue, valid, features = (None if t is None else t.clone() for t in (queue, valid, features))
        self.queue, self.queue_valid, self.queue_features, self.queue_owned = queue, valid, features, True

    def fits(self, queue: torch.Tensor, valid: torch.Tensor | None, features: torch.Tensor | None) -> bool:
        """Whether the new queue can be written into the current one's tensors."""
        same = self.queue_owned and self.queue.shape == queue.shape and valid is not None \
            and self.queue_valid is not None and self.queue_valid.shape == valid.shape
        if features is None or self.queue_features is None:
            return same and features is None and self.queue_features is None
        return same and self.queue_features.shape == features.shape

    def device_state(self) -> dict[str, torch.Tensor]:
        """The queue and the cache's device state, by name (``specdec.device_loop``; lean caches)."""
        state = {"queue": self.queue, **{f"cache.{name}": t for name, t in self.cache.device_state().items()}}
        if self.queue_valid is not None:
            state["queue_valid"] = self.queue_valid
        if self.queue_features is not None:
            state["queue_features"] = self.queue_features
        return state

    def adopt_device_state(self, state: dict[str, torch.Tensor]) -> None:
        """Continue in ``state``'s tensors (a kept capture's), holding this context's values."""
        self.queue = adopted(state["queue"], self.queue)
        if self.queue_valid is not None:
            self.queue_valid = adopted(state["queue_valid"], self.queue_valid)
        if self.queue_features is not None:
            self.queue_features = adopted(state["queue_features"], self.queue_features)
        self.queue_owned = True
        self.cache.adopt_device_state({name.removeprefix("cache."): t for name, t in state.items()
                                       if name.startswith("cache.")})

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] (between steps)."""
        self.cache.select_rows(index)
        self.queue = self.queue[index]
        self.queue_valid = None if self.queue_valid is None else self.queue_valid[index]
        self.queue_features = None if self.queue_features is None else self.queue_features[index]
