"""The lean forward of the Llama family (``LlamaForCausalLM``, SmolLM, ``Qwen2ForCausalLM``): RMSNorm, rotary
positions from the model's own rotary module, grouped-query attention, SwiGLU MLP. Qwen2 differs only in its
q/k/v biases; every projection's bias is taken as the model has it (None where it has none)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import LlamaForCausalLM, Qwen2ForCausalLM
from transformers.activations import ACT2FN

from specdec.lean.base import LeanForward

# Every rope type transformers' rotary module builds is computed by that module (a model with another type fails
# to build). These two rescale by the batch's largest position: a host read, and rows would change each other.
BATCH_DEPENDENT_ROPE = ("dynamic", "longrope")


class LlamaLayer(NamedTuple):
    """One decoder layer's Parameters, the model's own objects; biases are None where the model has none."""
    input_norm: torch.nn.Parameter
    q_weight: torch.nn.Parameter  # [H*hd, D]
    q_bias: torch.nn.Parameter | None
    k_weight: torch.nn.Parameter  # [Hkv*hd, D]
    k_bias: torch.nn.Parameter | None
    v_weight: torch.nn.Parameter  # [Hkv*hd, D]
    v_bias: torch.nn.Parameter | None
    o_weight: torch.nn.Parameter  # [D, H*hd]
    o_bias: torch.nn.Parameter | None
    post_norm: torch.nn.Parameter
    gate_weight: torch.nn.Parameter  # [I, D]
    gate_bias: torch.nn.Parameter | None
    up_weight: torch.nn.Parameter  # [I, D]
    up_bias: torch.nn.Parameter | None
    down_weight: torch.nn.Parameter  # [D, I]
    down_bias: torch.nn.Parameter | None


def llama_unsupported(model: LlamaForCausalLM | Qwen2ForCausalLM) -> str | None:
    """Why the lean forward would not compute what transformers' Llama or Qwen2 computes, or None."""
    config, name = model.config, type(model).__name__
    if getattr(config, "use_sliding_window", False):
        return f"{name} with use_sliding_window=True: the lean forward has no sliding-window attention"
    other_layers = sorted(set(getattr(config, "layer_types", None) or ["full_attention"]) - {"full_attention"})
    if other_layers:
        return f"{name} with layer_types {other_layers}: the lean forward models full attention only"
    rotary = model.model.rotary_emb
    if rotary.rope_type in BATCH_DEPENDENT_ROPE:
        return f"{name} with rope type {rotary.rope_type!r}: its frequencies depend on the batch's largest position"
    head_dim = model.model.layers[0].self_attn.head_dim
    if 2 * rotary.inv_freq.numel() != head_dim:
        return f"{name} rotates {2 * rotary.inv_freq.numel()} of {head_dim} head dimensions (partial rotary)"
    return None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of [B, h, n, hd] by [B, 1, n, hd] cos/sin, halves rotated as transformers does."""
    first, second = x.chunk(2, dim=-1)  # [B, h, n, hd/2] each
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaForward(LeanForward):
    def __init__(self, model: LlamaForCausalLM | Qwen2ForCausalLM):
        config, body = model.config, model.model
        attention = body.layers[0].self_attn
        self.model = model
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = attention.head_dim
        self.vocab_size = model.lm_head.weight.shape[0]
        self.context_limit = config.max_position_embeddings  # rotary positions: the length it was trained for
        self.embedding = body.embed_tokens.weight  # [V, D]
        self.layers = [
            LlamaLayer(
                layer.input_layernorm.weight,
                *linear(layer.self_attn.q_proj), *linear(layer.self_attn.k_proj), *linear(layer.self_attn.v_proj),
                *linear(layer.self_attn.o_proj),
                layer.post_attention_layernorm.weight,
                *linear(layer.mlp.gate_proj), *linear(layer.mlp.up_proj), *linear(layer.mlp.down_proj),
            )
            for layer in body.layers[: self.num_layers]
        ]
        self.final_norm_weight = body.norm.weight
        self.head_weight = model.lm_head.weight  # [V, D], tied or not
        self.eps = config.rms_norm_eps
        self.rotary = body.rotary_emb  # the module itself: its buffers follow model.to(...)
        self.activation = ACT2FN[config.hidden_act]
        self.scale = attention.scaling

    def place(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple]:
        cos, sin = self.rotary(hidden, positions)  # [B, n, hd] each, attention_scaling applied, in the model dtype
        return hidden, (cos.unsqueeze(1), sin.unsqueeze(1))  # [B, 1, n, hd] broadcast over heads

    def block(self, layer, hidden, rotary, write_index, mask, key_buffer, value_buffer) -> torch.Tensor:
        weights = self.layers[layer]
        batch, n, _ = hidden.shape
        cos, sin = rotary
        x = self.rms_norm(hidden, weights.input_norm)  # [B, n, D]
        query = F.linear(x, weights.q_weight, weights.q_bias).view(batch, n, -1, self.head_dim).transpose(1, 2)
        key = F.linear(x, weights.k_weight, weights.k_bias).view(batch, n, -1, self.head_dim).transpose(1, 2)
        value = F.linear(x, weights.v_weight, weights.v_bias).view(batch, n, -1, self.head_dim).transpose(1, 2)
        query, key = rotate(query, cos, sin), rotate(key, cos, sin)  # [B, H, n, hd], [B, Hkv, n, hd]
        attended = self.attention(query, key, value, write_index, mask, key_buffer, value_buffer, self.scale)
        attended = attended.transpose(1, 2).reshape(batch, n, -1)  # [B, n, H*hd]
        hidden = hidden + F.linear(attended, weights.o_weight, weights.o_bias)  # [B, n, D]
        x = self.rms_norm(hidden, weights.post_norm)
        gated = self.activation(F.linear(x, weights.gate_weight, weights.gate_bias)) * F.linear(
            x, weights.up_weight, weights.up_bias)  # [B, n, I]
        return hidden + F.linear(gated, weights.down_weight, weights.down_bias)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.rms_norm(hidden, self.final_norm_weight)

    def rms_norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """transformers' RMSNorm to the bit: the statistics in float32, the weight applied in the model dtype."""
        x = hidden.float()  # [B, n, D]
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x.to(hidden.dtype)


def linear(module: torch.nn.Linear) -> tuple[torch.nn.Parameter, torch.nn.Parameter | None]:
    return module.weight, module.bias
