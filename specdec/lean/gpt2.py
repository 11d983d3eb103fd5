"""The lean forward of ``GPT2LMHeadModel``: learned positions, pre-LayerNorm blocks, Conv1D weights [in, out]."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel
from transformers.activations import ACT2FN

from specdec.lean.base import LeanForward


class GPT2Layer(NamedTuple):
    """One block's Parameters, the model's own objects. Conv1D weights are [in, out]."""
    ln_1_weight: torch.nn.Parameter
    ln_1_bias: torch.nn.Parameter
    attn_weight: torch.nn.Parameter  # [D, 3D]: q, k, v side by side
    attn_bias: torch.nn.Parameter
    attn_proj_weight: torch.nn.Parameter  # [D, D]
    attn_proj_bias: torch.nn.Parameter
    ln_2_weight: torch.nn.Parameter
    ln_2_bias: torch.nn.Parameter
    fc_weight: torch.nn.Parameter  # [D, inner]
    fc_bias: torch.nn.Parameter
    mlp_proj_weight: torch.nn.Parameter  # [inner, D]
    mlp_proj_bias: torch.nn.Parameter


def gpt2_unsupported(model: GPT2LMHeadModel) -> str | None:
    """Why the lean forward would not compute what transformers' GPT-2 computes, or None."""
    config = model.config
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn", "add_cross_attention"):
        if getattr(config, flag, False):
            return f"GPT-2 with {flag}=True is not modelled by the lean forward"
    return None


def activation(name: str):
    """The MLP's activation: the tanh-approximated GELUs as torch's one fused op (transformers' ``gelu_new`` spells
    the same formula in 8 eager ops: 6% of an embedded-pair step on CPU), any other as transformers has it."""
    if name in ("gelu_new", "gelu_pytorch_tanh"):
        return lambda x: F.gelu(x, approximate="tanh")
    return ACT2FN[name]


class GPT2Forward(LeanForward):
    def __init__(self, model: GPT2LMHeadModel):
        config, body = model.config, model.transformer
        self.model = model
        self.num_layers = config.n_layer
        self.num_heads = self.num_kv_heads = config.n_head
        self.head_dim = config.n_embd // config.n_head
        self.vocab_size = model.lm_head.weight.shape[0]
        self.context_limit = config.n_positions  # learned position embeddings: a hard limit
        self.embedding = body.wte.weight  # [V, D]
        self.position_embedding = body.wpe.weight  # [P, D]
        self.layers = [
            GPT2Layer(block.ln_1.weight, block.ln_1.bias, block.attn.c_attn.weight, block.attn.c_attn.bias,
                      block.attn.c_proj.weight, block.attn.c_proj.bias, block.ln_2.weight, block.ln_2.bias,
                      block.mlp.c_fc.weight, block.mlp.c_fc.bias, block.mlp.c_proj.weight, block.mlp.c_proj.bias)
            for block in body.h
        ]
        self.final_norm_weight, self.final_norm_bias = body.ln_f.weight, body.ln_f.bias
        self.head_weight = model.lm_head.weight  # [V, D], tied to wte in the hub's models
        self.eps = config.layer_norm_epsilon
        self.activation = activation(config.activation_function)
        self.scale = self.head_dim**-0.5 if config.scale_attn_weights else 1.0

    def place(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, None]:
        positions = positions.clamp(0, self.context_limit - 1)  # [B, n] junk rows stay inside the table
        return hidden + F.embedding(positions, self.position_embedding), None  # positions are in the inputs

    def block(self, layer, hidden, rotary, write_index, mask, key_buffer, value_buffer) -> torch.Tensor:
        weights = self.layers[layer]
        batch, n, width = hidden.shape
        x = F.layer_norm(hidden, (width,), weights.ln_1_weight, weights.ln_1_bias, self.eps)  # [B, n, D]
        qkv = torch.addmm(weights.attn_bias, x.view(batch * n, width), weights.attn_weight)  # [B*n, 3D]
        heads = qkv.view(batch, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)  # [3, B, H, n, hd]
        query, key, value = heads.unbind(0)  # [B, H, n, hd] each
        attended = self.attention(query, key, value, write_index, mask, key_buffer, value_buffer, self.scale)
        attended = attended.transpose(1, 2).reshape(batch * n, width)  # [B*n, D]
        hidden = hidden + torch.addmm(weights.attn_proj_bias, attended, weights.attn_proj_weight).view(batch, n, width)
        x = F.layer_norm(hidden, (width,), weights.ln_2_weight, weights.ln_2_bias, self.eps)  # [B, n, D]
        inner = self.activation(torch.addmm(weights.fc_bias, x.view(batch * n, width), weights.fc_weight))  # [B*n, I]
        return hidden + torch.addmm(weights.mlp_proj_bias, inner, weights.mlp_proj_weight).view(batch, n, width)

    def final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(hidden, hidden.shape[-1:], self.final_norm_weight, self.final_norm_bias, self.eps)
