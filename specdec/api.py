"""The front door: ``specdec.generate`` and ``specdec.Decoder``, which fill in the defaults (no draft: the
autoregressive baseline; ``Speculative()``; ``FixedLength(4)``; greedy sampling) and check plain arguments before
building the loop (``specdec.decode``), which takes every part explicitly."""

from __future__ import annotations

import torch

from specdec.checks import check_device, check_model, described, model_device
from specdec.decode import Decoder as ExplicitDecoder
from specdec.drafters import ModelDrafter, NoDrafter
from specdec.emit import GenerationOutput
from specdec.interfaces import AcceptanceStrategy, Drafter
from specdec.policies import DraftLengthPolicy, FixedLength
from specdec.sampling import SamplingConfig
from specdec.strategies import Speculative, make_strategy


class Decoder(ExplicitDecoder):
    """``specdec.decode.Decoder`` with defaults: ``drafter=None`` is the autoregressive baseline (``NoDrafter``),
    ``strategy=None`` speculative sampling, ``draft_length=None`` ``FixedLength(4)``, ``sampling=None`` greedy.
    Reuse one across calls: compiled forwards, static caches and captured steps are kept in it (``release``)."""

    def __init__(self, target: torch.nn.Module, drafter: Drafter | None = None,
                 strategy: AcceptanceStrategy | None = None, draft_length: DraftLengthPolicy | None = None,
                 sampling: SamplingConfig | None = None, **options):
        check_model("target", target)
        super().__init__(
            target,
            drafter if drafter is not None else NoDrafter(),
            strategy if strategy is not None else Speculative(),
            draft_length if draft_length is not None else FixedLength(),
            sampling if sampling is not None else SamplingConfig(),
            **options,
        )


def generate(
    target: torch.nn.Module,
    input_ids: torch.Tensor,
    draft: torch.nn.Module | Drafter | None = None,
    attention_mask: torch.Tensor | None = None,
    strategy: str | AcceptanceStrategy = "speculative",
    k: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_token_id: int | list[int] | None = None,
    seed: int = 0,
    *,
    min_p: float | None = None,
    draft_length: DraftLengthPolicy | None = None,
    cache_layout: str = "dynamic",
    compile: bool = False,
    forward: str = "auto",
    step: str = "auto",
) -> GenerationOutput:
    """Generate up to ``max_new_tokens`` per row with ``target``, drafted by ``draft`` (None: autoregressive).

    ``draft`` is a causal LM sharing the target's vocabulary, or any object with the ``Drafter`` interface.
    ``input_ids`` [B, T] may be left-padded, with ``attention_mask`` zeros on the padding. Temperature 0 is
    greedy. ``draft_length`` overrides the fixed ``k`` with a policy. Randomness comes only from ``seed``.
    ``cache_layout="static"`` preallocates transformers' caches (fixed addresses). ``compile=True`` compiles
    both models' decode forwards (and, where the parts allow, runs each step as one captured device program); it
    pays only across many calls, so build a ``Decoder`` once and reuse it rather than calling this in a loop.
    ``forward``: "auto" (the lean forward where supported), "lean" or "transformers"; ``step``: "auto", "host"
    or "device" (``specdec.decode.Decoder``).
    """
    sampling = SamplingConfig(temperature, top_k, top_p, min_p)
    acceptance = make_strategy(strategy)
    policy = draft_length if draft_length is not None else FixedLength(k)
    check_model("target", target)
    drafter = as_drafter(draft, target, cache_layout, compile, forward)
    check_device("input_ids", input_ids, target)
    if attention_mask is not None:
        check_device("attention_mask", attention_mask, target)
    decoder = Decoder(target, drafter, acceptance, policy, sampling, cache_layout=cache_layout, compile=compile,
                      forward=forward, step=step)
    return decoder.generate(input_ids, attention_mask, max_new_tokens, eos_token_id, seed)


def as_drafter(
    draft: torch.nn.Module | Drafter | None, target: torch.nn.Module, cache_layout: str = "dynamic",
    compile: bool = False, forward: str = "auto",
) -> Drafter | None:
    """A causal LM becomes a ``ModelDrafter`` after checking it can draft for ``target``."""
    if draft is None or isinstance(draft, Drafter):
        return draft
    if not isinstance(draft, torch.nn.Module):
        raise TypeError(f"draft must be a causal LM, a Drafter, or None; got {type(draft).__name__} "
                        f"({described(draft)})")
    check_model("draft", draft)
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft and target must share a vocabulary: draft vocab_size={draft.config.vocab_size}, "
            f"target vocab_size={target.config.vocab_size}; to draft across tokenizers use "
            f"specdec.CrossTokenizerDrafter"
        )
    draft_device, target_device = model_device(draft), model_device(target)
    if draft_device != target_device:
        raise ValueError(f"draft is on {draft_device} but target on {target_device}; put both on one device")
    return ModelDrafter(draft, cache_layout=cache_layout, compile=compile, forward=forward)
