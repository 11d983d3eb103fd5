"""Trained drafters on disk, each naming the target it was trained for.

A checkpoint is a directory: ``weights.safetensors`` (the drafter's own parameters: an EAGLE head, Medusa heads, or
a whole distilled draft model) and ``drafter.json``: its kind, the options that rebuild it, what training said of it,
and the target it belongs to (``TargetIdentity``: architecture, size, and a fingerprint of its weights). Loading it
for another target is refused in one line; a draft model is saved with ``save_pretrained`` beside the same file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_FILE = "drafter.json"
WEIGHTS_FILE = "weights.safetensors"
FINGERPRINT_VALUES = 4096  # values sampled from each parameter for the fingerprint
OPTIONS_KEY = "options"  # the weights file's metadata: the options they were trained with, as JSON
IDENTITY_FIELDS = ("architecture", "num_parameters", "fingerprint")


class CheckpointNotFoundError(FileNotFoundError, ValueError):
    """A checkpoint directory without a drafter in it: a missing file, and a bad argument for the callers that
    refuse those (the apps' one refusal path turns every ValueError into one line)."""


@dataclass(frozen=True)
class TargetIdentity:
    """What a trained drafter knows of its target: enough to refuse another one."""

    architecture: str  # the model's class
    num_parameters: int
    fingerprint: str  # sha256 over every parameter's name, shape and a strided sample of its values (bfloat16)

    def describe(self) -> str:
        return f"{self.architecture} ({self.num_parameters / 1e6:.2f} M parameters, weights {self.fingerprint[:12]})"


def target_identity(target: nn.Module) -> TargetIdentity:
    """The identity of ``target``'s weights, the same on any device and in any of fp32, fp16 and bf16 (values are
    rounded to bfloat16 before hashing)."""
    digest = hashlib.sha256()
    total = 0
    for name, parameter in sorted(target.named_parameters(remove_duplicate=True)):
        flat = parameter.detach().reshape(-1)
        total += flat.numel()
        stride = max(flat.numel() // FINGERPRINT_VALUES, 1)
        sample = flat[::stride][:FINGERPRINT_VALUES].to(torch.bfloat16).float().cpu()
        digest.update(f"{name}:{tuple(parameter.shape)}:".encode())
        digest.update(sample.numpy().tobytes())
    return TargetIdentity(type(target).__name__, total, digest.hexdigest())


def save_drafter(directory: str | Path, kind: str, module: nn.Module, options: dict, target: nn.Module,
                 training: dict | None = None, dtype: torch.dtype | None = None) -> Path:
    """Write ``module``'s parameters (in ``dtype``, default theirs) and its config to ``directory``, atomically
    per file (written beside, then renamed: a kill never leaves half a file)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    # Cloned: tied tensors (a one-block body's tied embedding and head) are saved once each, as safetensors asks.
    tensors = {name: (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor)
               .detach().cpu().clone() for name, tensor in module.state_dict().items()}
    partial = directory / (WEIGHTS_FILE + ".partial")
    save_file(tensors, str(partial), metadata={OPTIONS_KEY: canonical(options)})
    partial.replace(directory / WEIGHTS_FILE)
    config = {"kind": kind, "options": options, "target": asdict(target_identity(target)), "training": training or {}}
    partial = directory / (CONFIG_FILE + ".partial")
    partial.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    partial.replace(directory / CONFIG_FILE)
    return directory


def save_draft_model(directory: str | Path, draft: nn.Module, target: nn.Module, training: dict | None = None) -> Path:
    """A whole draft model (a distilled one) with ``save_pretrained``, and beside it the config naming its target."""
    directory = Path(directory)
    draft.save_pretrained(directory)
    config = {"kind": "model", "options": {}, "target": asdict(target_identity(target)), "training": training or {}}
    partial = directory / (CONFIG_FILE + ".partial")
    partial.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    partial.replace(directory / CONFIG_FILE)
    return directory


def load_draft_model(directory: str | Path, target: nn.Module) -> nn.Module:
    """The draft model saved in ``directory`` for ``target`` (refused in one line for another target), on the
    target's device and in its dtype, in eval mode."""
    from transformers import AutoModelForCausalLM

    config = read_drafter_config(directory, "model")
    check_target(directory, config, target)
    parameter = next(target.parameters())
    model = AutoModelForCausalLM.from_pretrained(str(directory), dtype=parameter.dtype)
    return model.to(parameter.device).eval().requires_grad_(False)


def read_drafter_config(directory: str | Path, kind: str) -> dict:
    """A checkpoint's config, refusing in one line a directory that holds none or another kind of drafter."""
    path = Path(directory) / CONFIG_FILE
    if not path.is_file():
        raise CheckpointNotFoundError(f"{directory} holds no trained drafter ({CONFIG_FILE} is missing); train one with "
                                f"python -m experiments.train_drafter")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} cannot be read as a drafter config: {error}") from None
    check_config_fields(path, config)
    if config["kind"] != kind:
        raise ValueError(f"{directory} holds a {config['kind']!r} drafter, not a {kind!r} one")
    return config


def check_config_fields(path: Path, config: object) -> None:
    """A drafter config is an object with a kind, its options (an object) and its target's identity."""
    damaged = f"{path} is damaged: restore it from the run that trained the drafter, or train again"
    if not isinstance(config, dict):
        raise ValueError(f"{damaged} (it holds a JSON {type(config).__name__}, not an object)")
    missing = [key for key in ("kind", "options", "target") if key not in config]
    if missing:
        raise ValueError(f"{damaged} (no {', '.join(repr(key) for key in missing)})")
    if not isinstance(config["options"], dict):
        raise ValueError(f"{damaged} (its 'options' is not an object)")
    target = config["target"]
    if not isinstance(target, dict) or sorted(target) != sorted(IDENTITY_FIELDS):
        raise ValueError(f"{damaged} (its 'target' must hold exactly {', '.join(IDENTITY_FIELDS)})")


def check_target(directory: str | Path, config: dict, target: nn.Module) -> None:
    """Refuse, in one line, a target other than the one the checkpoint was trained for."""
    saved = TargetIdentity(**config["target"])
    actual = target_identity(target)
    if saved != actual:
        raise ValueError(f"the drafter in {directory} was trained for {saved.describe()}; this target is "
                         f"{actual.describe()}")


def saved_draft_ids(directory: str | Path, options: dict, target: nn.Module) -> list[int] | None:
    """Stand-in draft ids that build a head of the saved reduced draft vocabulary's size (``options["draft_vocab"]``;
    ``load_weights`` then puts the saved ids in place), or None for the whole vocabulary. A size that does not fit
    the target's vocabulary is refused in one line, naming the checkpoint."""
    size = options.get("draft_vocab")
    if size is None:
        return None
    vocab_size = target.get_output_embeddings().weight.shape[0]
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= vocab_size:
        raise ValueError(f"the drafter in {directory} drafts from a reduced vocabulary of {size!r} tokens; this "
                         f"target's vocabulary holds {vocab_size}: a draft vocabulary must be an integer in [1, "
                         f"{vocab_size}]")
    return list(range(size))


def load_weights(directory: str | Path, module: nn.Module) -> nn.Module:
    """``module`` with the checkpoint's parameters (cast to the module's dtype and device), in eval mode. Refused
    in one line where the module, built from ``drafter.json``'s options, is not what the weights were saved as."""
    path = Path(directory) / WEIGHTS_FILE
    check_saved_options(path, getattr(module, "options", None))
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError) as error:
        raise unreadable(path, error) from None
    own = module.state_dict()
    # An empty buffer (a head's draft ids over the whole vocabulary) holds nothing to load: checkpoints saved before
    # heads had one lack it, and still load.
    state = {**{name: own[name] for name in set(own) - set(state) if own[name].numel() == 0}, **state}
    unknown = sorted(set(state) ^ set(own))
    if unknown:
        raise ValueError(f"the weights in {directory} do not fit this drafter's options: {unknown[:4]} differ")
    misshapen = [name for name in state if state[name].shape != own[name].shape]
    if misshapen:
        name = misshapen[0]
        raise ValueError(f"the weights in {directory} do not fit this drafter's options: {name} is "
                         f"{list(state[name].shape)} there, {list(own[name].shape)} here")
    module.load_state_dict({name: tensor.to(own[name].device, own[name].dtype) for name, tensor in state.items()})
    return module.eval().requires_grad_(False)


def check_saved_options(path: Path, options: dict | None) -> None:
    """The options the weights were saved with (their file's metadata; files from before it was written hold none)
    against ``options``: an edited ``drafter.json`` whose shapes still match would load wrong weights silently."""
    if not path.is_file():
        raise CheckpointNotFoundError(f"{path} is missing: the drafter in {path.parent} has a config but no weights; "
                                f"train it again")
    try:
        with safe_open(str(path), "pt") as weights:
            saved = (weights.metadata() or {}).get(OPTIONS_KEY)
    except (OSError, SafetensorError) as error:
        raise unreadable(path, error) from None
    if saved is not None and options is not None and saved != canonical(options):
        raise ValueError(f"{path.parent / CONFIG_FILE} gives options {canonical(options)}, but its weights were saved "
                         f"with {saved}: restore the file's options (or train again)")


def unreadable(path: Path, error: Exception) -> ValueError:
    reason = (str(error).splitlines() or [type(error).__name__])[0][:160]
    return ValueError(f"{path} cannot be read ({reason}): restore it from the run that trained the drafter, or train "
                      f"again")


def canonical(options: dict) -> str:
    """Options as one comparable JSON line (keys sorted)."""
    return json.dumps(options, sort_keys=True)
