"""Early-exit self-drafting: the target's first n layers, final norm and LM head draft for the whole target.

``shallow_view(target, n)`` builds a model of the target's own class whose config says n layers and whose
modules *are* the target's (embeddings, the first n decoder blocks, final norm, LM head): no weights are copied,
so the draft costs no memory beyond its KV cache and always tracks the target's weights. ``EarlyExitDrafter``
drives that view with the ``ModelDrafter`` machinery, so it has its own cache of n layers and the same rollback.

Generic over transformers decoder-only models laid out as ``<base>.{embeddings..., <layers ModuleList>, norm}``
plus a head (GPT-2's ``transformer.h``, Llama/Mistral/Qwen's ``model.layers``). Others raise ``ValueError``.
"""

from __future__ import annotations

import copy

import torch

from specdec.drafters import ModelDrafter

LAYER_LIST_NAMES = ("h", "layers", "blocks", "layer")  # where decoder blocks live in transformers base models


def num_layers_of(model: torch.nn.Module) -> int:
    value = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if not isinstance(value, int):
        raise ValueError(
            f"early exit needs a transformers model whose config has num_hidden_layers; got {type(model).__name__}"
        )
    return value


def layer_list_name(base: torch.nn.Module, num_layers: int) -> str:
    """The child of the base model that holds the decoder blocks."""
    for name in LAYER_LIST_NAMES:
        child = getattr(base, name, None)
        if isinstance(child, torch.nn.ModuleList) and len(child) == num_layers:
            return name
    raise ValueError(
        f"early exit does not support {type(base).__name__}: found no ModuleList of {num_layers} decoder blocks "
        f"named one of {LAYER_LIST_NAMES}"
    )


def shallow_view(target: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A model of ``type(target)`` running the target's first ``num_layers`` blocks, sharing every parameter."""
    total = num_layers_of(target)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not 1 <= num_layers <= total:
        raise ValueError(f"num_layers must be an integer in [1, {total}] (the target has {total}), got {num_layers!r}")
    prefix = getattr(target, "base_model_prefix", "")
    base = getattr(target, prefix, None) if prefix else None
    if not isinstance(base, torch.nn.Module) or base is target:
        raise ValueError(
            f"early exit supports causal LMs with a base model and a head (e.g. GPT2LMHeadModel, LlamaForCausalLM); "
            f"{type(target).__name__} has no base model attribute {prefix!r}"
        )
    blocks = layer_list_name(base, total)

    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers  # GPT-2 maps this onto n_layer
    if isinstance(getattr(config, "layer_types", None), list):  # per-layer attention kinds (sliding window, ...)
        config.layer_types = config.layer_types[:num_layers]
    with torch.device("meta"):  # a skeleton without storage; every module is replaced by the target's below
        view = type(target)(config)
    view_base = getattr(view, prefix)
    for name, module in base.named_children():
        setattr(view_base, name, torch.nn.ModuleList(module[:num_layers]) if name == blocks else module)
    for name, module in target.named_children():
        if name != prefix:
            setattr(view, name, module)
    left = [name for name, t in [*view.named_parameters(), *view.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"early exit does not support {type(target).__name__}: no shared module for {left[:4]}")
    view.train(target.training)
    return view


class EarlyExitDrafter(ModelDrafter):
    """Drafts with the target's first ``num_layers`` layers (plus its final norm and LM head), sharing weights."""

    name = "early_exit"

    @classmethod
    def from_pair(cls, pair, compile: bool = False, forward: str = "auto", **options) -> "EarlyExitDrafter":
        cls.check_options(compile=compile, forward=forward, **options)
        return cls(pair.target, forward=forward, **options)

    @classmethod
    def reads_draft_model(cls, **options) -> bool:
        return False  # the target's own first layers

    @classmethod
    def check_options(cls, compile: bool = False, forward: str = "auto", num_layers=None, **options) -> None:
        if options:
            raise TypeError(f"EarlyExitDrafter got unknown options {sorted(options)}; it takes num_layers")
        if isinstance(num_layers, bool) or not isinstance(num_layers, int) or num_layers < 1:
            raise ValueError(f"num_layers must be an integer >= 1 (and at most the target's layers), got {num_layers!r}")

    def __init__(self, target: torch.nn.Module, num_layers: int, forward: str = "auto"):
        self.target = target
        self.num_layers = num_layers
        super().__init__(shallow_view(target, num_layers), label=f"early-exit draft ({num_layers} layers)",
                         forward=forward)
