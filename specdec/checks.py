"""Argument checks of the library, in one place: each names the argument, the value and what is allowed, and runs
before any forward pass (a bad id on a GPU is a device-side assert that kills the CUDA context).

Constructors call the value checks (``check_draft_length``, ``check_probability``, ...), so a config that builds
is a config that runs; ``Decoder`` and ``generate`` call the rest on their arguments.
"""

from __future__ import annotations

import torch

from specdec.interfaces import Drafter, DraftLengthPolicy
from specdec.sampling import SamplingConfig


def check_draft_length(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return value


class NotANumberError(TypeError, ValueError):
    """A numeric setting given something else: a wrong type, and a bad value for callers that catch those (like
    numpy's AxisError, which is both a ValueError and an IndexError)."""


def check_number(name: str, value: object) -> None:
    """A real number (bool is not one, though Python says it is an int)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise NotANumberError(f"{name} must be a number, got {value!r} ({type(value).__name__})")


def check_probability(name: str, value: object, low_open: bool = False, high_open: bool = False) -> float:
    """A float in [0, 1] (ends excluded where asked)."""
    check_number(name, value)
    if not (0 < value if low_open else 0 <= value) or not (value < 1 if high_open else value <= 1):
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def check_positive(name: str, value: object, allow_zero: bool = False) -> float:
    check_number(name, value)
    if not (value >= 0 if allow_zero else value > 0):
        raise ValueError(f"{name} must be a number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def check_parts(drafter: object, draft_length: object, sampling: object) -> None:
    """Wrong objects fail here, naming the argument, rather than deep inside a step. (Strategies are checked by
    ``interfaces.as_strategy``, which also takes plain callables.)"""
    if not isinstance(drafter, Drafter):
        raise TypeError(f"drafter must be a specdec.Drafter (ModelDrafter, NGramDrafter, or a subclass), got {drafter!r}")
    if not isinstance(draft_length, DraftLengthPolicy):
        raise TypeError(f"draft_length must be a draft-length policy (specdec.FixedLength(4), ...), got {draft_length!r}")
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig, got {sampling!r}")


def check_eval_mode(model: torch.nn.Module) -> None:
    """A model in training mode runs dropout: every forward draws different tokens, silently."""
    if model.training:
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ValueError(f"model {name!r} is in training mode (dropout active); call model.eval() before decoding")


def check_seed(seed: object) -> None:
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")


def check_prompt(input_ids, attention_mask, limit: int | None, vocab_size: int | None = None) -> torch.Tensor:
    """Validate a [B, T] left-padded prompt batch (ids in [0, vocab_size) where it is known, checked before any
    forward: on a GPU an out-of-range id is a device-side assert that kills the CUDA context) and return its
    attention mask."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.LongTensor of shape [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"input_ids must hold integer token ids, got dtype {input_ids.dtype}")
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must have shape [B, T], got shape {tuple(input_ids.shape)}")
    if input_ids.numel() == 0:
        raise ValueError(f"empty prompt: input_ids has shape {tuple(input_ids.shape)}; need at least one token per row")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.shape != input_ids.shape:
        shape = tuple(attention_mask.shape) if isinstance(attention_mask, torch.Tensor) else type(attention_mask).__name__
        raise ValueError(f"attention_mask must have the shape of input_ids {tuple(input_ids.shape)}, got {shape}")
    if attention_mask.device != input_ids.device:
        raise ValueError(f"attention_mask is on {attention_mask.device} but input_ids on {input_ids.device}")
    if not bool(((attention_mask == 0) | (attention_mask == 1)).all()):
        bad = attention_mask[(attention_mask != 0) & (attention_mask != 1)].flatten()[0].item()
        raise ValueError(f"attention_mask must hold only 0 (padding) and 1 (token), got {bad!r}")
    attention_mask = attention_mask.long()
    if bool((attention_mask.diff(dim=-1) < 0).any()):
        raise ValueError("attention_mask must be left-padded (zeros before ones in every row); got right padding")
    lengths = attention_mask.sum(-1)
    if bool((lengths == 0).any()):
        rows = (lengths == 0).nonzero().flatten().tolist()
        raise ValueError(f"empty prompt in batch rows {rows}: every row needs at least one token")
    if vocab_size is not None:
        real = input_ids[attention_mask.bool()]  # padding may hold anything: it is never fed as a token
        if bool(((real < 0) | (real >= vocab_size)).any()):
            bad = real[(real < 0) | (real >= vocab_size)][0].item()
            raise ValueError(f"input_ids holds token id {bad}, outside the target's vocabulary [0, {vocab_size})")
    if limit is not None and int(lengths.max()) >= limit:
        raise ValueError(
            f"prompt of {int(lengths.max())} tokens is at or beyond the context limit of {limit} positions; "
            f"prompts must be shorter than {limit} tokens"
        )
    return attention_mask


def check_max_new_tokens(max_new_tokens: object) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")


def check_eos_ids(eos_token_id, device: torch.device, vocab_size: int | None = None) -> torch.Tensor | None:
    """[n] the EOS ids as a tensor on ``device``, or None without EOS."""
    if eos_token_id is None:
        return None
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise ValueError(f"eos_token_id must be a token id, a list of token ids, or None; got {eos_token_id!r}")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ValueError(f"eos_token_id {max(ids)} is outside the target's vocabulary [0, {vocab_size}): it could "
                         f"never be emitted")
    return torch.tensor(ids, dtype=torch.long, device=device)


def check_model(role: str, model: object) -> None:
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"{role} must be a transformers causal LM (torch.nn.Module with a config), got {type(model).__name__}")


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_device(name: str, tensor: object, target: torch.nn.Module) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.device != model_device(target):
        raise ValueError(f"{name} is on {tensor.device} but the target model on {model_device(target)}")
