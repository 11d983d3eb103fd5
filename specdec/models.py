"""Draft/target model pairs: presets, device and dtype resolution, shared-tokenizer checks."""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, GPT2Tokenizer,
                          PreTrainedModel, PreTrainedTokenizerBase)

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
GPT2_TOKENIZER_DIR = Path(__file__).resolve().parent / "gpt2_tokenizer"  # GPT-2's BPE files (MIT, see LICENSE)
HUB_PRESETS = {  # preset -> (draft id, target id); GPT-2 sizes share one tokenizer
    "gpt2-xl": ("gpt2", "gpt2-xl"),
    "gpt2-large": ("gpt2", "gpt2-large"),
    "gpt2-medium": ("gpt2", "gpt2-medium"),
}
# The hub configurations' shapes; every other GPT2Config default (vocabulary 50257, 1024 positions, gelu_new,
# layer-norm epsilon 1e-5, initializer range 0.02) equals the hub's for all four sizes.
GPT2_SHAPES = {
    "gpt2": dict(n_layer=12, n_embd=768, n_head=12),
    "gpt2-medium": dict(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": dict(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": dict(n_layer=48, n_embd=1600, n_head=25),
}
SHAPED_PRESETS = {f"{name}-shaped": (draft, target) for name, (draft, target) in HUB_PRESETS.items()}
PRESETS = ["embedded", *HUB_PRESETS, *SHAPED_PRESETS]
DEVICES = ["auto", "cpu", "cuda", "mps"]
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ModelUnavailableError(RuntimeError):
    """A model or tokenizer could be found neither locally nor (offline or not) on the hub."""


@dataclass(frozen=True)
class PairSpec:
    """Where each part of a pair is loaded from: hub ids or local directories."""
    name: str
    draft: str
    target: str
    draft_tokenizer: str
    target_tokenizer: str


@dataclass
class ModelPair:
    draft: PreTrainedModel
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str

    def __iter__(self):
        """Allows `draft, target, tokenizer = load_pair(...)`."""
        return iter((self.draft, self.target, self.tokenizer))


def resolve_pair_ids(preset: str | None, draft: str | None = None, target: str | None = None) -> PairSpec:
    """Map a preset plus optional explicit ids (which override it) to the ids to load; loads nothing."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {PRESETS}")
    if preset is None and (draft is None or target is None):
        raise ValueError(f"with preset=None give both draft= and target= (got draft={draft!r}, target={target!r}); "
                         f"or choose a preset from {PRESETS}")
    if preset == "embedded":
        shared = str(EMBEDDED_DIR / "tokenizer")
        base = PairSpec("embedded", str(EMBEDDED_DIR / "draft"), str(EMBEDDED_DIR / "target"), shared, shared)
    elif preset in SHAPED_PRESETS:
        raise ValueError(f"preset {preset!r} builds random-weight models and takes no draft= or target= ids")
    elif preset is not None:
        draft_id, target_id = HUB_PRESETS[preset]
        base = PairSpec(preset, draft_id, target_id, draft_id, target_id)
    else:
        base = PairSpec("custom", draft, target, draft, target)
    if draft is None and target is None:
        return base
    return PairSpec("custom", draft or base.draft, target or base.target,
                    draft or base.draft_tokenizer, target or base.target_tokenizer)


def resolve_device(device: str = "auto") -> torch.device:
    """auto: cuda if available, else mps if available, else cpu; an explicit device must be present."""
    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; allowed: {DEVICES}")
    cuda, mps = torch.cuda.is_available(), torch.backends.mps.is_available()
    if device == "auto":
        return torch.device("cuda" if cuda else "mps" if mps else "cpu")
    if (device == "cuda" and not cuda) or (device == "mps" and not mps):
        raise ValueError(f"device {device!r} was requested but is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str = "auto", device: str | torch.device = "cpu") -> torch.dtype:
    """auto: bf16 on a CUDA GPU that supports it, else fp16 on a GPU, fp32 on CPU."""
    if dtype in DTYPES:
        return DTYPES[dtype]
    if dtype != "auto":
        raise ValueError(f"unknown dtype {dtype!r}; allowed: {['auto', *DTYPES]}")
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float16 if kind == "mps" else torch.float32


def unavailable(what: str, source: str) -> ModelUnavailableError:
    """A one-line error for a model or tokenizer that neither a local directory nor the hub could provide."""
    return ModelUnavailableError(
        f"could not load {what} {source!r}: not a local model directory, and it could not be loaded from the "
        f"Hugging Face hub or its offline cache; use preset='embedded' for the pair shipped with specdec")


def load_tokenizer(source: str) -> PreTrainedTokenizerBase:
    """A tokenizer from a local directory or the hub (cache)."""
    try:
        return AutoTokenizer.from_pretrained(source)
    except (OSError, HfHubHTTPError, HFValidationError):
        raise unavailable("tokenizer", source) from None


def load_model(source: str, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    """A causal LM from a local directory or the hub (cache), on device, in eval mode with gradients off."""
    try:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
    except (OSError, HfHubHTTPError, HFValidationError):
        raise unavailable("model", source) from None
    return model.to(device).eval().requires_grad_(False)


def special_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int | None]:
    """The special-token ids that the decode loop relies on."""
    return {"eos": tokenizer.eos_token_id, "bos": tokenizer.bos_token_id, "pad": tokenizer.pad_token_id}


def check_same_tokenizer(draft_tok: PreTrainedTokenizerBase, target_tok: PreTrainedTokenizerBase,
                         spec: PairSpec) -> None:
    """Speculative decoding compares token ids, so both models must use the same vocabulary and special tokens."""
    draft_vocab, target_vocab = draft_tok.get_vocab(), target_tok.get_vocab()
    if draft_vocab != target_vocab:
        differ = len(set(draft_vocab.items()) ^ set(target_vocab.items()))
        raise ValueError(f"draft {spec.draft_tokenizer!r} and target {spec.target_tokenizer!r} tokenizers differ: "
                         f"vocab sizes {len(draft_vocab)} vs {len(target_vocab)}, {differ} differing entries")
    if special_ids(draft_tok) != special_ids(target_tok):
        raise ValueError(f"draft {spec.draft_tokenizer!r} and target {spec.target_tokenizer!r} tokenizers have "
                         f"different special tokens: {special_ids(draft_tok)} vs {special_ids(target_tok)}")


def gpt2_tokenizer() -> PreTrainedTokenizerBase:
    """The real GPT-2 byte-level BPE tokenizer, from the files shipped with specdec (no hub)."""
    vocab = json.loads((GPT2_TOKENIZER_DIR / "encoder.json").read_text(encoding="utf-8"))
    lines = (GPT2_TOKENIZER_DIR / "vocab.bpe").read_text(encoding="utf-8").split("\n")[1:]  # line 0: a version
    merges = [tuple(line.split()) for line in lines if line]
    return GPT2Tokenizer(vocab=vocab, merges=merges)


def gpt2_shaped_model(size: str, device: torch.device, dtype: torch.dtype, seed: int = 0) -> PreTrainedModel:
    """A random-weight GPT-2 with the exact configuration of hub model ``size``, built on ``device`` in ``dtype``."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT2LMHeadModel._from_config(GPT2Config(**GPT2_SHAPES[size]), dtype=dtype)
    return model.eval().requires_grad_(False)


def load_shaped_pair(preset: str, device: torch.device, dtype: torch.dtype) -> "ModelPair":
    """GPT-2 small drafting for a larger GPT-2, random weights, real tokenizer: the canonical pairs' shapes
    and costs, offline. Acceptance between random models means nothing: measure them at synthetic acceptance."""
    draft_size, target_size = SHAPED_PRESETS[preset]
    tokenizer = gpt2_tokenizer()
    tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    draft_model = gpt2_shaped_model(draft_size, device, dtype, seed=0)
    target_model = gpt2_shaped_model(target_size, device, dtype, seed=1)
    return ModelPair(draft=draft_model, target=target_model, tokenizer=tokenizer, name=preset)


def load_pair(preset: str | None = "embedded", *, draft: str | None = None, target: str | None = None,
              device: str = "auto", dtype: str = "auto") -> ModelPair:
    """Load a draft/target pair sharing one tokenizer (left padding, pad = eos when it has none)."""
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    if preset in SHAPED_PRESETS and draft is None and target is None:
        return load_shaped_pair(preset, torch_device, torch_dtype)
    spec = resolve_pair_ids(preset, draft, target)
    tokenizer = load_tokenizer(spec.target_tokenizer)
    if spec.draft_tokenizer != spec.target_tokenizer:
        check_same_tokenizer(load_tokenizer(spec.draft_tokenizer), tokenizer, spec)
    draft_model = load_model(spec.draft, torch_device, torch_dtype)
    target_model = load_model(spec.target, torch_device, torch_dtype)
    if draft_model.config.vocab_size != target_model.config.vocab_size:
        raise ValueError(f"draft {spec.draft!r} and target {spec.target!r} have different vocab_size: "
                         f"{draft_model.config.vocab_size} vs {target_model.config.vocab_size}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return ModelPair(draft=draft_model, target=target_model, tokenizer=tokenizer, name=spec.name)
