"""Draft/target model pairs: presets, device and dtype resolution, shared-tokenizer checks.

``plan_pair`` checks a pair's arguments and reads what is known without the weights (the tokenizers, the context
from the config files), so that callers can refuse bad input before the slow part; ``load_pair`` then loads the
models. Every error is one line naming the argument. A pair shares one tokenizer unless ``cross_tokenizer=True``
(for ``specdec.CrossTokenizerDrafter``), which lets the draft's tokenizer and vocabulary differ.

Any model directory (or hub id) is one key: ``target=DIR`` alone is a pair with no draft model (for the drafters
that read the target alone: a trained head, early exit, n-gram; the target loads once), ``draft=DIR target=DIR`` a
pair drafting with a model. Such a pair is named by its models (``model_name``): ``SmolLM2-135M-Instruct``, or
``draft-name->target-name``.
"""
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from huggingface_hub.errors import HfHubHTTPError, HFValidationError
from huggingface_hub.utils import validate_repo_id
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel,
                          GPT2Tokenizer, PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase)

from specdec.token_bridge import same_tokens

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
OFFLINE_HINT = "the 'embedded' pair shipped with specdec loads offline"
CROSS_HINT = ("to draft across tokenizers use specdec.CrossTokenizerDrafter with load_pair(..., cross_tokenizer=True) "
              "(the CLI: drafter=cross_tokenizer pair.cross_tokenizer=true)")


class ModelUnavailableError(RuntimeError):
    """A model or tokenizer could be found neither locally nor (offline or not) on the hub."""


@dataclass(frozen=True)
class PairSpec:
    """Where each part of a pair is loaded from: hub ids or local directories. ``draft`` None: no draft model (a
    target alone, for drafters that read the target only)."""
    name: str
    draft: str | None
    target: str
    draft_tokenizer: str | None
    target_tokenizer: str


@dataclass
class ModelPair:
    draft: PreTrainedModel | None  # None: a target alone (``load_pair(target=DIR)``), for drafters that read it only
    target: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase  # the target's (prompts are encoded with it)
    name: str
    draft_tokenizer: PreTrainedTokenizerBase | None = None  # the draft's; None: the same as the target's

    def __post_init__(self) -> None:
        if self.draft_tokenizer is None:
            self.draft_tokenizer = self.tokenizer

    @property
    def shares_tokenizer(self) -> bool:
        return self.draft_tokenizer is self.tokenizer

    def __iter__(self):
        """Allows `draft, target, tokenizer = load_pair(...)`."""
        return iter((self.draft, self.target, self.tokenizer))


@dataclass(frozen=True)
class PairPlan:
    """A pair's checked arguments and what is known before its weights load (``plan_pair``)."""
    name: str
    spec: PairSpec | None  # where the models come from; None for a ``*-shaped`` preset (random weights)
    device: torch.device
    dtype: torch.dtype
    tokenizer: PreTrainedTokenizerBase  # the target's: left padding, pad = eos when it has none
    context_limit: int | None  # positions both models attend over (the smaller), None if their configs do not say
    draft_tokenizer: PreTrainedTokenizerBase | None = None  # where it differs (cross_tokenizer); None: the same

    @property
    def shares_tokenizer(self) -> bool:
        return self.draft_tokenizer is None


def resolve_pair_ids(preset: str | None, draft: str | None = None, target: str | None = None) -> PairSpec:
    """Map a preset plus optional explicit ids to the ids to load; loads nothing. An explicit id must be an
    existing model directory or a well-formed hub id (``check_source``). ``target`` alone is a target without a
    draft model (the preset is not read); ``draft`` alone replaces the preset's draft. A pair given by ids is named
    by its models (``model_name``)."""
    for role, source in (("draft", draft), ("target", target)):
        if source is not None:
            check_source(role, source)
    if target is not None and draft is None:
        return PairSpec(model_name(target), None, target, None, target)
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known presets: {PRESETS}")
    if preset is None and target is None:
        raise ValueError(f"with preset=None give target= (alone: no draft model; with draft=: a draft model), got "
                         f"draft={draft!r}, target={target!r}; or choose a preset from {PRESETS}")
    if preset == "embedded":
        shared = str(EMBEDDED_DIR / "tokenizer")
        base = PairSpec("embedded", str(EMBEDDED_DIR / "draft"), str(EMBEDDED_DIR / "target"), shared, shared)
    elif preset in SHAPED_PRESETS:
        raise ValueError(f"preset {preset!r} builds random-weight models and takes no draft= or target= ids")
    elif preset is not None:
        draft_id, target_id = HUB_PRESETS[preset]
        base = PairSpec(preset, draft_id, target_id, draft_id, target_id)
    else:
        base = PairSpec("", draft, target, draft, target)
    if draft is None and target is None:
        return base
    draft_id, target_id = draft or base.draft, target or base.target
    return PairSpec(f"{model_name(draft_id)}->{model_name(target_id)}", draft_id, target_id,
                    draft or base.draft_tokenizer, target or base.target_tokenizer)


def model_name(source: str) -> str:
    """What a report calls a model: its directory's name (``/models/SmolLM2-135M-Instruct``), the name in a hub
    cache snapshot (``.../models--org--name/snapshots/<hash>``), or a hub id's last part (``org/name``)."""
    path = Path(source).expanduser()
    if path.is_dir():
        path = path.resolve()
        if path.parent.name == "snapshots" and path.parent.parent.name.startswith("models--"):
            return path.parent.parent.name.split("--")[-1]
        return path.name
    return source.rstrip("/").split("/")[-1]


def check_source(role: str, source: object) -> None:
    """A model source is a local model directory (holding config.json) or a well-formed Hugging Face hub id
    ('gpt2', 'org/name'); which hub ids exist is known only by asking the hub, when the model loads."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{role} must be a hub id or a local model directory, got {source!r}")
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelUnavailableError(f"could not load {role} {source!r}: the directory holds no config.json "
                                        f"(save a model there with save_pretrained)")
        return
    if path.exists():
        raise ModelUnavailableError(f"could not load {role} {source!r}: it is a file; give the model's directory")
    check_hub_id(role, source)


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
        f"Hugging Face hub or its offline cache; {OFFLINE_HINT}")


def load_config(source: str) -> PretrainedConfig:
    """A model's configuration alone (config.json, no weights) from a local directory or the hub (cache)."""
    try:
        return AutoConfig.from_pretrained(source)
    except (OSError, ValueError, HfHubHTTPError, HFValidationError):
        raise unavailable("model", source) from None


def positions_of(config: PretrainedConfig) -> int | None:
    """The number of positions a model's config says it attends over (as ``specdec.cache.context_limit`` reads
    it from a loaded model), or None."""
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def pair_context_limit(draft: PretrainedConfig, target: PretrainedConfig) -> int | None:
    """The smaller of the two models' context limits (the decode loop's bound), None where neither says."""
    limits = [limit for limit in (positions_of(draft), positions_of(target)) if limit is not None]
    return min(limits, default=None)


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
                         f"vocab sizes {len(draft_vocab)} vs {len(target_vocab)}, {differ} differing entries; "
                         f"{CROSS_HINT}")
    if special_ids(draft_tok) != special_ids(target_tok):
        raise ValueError(f"draft {spec.draft_tokenizer!r} and target {spec.target_tokenizer!r} tokenizers have "
                         f"different special tokens: {special_ids(draft_tok)} vs {special_ids(target_tok)}; "
                         f"{CROSS_HINT}")


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


def load_shaped_pair(preset: str, tokenizer: PreTrainedTokenizerBase, device: torch.device,
                     dtype: torch.dtype) -> "ModelPair":
    """GPT-2 small drafting for a larger GPT-2, random weights, real tokenizer: the canonical pairs' shapes
    and costs, offline. Acceptance between random models means nothing: measure them at synthetic acceptance."""
    draft_size, target_size = SHAPED_PRESETS[preset]
    draft_model = gpt2_shaped_model(draft_size, device, dtype, seed=0)
    target_model = gpt2_shaped_model(target_size, device, dtype, seed=1)
    return ModelPair(draft=draft_model, target=target_model, tokenizer=tokenizer, name=preset)


def plan_pair(preset: str | None = "embedded", *, draft: str | None = None, target: str | None = None,
              draft_tokenizer: str | None = None, target_tokenizer: str | None = None,
              cross_tokenizer: bool = False, device: str = "auto", dtype: str = "auto") -> PairPlan:
    """Check ``load_pair``'s arguments and read what is known without the weights: the tokenizers and the context
    limit, from the config files. Loads no model, so bad input fails in seconds, in one line."""
    if not isinstance(cross_tokenizer, bool):
        raise TypeError(f"cross_tokenizer must be True or False, got {cross_tokenizer!r}")
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    tokenizer_sources = {"draft_tokenizer": draft_tokenizer, "target_tokenizer": target_tokenizer}
    if preset in SHAPED_PRESETS and draft is None and target is None:
        given = [name for name, source in tokenizer_sources.items() if source is not None]
        if given:
            raise ValueError(f"preset {preset!r} uses GPT-2's tokenizer and takes no {given[0]}=")
        draft_size, target_size = SHAPED_PRESETS[preset]
        configs = GPT2Config(**GPT2_SHAPES[draft_size]), GPT2Config(**GPT2_SHAPES[target_size])
        tokenizer = gpt2_tokenizer()
        return PairPlan(preset, None, torch_device, torch_dtype, left_padded(tokenizer), pair_context_limit(*configs))
    for name, source in tokenizer_sources.items():
        if source is not None:
            check_tokenizer_source(name, source)
    spec = with_tokenizers(resolve_pair_ids(preset, draft, target), draft_tokenizer, target_tokenizer)
    if spec.draft is None:
        return plan_target_alone(spec, torch_device, torch_dtype, cross_tokenizer)
    draft_config, target_config = load_config(spec.draft), load_config(spec.target)
    if draft_config.vocab_size != target_config.vocab_size and not cross_tokenizer:
        raise ValueError(f"draft {spec.draft!r} and target {spec.target!r} have different vocab_size: "
                         f"{draft_config.vocab_size} vs {target_config.vocab_size}; {CROSS_HINT}")
    tokenizer = load_tokenizer(spec.target_tokenizer)
    draft_tok = None
    if spec.draft_tokenizer != spec.target_tokenizer:  # two places; compared by content (two copies are one)
        draft_tok = load_tokenizer(spec.draft_tokenizer)
        if not cross_tokenizer:
            check_same_tokenizer(draft_tok, tokenizer, spec)
            draft_tok = None
        elif same_tokens(draft_tok, tokenizer) and draft_config.vocab_size == target_config.vocab_size:
            draft_tok = None
    # Across tokenizers the drafter keeps its context within the draft's positions: the target's alone bound a row.
    limit = positions_of(target_config) if draft_tok is not None else pair_context_limit(draft_config, target_config)
    return PairPlan(spec.name, spec, torch_device, torch_dtype, left_padded(tokenizer), limit, draft_tok)


def plan_target_alone(spec: PairSpec, device: torch.device, dtype: torch.dtype, cross_tokenizer: bool) -> PairPlan:
    """A target without a draft model: its tokenizer and context; a draft's tokenizer would have nothing to serve."""
    if cross_tokenizer or spec.draft_tokenizer is not None:
        what = "cross_tokenizer=True" if cross_tokenizer else f"draft_tokenizer={spec.draft_tokenizer!r}"
        raise ValueError(f"{what} needs a draft model, and target={spec.target!r} alone has none: give draft= too")
    tokenizer = load_tokenizer(spec.target_tokenizer)
    return PairPlan(spec.name, spec, device, dtype, left_padded(tokenizer), positions_of(load_config(spec.target)))


def with_tokenizers(spec: PairSpec, draft_tokenizer: str | None, target_tokenizer: str | None) -> PairSpec:
    """The spec with its tokenizers taken from where the caller said (the models' own places otherwise)."""
    if draft_tokenizer is None and target_tokenizer is None:
        return spec
    return PairSpec(spec.name, spec.draft, spec.target, draft_tokenizer or spec.draft_tokenizer,
                    target_tokenizer or spec.target_tokenizer)


def check_hub_id(role: str, source: str) -> None:
    """A source that is no local path must be a well-formed hub id."""
    try:
        validate_repo_id(source)
    except HFValidationError:
        raise ModelUnavailableError(
            f"could not load {role} {source!r}: no such directory, and not a Hugging Face hub id (like 'gpt2' or "
            f"'org/name'); {OFFLINE_HINT}") from None


def check_tokenizer_source(role: str, source: object) -> None:
    """A tokenizer source is a local directory holding a tokenizer, or a well-formed hub id."""
    if not isinstance(source, str) or not source.strip():
        raise ValueError(f"{role} must be a hub id or a local tokenizer directory, got {source!r}")
    path = Path(source).expanduser()
    if path.is_dir():
        return
    if path.exists():
        raise ModelUnavailableError(f"could not load {role} {source!r}: it is a file; give the tokenizer's directory")
    check_hub_id(role, source)


def left_padded(tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The tokenizer set to pad on the left, with eos as its pad token when it has none."""
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_pair(preset: str | None = "embedded", *, draft: str | None = None, target: str | None = None,
              draft_tokenizer: str | None = None, target_tokenizer: str | None = None,
              cross_tokenizer: bool = False, device: str = "auto", dtype: str = "auto") -> ModelPair:
    """Load a draft/target pair sharing one tokenizer (left padding, pad = eos when it has none), or with
    ``target`` alone a target without a draft model (``pair.draft`` None); its arguments are checked first
    (``plan_pair``). ``draft_tokenizer`` / ``target_tokenizer`` load the tokenizers from elsewhere
    than the models. ``cross_tokenizer=True`` lets the two tokenizers and vocabularies differ (the pair then
    only suits ``specdec.CrossTokenizerDrafter``); the pair's ``draft_tokenizer`` is the draft's."""
    plan = plan_pair(preset, draft=draft, target=target, draft_tokenizer=draft_tokenizer,
                     target_tokenizer=target_tokenizer, cross_tokenizer=cross_tokenizer, device=device, dtype=dtype)
    if plan.spec is None:
        return load_shaped_pair(preset, plan.tokenizer, plan.device, plan.dtype)
    draft_model = None if plan.spec.draft is None else load_model(plan.spec.draft, plan.device, plan.dtype)
    target_model = load_model(plan.spec.target, plan.device, plan.dtype)
    return ModelPair(draft=draft_model, target=target_model, tokenizer=plan.tokenizer, name=plan.name,
                     draft_tokenizer=plan.draft_tokenizer)
