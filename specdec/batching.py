"""Batching token-id prompts of different lengths into the left-padded [B, T] tensors ``generate`` takes."""

from __future__ import annotations

import torch

from specdec.checks import as_integer, described, token_ids


def left_pad(prompts: list[list[int]], pad_id: int = 0, device: torch.device | str | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, T] input ids and attention mask for prompts of token ids, each row padded on the left with ``pad_id``
    (mask 0) up to the longest prompt. Padding is never fed as a token, so any id will do."""
    rows = check_prompt_lists(prompts)
    if as_integer(pad_id) is None:
        raise TypeError(f"pad_id must be a token id (an integer), got {described(pad_id)}")
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in rows], dtype=torch.long, device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in rows], dtype=torch.long, device=device)
    return ids, mask


def check_prompt_lists(prompts: object) -> list[list[int]]:
    """``prompts`` as lists of Python ints: a non-empty list of non-empty sequences of token ids."""
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__") or not hasattr(prompts, "__iter__"):
        raise TypeError(f"prompts must be a list of prompts, each a list of token ids, got {described(prompts)}")
    if not len(prompts):
        raise ValueError("left_pad needs at least one prompt, got none")
    rows = []
    for i, prompt in enumerate(prompts):
        ids = token_ids(prompt) if hasattr(prompt, "__iter__") else None  # a bare id is no prompt
        if ids is None:
            empty = hasattr(prompt, "__len__") and not isinstance(prompt, (str, bytes)) and len(prompt) == 0
            raise ValueError(f"prompts[{i}] is empty: every prompt needs at least one token" if empty else
                             f"prompts[{i}] must be a list of token ids (integers), got {described(prompt)}")
        rows.append(ids)
    return rows
