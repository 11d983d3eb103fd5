"""Batching token-id prompts of different lengths into the left-padded [B, T] tensors ``generate`` takes."""

from __future__ import annotations

import torch


def left_pad(prompts: list[list[int]], pad_id: int = 0, device: torch.device | str | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] input ids and attention mask for prompts of token ids, each row padded on the left with ``pad_id``
    (mask 0) up to the longest prompt. Padding is never fed as a token, so any id will do."""
    if not prompts:
        raise ValueError("left_pad needs at least one prompt, got none")
    width = max(map(len, prompts))
    ids = torch.tensor([[pad_id] * (width - len(p)) + list(p) for p in prompts], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long, device=device)
    return ids, mask
