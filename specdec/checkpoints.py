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
from safetensors.torch import load_file, save_file
from torch import nn

CONFIG_FILE = "drafter.json"
WEIGHTS_FILE = "weights.safetensors"
FINGERPRINT_VALUES = 4096  # values sampled from each parameter for the fingerprint


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
    save_file(tensors, str(partial))
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
        raise FileNotFoundError(f"{directory} holds no trained drafter ({CONFIG_FILE} is missing); train one with "
                                f"python -m experiments.train_drafter")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} cannot be read as a drafter config: {error}") from None
    if config.get("kind") != kind:
        raise ValueError(f"{directory} holds a {config.get('kind')!r} drafter, not a {kind!r} one")
    return config


def check_target(directory: str | Path, config: dict, target: nn.Module) -> None:
    """Refuse, in one line, a target other than the one the checkpoint was trained for."""
    saved = TargetIdentity(**config["target"])
    actual = target_identity(target)
    if saved != actual:
        raise ValueError(f"the drafter in {directory} was trained for {saved.describe()}; this target is "
                         f"{actual.describe()}")


def load_weights(directory: str | Path, module: nn.Module) -> nn.Module:
    """``module`` with the checkpoint's parameters (cast to the module's dtype and device), in eval mode."""
    state, own = load_file(str(Path(directory) / WEIGHTS_FILE)), module.state_dict()
    unknown = sorted(set(state) ^ set(own))
    if unknown:
        raise ValueError(f"the weights in {directory} do not fit this drafter's options: {unknown[:4]} differ")
    module.load_state_dict({name: tensor.to(own[name].device, own[name].dtype) for name, tensor in state.items()})
    return module.eval().requires_grad_(False)
