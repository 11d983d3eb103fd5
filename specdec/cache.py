"""A model's KV cache and the mask that says which of its slots hold committed tokens.

Rows of a batch accept different numbers of drafts, but a Hugging Face cache has one length for all rows. So
rollback is masking: rejected slots stay in the cache as holes (attention mask 0) and positions are counted from
the mask, so the model sees exactly the committed tokens of each row. Slots rejected by *every* row are cropped
off the tail, so batch size 1 never keeps a hole. Left padding of ragged prompts is the same kind of hole.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or inf logits: continuing would emit a meaningless token."""


class KVCache:
    """One model's cache; its owner feeds tokens through ``forward`` and rolls back through ``keep``."""

    def __init__(self, model: torch.nn.Module, batch_size: int, device: torch.device, label: str):
        self.model = model
        self.label = label  # names the model in errors
        self.past = DynamicCache(config=model.config)
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, S] 1 = committed slot

    @property
    def num_slots(self) -> int:
        return self.mask.shape[1]

    def forward(self, input_ids: torch.Tensor, input_mask: torch.Tensor) -> torch.Tensor:
        """Feed [B, n] tokens (input_mask 0 marks holes) and return their [B, n, V] logits.

        The new slots count as committed until ``keep`` says otherwise.
        """
        positions = self.mask.sum(-1, keepdim=True) + input_mask.cumsum(-1) - 1  # [B, n]
        self.mask = torch.cat([self.mask, input_mask.long()], dim=1)
        out = self.model(
            input_ids=input_ids,
            attention_mask=self.mask,
            position_ids=positions.clamp_min(0),
            past_key_values=self.past,
            use_cache=True,
        )
        return out.logits

    def keep(self, num_kept: torch.Tensor, num_last: int, max_kept: int) -> None:
        """Of the last ``num_last`` slots keep the first ``num_kept`` [B] of each row; the rest become holes.

        ``max_kept`` is ``num_kept.max()`` already on the host; slots past it are cropped from the cache.
        """
        if num_last == 0:
            return
        slot = torch.arange(num_last, device=self.mask.device)  # [num_last]
        kept = (slot < num_kept.unsqueeze(1)).long()  # [B, num_last]
        self.mask = torch.cat([self.mask[:, :-num_last], self.mask[:, -num_last:] * kept], dim=1)
        self._crop_tail(num_last - max_kept)

    def _crop_tail(self, num_slots: int) -> None:
        if num_slots <= 0:
            return
        self.past.crop(-num_slots)  # transformers 5.x: a negative count of slots to remove
        self.mask = self.mask[:, :-num_slots]

