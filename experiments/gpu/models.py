"""The GPU suite's models and devices: the plan's pair (or the smoke run's tiny random pair), device names, and
our decoder as a timed method."""

from __future__ import annotations

import re

import torch
import transformers

import specdec
from experiments.gpu.plan import SuitePlan
from experiments.harness import Decoded, Method
from specdec.models import ModelPair

# --- models -------------------------------------------------------------------------------------------------------


def load_models(plan: SuitePlan) -> ModelPair:
    """The pair of the autoregressive and speculative sections: a load_pair preset, or (``tiny``, the smoke run's) a
    random GPT-2 pair small enough for CPU tests."""
    if plan.pair != "tiny":
        return specdec.load_pair(plan.pair, device=plan.device, dtype=plan.dtype)
    models = [tiny_gpt2(layers, seed) for layers, seed in ((1, 0), (2, 1))]
    return ModelPair(draft=models[0], target=models[1], tokenizer=None, name="tiny")


def tiny_gpt2(layers: int, seed: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=256, n_positions=256, n_embd=64, n_layer=layers, n_head=2,
                                     bos_token_id=None, eos_token_id=None, pad_token_id=0)
    return transformers.GPT2LMHeadModel(config).eval().requires_grad_(False)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def device_kind(name: str) -> str:
    """The device tool's kind from a device name: "NVIDIA H100 80GB HBM3" -> "nvidia-h100"; "cpu" stays."""
    words = re.findall(r"[a-z0-9]+", name.lower())
    return "-".join(words[:2]) if words and words[0] == "nvidia" and len(words) > 1 else "-".join(words) or "unknown"


def release(*decoders: specdec.Decoder) -> None:
    """Free the decoders' buffers and compiled forwards, and the allocator's cached blocks with them."""
    for decoder in decoders:
        decoder.release()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def decoder_method(decoder: specdec.Decoder, prompts: torch.Tensor, new_tokens: int, compiled: bool) -> Method:
    """Our decoder on the same [B, T] prompts every call, EOS ignored."""
    return Method(lambda _, seed: Decoded.of(decoder.generate(prompts, None, new_tokens, None, seed)), compiled)
