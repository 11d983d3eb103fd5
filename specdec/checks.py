"""Argument checks of the library, in one place: each names the argument, the value and what is allowed, and runs
before any forward pass (a bad id on a GPU is a device-side assert that kills the CUDA context).

Constructors call the value checks (``check_draft_length``, ``check_probability``, ...), so a config that builds
is a config that runs; ``Decoder`` and ``generate`` call the rest on their arguments.
"""

from __future__ import annotations

import math
import numbers
import operator
from pathlib import Path

import torch
from transformers import PreTrainedModel

from specdec.interfaces import AcceptanceStrategy, Drafter, DraftLengthPolicy
from specdec.layout import Proposal
from specdec.sampling import SamplingConfig

# What torch.Generator.manual_seed accepts: 64 bits, signed or unsigned (a negative seed wraps modulo 2**64).
SEED_RANGE = (-(2**63), 2**64 - 1)


def check_draft_length(name: str, value: object) -> int:
    """An integer >= 1 (numpy integers too) as a Python int."""
    integer = as_integer(value)
    if integer is None or integer < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return integer


class NotANumberError(TypeError, ValueError):
    """A numeric setting given something else: a wrong type, and a bad value for callers that catch those (like
    numpy's AxisError, which is both a ValueError and an IndexError)."""


def check_number(name: str, value: object) -> None:
    """A real number, numpy's included (bool is not one, though Python says it is an int)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise NotANumberError(f"{name} must be a number, got {value!r} ({type(value).__name__})")


def check_probability(name: str, value: object, low_open: bool = False, high_open: bool = False) -> float:
    """A float in [0, 1] (ends excluded where asked)."""
    check_number(name, value)
    if not (0 < value if low_open else 0 <= value) or not (value < 1 if high_open else value <= 1):
        interval = ("(" if low_open else "[") + "0, 1" + (")" if high_open else "]")
        raise ValueError(f"{name} must be in {interval}, got {value!r}")
    return float(value)


def check_positive(name: str, value: object, allow_zero: bool = False) -> float:
    """A finite number > 0 (>= 0 where allowed): an infinite weight or ratio turns estimates into NaN."""
    check_number(name, value)
    if not (value >= 0 if allow_zero else value > 0) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number {'>=' if allow_zero else '>'} 0, got {value!r}")
    return float(value)


def described(value: object) -> str:
    """A value as an error message shows it: its repr where that is one short line, else its type (a model's repr
    runs to hundreds of lines)."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    shown = repr(value)
    if isinstance(value, torch.nn.Module) or "\n" in shown or len(shown) > 80:
        return f"a {type(value).__name__}"
    return shown


def check_parts(drafter: object, draft_length: object, sampling: object) -> None:
    """Wrong objects fail here, naming the argument, rather than deep inside a step. (Strategies are checked by
    ``check_strategy_object``, which also takes plain callables.)"""
    if not isinstance(drafter, Drafter):
        hint = "; wrap a model in specdec.ModelDrafter(model)" if isinstance(drafter, torch.nn.Module) else ""
        raise TypeError(f"drafter must be a specdec.Drafter (ModelDrafter, NGramDrafter, or a subclass), got "
                        f"{described(drafter)}{hint}")
    if not isinstance(draft_length, DraftLengthPolicy):
        raise TypeError(f"draft_length must be a draft-length policy (specdec.FixedLength(4), ...), got "
                        f"{described(draft_length)}")
    check_sampling(sampling)


def check_sampling(sampling: object) -> None:
    if not isinstance(sampling, SamplingConfig):
        raise TypeError(f"sampling must be a specdec.SamplingConfig (e.g. SamplingConfig(temperature=0) for greedy), "
                        f"got {described(sampling)}")


def check_eval_mode(model: torch.nn.Module) -> None:
    """A model in training mode runs dropout: every forward draws different tokens, silently."""
    if model.training:
        name = getattr(model.config, "name_or_path", "") or type(model).__name__
        raise ValueError(f"model {name!r} is in training mode (dropout active); call model.eval() before decoding")


def check_bool(name: str, value: object) -> bool:
    """True or False only: a string such as "false" is truthy, and would silently mean True."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def as_integer(value: object) -> int | None:
    """``value`` as a Python int when it is one integer: an int, a numpy integer or a one-element integer tensor.
    None otherwise, and for bools (which Python counts as ints)."""
    if isinstance(value, bool) or (isinstance(value, torch.Tensor) and value.dtype == torch.bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def check_seed(seed: object) -> int:
    """The seed as a Python int, within what ``torch.Generator.manual_seed`` takes (``SEED_RANGE``)."""
    value = as_integer(seed)
    if value is None:
        raise TypeError(f"seed must be an integer, got {seed!r} ({type(seed).__name__})")
    low, high = SEED_RANGE
    if not low <= value <= high:
        raise ValueError(f"seed must be in [-2**63, 2**64 - 1] (64 bits, what torch.Generator.manual_seed takes), "
                         f"got {seed!r}")
    return value


def check_prompt(input_ids, attention_mask, limit: int | None, vocab_size: int | None = None,
                 drafter_limit: bool = False) -> torch.Tensor:
    """Validate a [B, T] left-padded prompt batch (ids in [0, vocab_size) where it is known, checked before any
    forward: on a GPU an out-of-range id is a device-side assert that kills the CUDA context) and return its
    attention mask. ``drafter_limit``: ``limit`` is the drafter's model's, shorter than the target's."""
    if not isinstance(input_ids, torch.Tensor):
        raise TypeError(f"input_ids must be a torch.LongTensor of shape [B, T], got {type(input_ids).__name__}")
    if input_ids.dtype not in (torch.long, torch.int):
        raise TypeError(f"input_ids must hold integer token ids as torch.int64 (long) or torch.int32, got dtype "
                        f"{input_ids.dtype}")
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
        whose = "the drafter's context limit (its model's, shorter than the target's)" if drafter_limit else \
            "the context limit"
        raise ValueError(f"prompt of {int(lengths.max())} tokens is at or beyond {whose} of {limit} positions; "
                         f"prompts must be shorter than {limit} tokens")
    return attention_mask


def check_max_new_tokens(max_new_tokens: object) -> int:
    """An integer >= 1 (numpy integers too) as a Python int."""
    return check_draft_length("max_new_tokens", max_new_tokens)


def token_ids(value: object) -> list[int] | None:
    """One token id or a non-empty sequence of them (list, tuple, 1-d tensor or array) as Python ints; numpy
    integers and 0-d integer tensors count as ids. None for anything else."""
    single = as_integer(value)
    if single is not None:
        return [single]
    if isinstance(value, (str, bytes, dict)):
        return None
    try:
        ids = [as_integer(item) for item in value]
    except TypeError:  # not iterable (a float, a 0-d float tensor)
        return None
    return ids if ids and None not in ids else None


def check_eos_ids(eos_token_id, device: torch.device, vocab_size: int | None = None) -> torch.Tensor | None:
    """[n] the EOS ids as a tensor on ``device``, or None without EOS."""
    if eos_token_id is None:
        return None
    ids = token_ids(eos_token_id)
    if ids is None or min(ids) < 0:
        raise ValueError(f"eos_token_id must be a token id, a list of token ids, or None; got {eos_token_id!r}")
    if vocab_size is not None and max(ids) >= vocab_size:
        raise ValueError(f"eos_token_id {max(ids)} is outside the target's vocabulary [0, {vocab_size}): it could "
                         f"never be emitted")
    return torch.tensor(ids, dtype=torch.long, device=device)


def check_model(role: str, model: object) -> None:
    """A loaded causal LM: a module with a config, an LM head where transformers can say (a base model such as
    GPT2Model returns hidden states, not logits), and real weights (none left on the meta device)."""
    if isinstance(model, (str, Path)):
        raise TypeError(f"{role} must be a loaded model, got the name {str(model)!r}; load it first, e.g. "
                        f"AutoModelForCausalLM.from_pretrained({str(model)!r}) or specdec.load_pair(...)")
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
        raise TypeError(f"{role} must be a transformers causal LM (torch.nn.Module with a config), got {type(model).__name__}")
    if isinstance(model, PreTrainedModel) and model.get_output_embeddings() is None:
        raise TypeError(f"{role} {type(model).__name__} has no language-model head (it returns hidden states, not "
                        f"logits); load it with AutoModelForCausalLM (e.g. GPT2LMHeadModel, not GPT2Model)")
    meta = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()] if tensor.is_meta]
    if meta:
        raise ValueError(f"{role} has {len(meta)} tensor(s) on the meta device, e.g. {meta[0]!r}: their weights were "
                         f"never loaded; load the model with from_pretrained (or to_empty() and load_state_dict)")


# What specdec reads of a transformers tokenizer (``specdec.token_bridge``).
TOKENIZER_ATTRIBUTES = ("get_vocab", "batch_decode", "__call__", "all_special_ids", "added_tokens_decoder",
                        "eos_token_id")


def check_tokenizer(role: str, tokenizer: object) -> None:
    """A loaded transformers tokenizer: not its name, not None, not a bare ``tokenizers.Tokenizer``."""
    if isinstance(tokenizer, (str, Path)):
        raise TypeError(f"{role} must be a loaded tokenizer, got the name {str(tokenizer)!r}; load it first, e.g. "
                        f"AutoTokenizer.from_pretrained({str(tokenizer)!r}) or specdec.load_pair(...)")
    if tokenizer is None:
        raise TypeError(f"{role} must be a transformers tokenizer, got None")
    missing = [name for name in TOKENIZER_ATTRIBUTES if not hasattr(tokenizer, name)]
    if missing:
        raise TypeError(f"{role} {type(tokenizer).__name__} has no {', '.join(missing)}: a transformers tokenizer "
                        f"is needed (wrap a tokenizers.Tokenizer in PreTrainedTokenizerFast)")


def check_vocabulary_fits(name: str, vocab_size: int, tokenizer_role: str, id_range: int) -> None:
    """Every id the tokenizer encodes has a row in a vocabulary of ``vocab_size`` (an id beyond it is an index
    error in the model's embedding, in the middle of ``generate``)."""
    if vocab_size < id_range:
        raise ValueError(f"{name}={vocab_size} is smaller than the {tokenizer_role}'s {id_range} token ids: every id "
                         f"it encodes needs a row in that vocabulary; pair each model with its own tokenizer")


def check_children_fit_vocabulary(name: str, children: int, vocab_size: int) -> None:
    """A tree node's children are distinct tokens (the draft's top tokens at temperature 0, draws without
    replacement in a dynamic tree), so a node has at most as many as the vocabulary holds."""
    if children > vocab_size:
        raise ValueError(f"{name} gives a node {children} children, more than the draft's vocabulary of "
                         f"{vocab_size} tokens holds (a node's children are distinct tokens)")


def check_draft_ids(draft_ids: object, vocab_size: int) -> list[int]:
    """A reduced draft vocabulary as sorted distinct token ids of a vocabulary of ``vocab_size``: a non-empty
    sequence of integers in [0, vocab_size) (an empty one would leave the draft nothing to propose)."""
    if isinstance(draft_ids, torch.Tensor):
        draft_ids = draft_ids.tolist()
    ids = token_ids(draft_ids) if not isinstance(draft_ids, (int, numbers.Integral)) else None
    if ids is None:
        shown = "an empty list" if hasattr(draft_ids, "__len__") and not len(draft_ids) else described(draft_ids)
        raise ValueError(f"draft_ids must be a non-empty list of token ids (or None for the whole vocabulary), got "
                         f"{shown}")
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
        raise ValueError(f"draft_ids holds token id {outside[0]}, outside the target's vocabulary [0, {vocab_size})")
    return sorted(set(ids))


def check_placement(name: str, module: torch.nn.Module, target: torch.nn.Module) -> None:
    """Every floating tensor of ``module`` (a head that runs beside ``target``, reading its embedding and LM head)
    on the target's device and in its dtype: refused, not cast, so the caller's module is never changed behind its
    back (``from_pretrained`` builds heads in the target's dtype and device)."""
    reference = next(target.parameters())
    for tensor_name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and (tensor.dtype != reference.dtype or tensor.device != reference.device):
            raise ValueError(f"{name}: {tensor_name} is {str(tensor.dtype).removeprefix('torch.')} on "
                             f"{tensor.device}, the target {str(reference.dtype).removeprefix('torch.')} on "
                             f"{reference.device}; move it with .to(target.device, target.dtype) first")


def check_strategy_object(strategy: object) -> None:
    """An acceptance strategy instance, or a plain callable rule (``interfaces.as_strategy`` wraps it). A strategy
    class is refused: as a callable it would be wrapped as a rule, and each step would call its constructor."""
    if isinstance(strategy, type):
        if issubclass(strategy, AcceptanceStrategy):
            raise TypeError(f"strategy must be an instance, got the class {strategy.__name__}; write "
                            f"{strategy.__name__}() (with its parameters)")
        raise TypeError(f"strategy must be an acceptance strategy instance or a callable rule, got the class "
                        f"{strategy.__name__}")
    if isinstance(strategy, str):
        raise TypeError(f"strategy must be an acceptance strategy object, got the name {strategy!r}; Decoder takes "
                        f"objects (specdec.STRATEGIES[{strategy!r}]()), specdec.generate takes names")
    if not callable(strategy):
        raise TypeError(f"strategy must be an acceptance strategy (specdec.Speculative(), ...), got "
                        f"{described(strategy)}")


def check_allocation(name: str, numel: int, dtype: torch.dtype, device: torch.device | str) -> None:
    """Refuse, before allocating it, a tensor of ``numel`` elements of ``dtype`` larger than the memory free on
    ``device``, in one line naming the parameter ``name`` that sized it (the allocator's own error names none).
    Where the free memory cannot be read, nothing is refused."""
    needed = numel * dtype.itemsize
    free = free_memory(torch.device(device))
    if free is not None and needed > free:
        raise ValueError(f"{name} is too large: it needs a tensor of {numel:,} {str(dtype).removeprefix('torch.')} "
                         f"elements ({needed / 2**30:,.1f} GiB) on {device}, more than the {free / 2**30:,.1f} GiB "
                         f"free there")


def free_memory(device: torch.device) -> int | None:
    """Bytes a new tensor can take on ``device``: the driver's free memory plus what torch's caching allocator
    holds unused (CUDA), the recommended working set left (MPS), or the system's available memory (CPU, Linux)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type == "mps":
        return torch.mps.recommended_max_memory() - torch.mps.current_allocated_memory()
    if device.type == "cpu":
        return available_host_memory()
    return None


def available_host_memory() -> int | None:
    """MemAvailable of /proc/meminfo (free memory plus what the kernel can reclaim), or None where unreadable."""
    try:
        lines = Path("/proc/meminfo").read_text(encoding="ascii").splitlines()
    except OSError:
        return None
    available = [line.split()[1] for line in lines if line.startswith("MemAvailable:")]
    return int(available[0]) * 1024 if available else None  # the file counts kB


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def check_device(name: str, tensor: object, target: torch.nn.Module) -> None:
    if isinstance(tensor, torch.Tensor) and tensor.device != model_device(target):
        raise ValueError(f"{name} is on {tensor.device} but the target model on {model_device(target)}")


def check_max_k(policy: DraftLengthPolicy) -> int:
    """A custom policy's ``max_k`` (the most tokens ``next_k`` may ask) as an int >= 0, naming the policy."""
    value = as_integer(policy.max_k)
    if value is None or value < 0:
        raise ValueError(f"draft-length policy {policy.name!r} has max_k={policy.max_k!r}; max_k must be an integer "
                         f">= 0, the most tokens next_k() may ask for")
    return value


def check_next_k(policy: DraftLengthPolicy, k: object, max_k: int) -> int:
    """A policy's ``next_k()`` answer as an int in [0, max_k], naming the policy."""
    value = as_integer(k)
    if value is None or not 0 <= value <= max_k:
        raise ValueError(f"draft-length policy {policy.name!r} answered next_k()={k!r}; it must be an integer in "
                         f"[0, max_k={max_k}]")
    return value


def check_proposal(proposal: object, drafter: Drafter, k: int, batch_size: int, device: torch.device,
                   vocab_size: int) -> None:
    """A drafter's proposal, unless it ``trusted_proposals`` (specdec's own), before the target's forward: a ``Proposal`` of [B, N] integer tokens on the
    target's device, drafting at most ``k`` positions, ids in the vocabulary, probs [B, *, V]. One host read (the
    ids' range): an id outside the vocabulary would index out of bounds in the embedding."""
    name = f"drafter {drafter.name!r}"
    if not isinstance(proposal, Proposal):
        raise TypeError(f"{name} proposed {type(proposal).__name__}; propose() returns a specdec Proposal(tokens "
                        f"[B, N], probs [B, N, V] or None)")
    tokens, probs = proposal.tokens, proposal.probs
    if tokens.dtype not in (torch.long, torch.int):
        raise TypeError(f"{name} proposed tokens of dtype {tokens.dtype}; token ids are torch.int64 (long)")
    if tokens.device != device:
        raise ValueError(f"{name} proposed tokens on {tokens.device}; the target is on {device}")
    if tokens.shape[0] != batch_size:
        raise ValueError(f"{name} proposed tokens for {tokens.shape[0]} rows; the batch has {batch_size} rows")
    if proposal.layout.depth > k:
        raise ValueError(f"{name} proposed {proposal.layout.depth} draft positions; it was asked for at most k={k}")
    if probs is not None and (not isinstance(probs, torch.Tensor) or probs.dim() != 3 or probs.shape[0] != batch_size
                              or probs.shape[-1] != vocab_size or probs.device != device):
        shown = f"shape {tuple(probs.shape)} on {probs.device}" if isinstance(probs, torch.Tensor) else repr(probs)
        raise ValueError(f"{name} proposed probs with {shown}; probs are [B={batch_size}, N, V={vocab_size}] on "
                         f"{device}, or None")
    if tokens.numel() and bool(((tokens < 0) | (tokens >= vocab_size)).any()):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)][0].item()
        raise ValueError(f"{name} proposed token id {bad}, outside the target's vocabulary [0, {vocab_size})")
