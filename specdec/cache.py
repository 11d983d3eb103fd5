"""A model's KV cache and the mask that says which of its slots hold committed tokens.

Rows of a batch accept different numbers of drafts, but a Hugging Face cache has one length for all rows. So
rollback is masking: rejected slots stay in the cache as holes (attention mask 0) and positions are counted from
the mask, so the model sees exactly the committed tokens of each row. Slots rejected by *every* row are cropped
off the tail, so batch size 1 never keeps a hole. Left padding of ragged prompts is the same kind of hole. When
holes outnumber the committed slots of the fullest row, ``compact`` gathers every row's committed slots together.

Two layouts, same behaviour: ``dynamic`` (a ``DynamicCache`` that grows by concatenation) and ``static`` (a
preallocated ``StaticCache`` written in place, whose tensors keep their addresses, for CUDA graphs / compile;
rollback moves its write pointer back).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, StaticCache

CACHE_LAYOUTS = ("dynamic", "static")
STATIC_CACHE_SLACK = 64  # spare static slots, so compaction is rare


class KVCache:
    """One model's cache; its owner feeds tokens through ``forward`` and rolls back through ``keep``."""

    def __init__(
        self,
        model: torch.nn.Module,
        batch_size: int,
        device: torch.device,
        label: str,
        layout: str = "dynamic",
        capacity: int | None = None,
    ):
        """``capacity`` (static layout only) is the number of slots to preallocate."""
        if layout not in CACHE_LAYOUTS:
            raise ValueError(f"unknown cache layout {layout!r}; known layouts: {', '.join(CACHE_LAYOUTS)}")
        self.model = model
        self.label = label  # names the model in errors
        self.static = layout == "static"
        if self.static:
            self.past = StaticCache(config=model.config, max_cache_len=capacity)
            self.capacity = capacity
        else:
            self.past = DynamicCache(config=model.config)
        width = capacity if self.static else 0
        self.mask = torch.zeros(batch_size, width, dtype=torch.long, device=device)  # [B, S] 1 = committed slot
        self.num_slots = 0  # slots written so far; the static mask is zero past them
        self.next_hole_check = 64  # dynamic layout: slot count at which to look for piled-up holes again
        self.body = getattr(model, "base_model", model)  # transformers' models: the layers without the LM head

    def prefill(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> None:
        """Feed [B, n] tokens whose logits nobody needs: the model's body (``base_model``) fills the cache and the
        [B, n, V] head projection is skipped. (``logits_to_keep=1`` would keep one position, but for B > 1 its
        strided slice sends the head through a batched matmul that copies the head's weight per row.)"""
        self.feed(self.body, input_ids, input_mask)

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
        """Feed [B, n] tokens (input_mask 0 marks holes) and return their [B, n, V] logits.

        The new slots count as committed until ``keep`` says otherwise.
        """
        return self.feed(self.model, input_ids, input_mask).logits

    def feed(self, module: torch.nn.Module, input_ids: torch.Tensor, input_mask: torch.Tensor):
        """Run ``module`` (the model or its body) on [B, n] tokens over the cache; returns its output."""
        n = input_ids.shape[1]
        if self.static and self.num_slots + n > self.capacity:
            self.compact()
            if self.num_slots + n > self.capacity:
                raise ValueError(f"the {self.label} static cache of {self.capacity} slots cannot take {n} more")
        positions = self.mask.sum(-1, keepdim=True) + input_mask.cumsum(-1) - 1  # [B, n]
        if self.static:  # told where to write; a dynamic cache appends
            slots = torch.arange(self.num_slots, self.num_slots + n, device=input_ids.device)  # [n]
            self.mask[:, slots] = input_mask.long()
            where = {"cache_position": slots}
        else:
            self.mask = torch.cat([self.mask, input_mask.long()], dim=1)
            where = {}
        self.num_slots += n
        return module(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions.clamp_min(0),
            past_key_values=self.past,
            use_cache=True,
            **where,
        )

    def keep(self, num_kept: torch.Tensor, num_last: int, max_kept: int, min_kept: int = 0) -> None:
        """Of the last ``num_last`` slots keep the first ``num_kept`` [B] of each row; the rest become holes.

        ``max_kept`` and ``min_kept`` bound ``num_kept`` over the rows that fed tokens (host ints; rows that fed
        holes may hold anything). Slots past ``max_kept`` are cropped from the cache; with ``min_kept ==
        num_last`` no row rejected anything and the mask stays as it is.
        """
        if min_kept >= num_last:
            return
        start = self.num_slots - num_last
        slot = torch.arange(num_last, device=self.mask.device)  # [num_last]
        kept = (slot < num_kept.unsqueeze(1)).long()  # [B, num_last]
        self.mask[:, start : self.num_slots] *= kept
        self.crop_tail(num_last - max_kept)
        if not self.static and self.num_slots >= self.next_hole_check:
            self.compact_if_mostly_holes()

    def select_rows(self, index: torch.Tensor) -> None:
        """Keep only the batch rows ``index`` [B'] (rows that finished leave the batch). Dynamic layout only: the
        static one keeps its tensors, addresses and batch size."""
        if self.static:
            raise ValueError(f"the {self.label} static cache keeps its batch rows; use the dynamic layout")
        self.past.batch_select_indices(index)
        self.mask = self.mask[index]

    def compact_if_mostly_holes(self) -> None:
        """Compact when holes outnumber the fullest row's committed slots (a host sync every ~S/2 slots)."""
        if self.num_slots > 2 * int(self.mask.sum(-1).max()):
            self.compact()
        self.next_hole_check = self.num_slots + max(64, self.num_slots // 2)

    def crop_tail(self, num_slots: int) -> None:
        """Forget the last ``num_slots`` slots (already holes in every row)."""
        if num_slots <= 0:
            return
        self.num_slots -= num_slots
        if self.static:
            for layer in self.past.layers:
                layer.cumulative_length.sub_(num_slots)  # the next write overwrites the stale slots
        else:
            self.past.crop(-num_slots)  # transformers 5.x: a negative count of slots to remove
            self.mask = self.mask[:, : self.num_slots]

    def compact(self) -> None:
        """Gather each row's committed slots, in order, to the end of the first ``max committed`` slots."""
        committed = self.mask[:, : self.num_slots].bool()  # [B, S]
        length = int(committed.sum(-1).max())
        # A stable sort puts holes first and keeps committed slots in order: rows end up left-padded.
        order = committed.long().sort(dim=-1, stable=True).indices[:, self.num_slots - length :]  # [B, L]
        for layer in self.past.layers:
            for name in ("keys", "values"):
                states = getattr(layer, name)  # [B, H, S, D]
                index = order[:, None, :, None].expand(-1, states.shape[1], -1, states.shape[3])
                gathered = states.gather(2, index)  # [B, H, L, D]
                if self.static:
                    states[:, :, :length] = gathered  # in place: static tensors keep their addresses
                else:
                    setattr(layer, name, gathered)
            if self.static:
                layer.cumulative_length.fill_(length)
        new_mask = committed.gather(1, order).long()  # [B, L]
        if self.static:
            self.mask.zero_()
            self.mask[:, :length] = new_mask
        else:
            self.mask = new_mask
        self.num_slots = length


def context_limit(model: torch.nn.Module) -> int | None:
    """Largest number of positions the model can attend over, if its config says."""
    config = model.config
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def static_capacity(model: torch.nn.Module, prompt_width: int) -> int:
    """Slots to preallocate: the context limit, plus room for the prompt's padding and one step's rejected drafts
    before ``KVCache.compact`` has to run."""
    limit = context_limit(model)
    if limit is None:
        raise ValueError(f"a static cache needs a context limit; {type(model).__name__}'s config gives none")
    return limit + prompt_width + STATIC_CACHE_SLACK
