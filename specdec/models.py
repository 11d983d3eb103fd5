"""Draft/target model pairs: presets, device and dtype resolution, shared-tokenizer checks."""
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

EMBEDDED_DIR = Path(__file__).resolve().parent / "embedded"
HUB_PRESETS = {  # preset -> (draft id, target id); GPT-2 sizes share one tokenizer
    "gpt2-xl": ("gpt2", "gpt2-xl"),
    "gpt2-large": ("gpt2", "gpt2-large"),
    "gpt2-medium": ("gpt2", "gpt2-medium"),
}
PRESETS = ["embedded", *HUB_PRESETS]
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


def load_pair(preset: str | None = "embedded", *, draft: str | None = None, target: str | None = None,
              device: str = "auto", dtype: str = "auto") -> ModelPair:
    """Load a draft/target pair sharing one tokenizer (left padding, pad = eos when it has none)."""
    spec = resolve_pair_ids(preset, draft, target)
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
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
