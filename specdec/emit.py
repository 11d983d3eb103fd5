"""What a step emits and what a call returns, shared by the host loop (``specdec.decode``) and the device step
(``specdec.device_loop``): the tokens each row emits, the flags that stop a call, and the call's output."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.stats import DecodeStats, StepLog


class NonFiniteLogitsError(FloatingPointError):
    """A model produced NaN or inf logits: any token chosen from them would be meaningless."""


class StrategyVerdictError(ValueError):
    """A custom strategy returned a verdict out of range (drafts kept beyond those proposed, a token id outside the
    vocabulary, a path through nodes that do not exist)."""


@dataclass(frozen=True)
class GenerationOutput:
    tokens: list[list[int]]  # new tokens of each row, up to and including EOS
    stats: DecodeStats


def count_new(new_tokens: torch.Tensor, num_accepted: torch.Tensor, remaining: torch.Tensor,
              eos_ids: torch.Tensor | None, slot: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[B] tokens each row emits this step (kept drafts + 1, cut at EOS and the budget) and [B] whether none of
    them is EOS (None without EOS ids). new_tokens [B, d+1], slot = arange(d+1)."""
    num_new = torch.minimum(num_accepted + 1, remaining)  # [B], 0 for finished rows
    if eos_ids is None:
        return num_new, None
    first_eos = torch.where(torch.isin(new_tokens, eos_ids), slot, new_tokens.shape[1]).amin(-1)  # [B]
    return torch.minimum(num_new, first_eos + 1), first_eos >= num_new


def finish_call(output: torch.Tensor, emitted: torch.Tensor, log: StepLog, stats: DecodeStats) -> GenerationOutput:
    """The call's tokens (each row's first ``emitted`` [B] of ``output`` [B, W]) and its stats, with the rows'
    counts from the step log: the host reads of a call's end."""
    counts = emitted.tolist()
    tokens = [row[:count] for row, count in zip(output.tolist(), counts)]
    stats.rows, stats.expected_overlap_sum, stats.expected_overlap_count = log.row_stats(emitted)
    return GenerationOutput(tokens, stats)


def unpack(values: list, parts: dict[str, torch.Tensor]) -> dict[str, list]:
    """Split one copied list back into its named parts (each part's length is its tensor's)."""
    read, start = {}, 0
    for name, tensor in parts.items():
        read[name] = values[start : start + tensor.shape[0]]
        start += tensor.shape[0]
    return read


def check_flags(flags: dict[str, bool], strategy_name: str) -> None:
    """Refuse to go on from a step whose logits or verdict cannot be trusted."""
    if not flags.get("drafts_finite", True):
        raise NonFiniteLogitsError("the draft model produced NaN/inf logits; refusing to emit tokens from them")
    if not flags.get("target_usable", True):
        raise NonFiniteLogitsError("the target model produced NaN/inf logits; refusing to emit tokens from them")
    if not flags.get("verdict_in_range", True):
        raise StrategyVerdictError(f"strategy {strategy_name!r} returned a verdict out of range: num_accepted must "
                                   f"be in [0, drafted], next_token in the vocabulary, path within the proposal")
