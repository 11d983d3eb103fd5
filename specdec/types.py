"""Shared types and the notation used across specdec.

Notation (Leviathan et al. 2023): ``p`` is the **target** distribution, ``q`` the **draft** distribution.
Code spells them out as ``target_probs`` and ``draft_probs``.

Shapes: ``B`` batch rows, ``k`` draft tokens proposed this step, ``V`` vocabulary size.
A step feeds the target ``k + 1`` tokens (the last emitted token and the ``k`` drafts) and gets ``k + 1``
distributions: position ``i < k`` verifies draft token ``i``; position ``k`` gives the bonus token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Proposal:
    """What a drafter proposes for one step."""

    tokens: torch.Tensor  # [B, k] long
    probs: torch.Tensor | None  # [B, k, V] draft distributions q, or None for point masses q = onehot(tokens)
    # (n-gram drafts; model drafts at temperature 0)
    finite: torch.Tensor | None = None  # [] bool: False if draft logits were unusable (``sampling.usable``);
    # checked at the step sync


@dataclass(frozen=True)
class Verdict:
    """What an acceptance strategy decides for one step."""

    num_accepted: torch.Tensor  # [B] long in [0, k]: leading draft tokens kept
    next_token: torch.Tensor  # [B] long: the token emitted after the kept drafts (correction or bonus)


@dataclass(frozen=True)
class StepOutcome:
    """What one step decided, for drafters and policies to learn from (``Drafter.commit``, ``observe``)."""

    k: int  # drafts proposed this step
    num_accepted: torch.Tensor  # [B] drafts kept per row
    next_token: torch.Tensor  # [B] token emitted after the kept drafts
    new_tokens: torch.Tensor  # [B, k+1] kept drafts then next_token; only the first num_new are real
    num_new: torch.Tensor  # [B] tokens emitted this step (0 for rows already finished)
    active: torch.Tensor  # [B] bool, rows still generating during this step
    active_after: torch.Tensor  # [B] bool, rows still generating after it (the others leave the batch or feed holes)
    max_accepted: int  # host copies over active rows
    min_accepted: int
    draft_seconds: float
    target_seconds: float
