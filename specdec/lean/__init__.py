"""A lean forward over a Hugging Face model's own parameters and caller-owned per-row KV buffers.

    from specdec.lean import lean_forward, lean_support
    forward = lean_forward(model)  # None when unsupported; lean_support(model) says why
    keys, values = forward.new_buffers(batch_size, capacity)
    logits = forward(input_ids, positions, write_slots, attend, keys, values, logit_columns)

Supported exactly: ``GPT2LMHeadModel``, ``LlamaForCausalLM`` (SmolLM too) and ``Qwen2ForCausalLM`` with full
attention. Everything else keeps transformers' forward, the general path and the reference.
"""

from __future__ import annotations

import torch
from transformers import GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM

from specdec.lean.base import LeanForward
from specdec.lean.gpt2 import GPT2Forward, gpt2_unsupported
from specdec.lean.llama import LlamaForward, llama_unsupported

# exact model class -> (its lean forward, why a configuration of it is not supported)
FAMILIES = {
    GPT2LMHeadModel: (GPT2Forward, gpt2_unsupported),
    LlamaForCausalLM: (LlamaForward, llama_unsupported),
    Qwen2ForCausalLM: (LlamaForward, llama_unsupported),
}

__all__ = ["LeanForward", "lean_forward", "lean_support"]


def lean_support(model: torch.nn.Module) -> str | None:
    """None when ``lean_forward(model)`` computes exactly what the model's own forward does; else the reason not."""
    family = FAMILIES.get(type(model))
    if family is None:
        supported = ", ".join(cls.__name__ for cls in FAMILIES)
        return f"{type(model).__name__} has no lean forward (supported: {supported})"
    if model.training:
        return f"{type(model).__name__} is in training mode: the lean forward applies no dropout (call model.eval())"
    return family[1](model)


def lean_forward(model: torch.nn.Module) -> LeanForward | None:
    """The lean forward over ``model``'s own Parameters, or None when it is not supported (never raises)."""
    if lean_support(model) is not None:
        return None
    return FAMILIES[type(model)][0](model)
