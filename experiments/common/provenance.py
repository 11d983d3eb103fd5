"""What produced a run's rows (``specdec.results.Provenance``): the code (git commit, uncommitted changes, library
versions), a content hash of every weight set it ran, the processor, the threads, and the machine's load.

Weights are hashed from their tensors (names, dtypes, shapes, bytes), so the same digits mean the same weights in
the same dtype however they were loaded. A model loaded from a local directory is hashed once per content of its
files: the hash is cached under ``~/.cache/specdec/weight-hashes.json`` (``$XDG_CACHE_HOME`` if set) by the
directory, the dtype and each file's size and modification time, so a run of the embedded pair or of a checkpoint
pays for it once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch
import transformers

REPO = Path(__file__).resolve().parents[2]
DIGITS = 16


@functools.cache
def code_provenance() -> dict:
    """The git commit of the checkout specdec runs from and whether its tracked files changed (both None outside a
    git checkout), and the versions of specdec, torch and transformers."""
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"git_commit": commit, "git_dirty": None if status is None else bool(status),
            "specdec_version": specdec_version(), "torch_version": torch.__version__,
            "transformers_version": transformers.__version__}


def git(*args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def specdec_version() -> str:
    try:
        return metadata.version("specdec")
    except metadata.PackageNotFoundError:
        return "not installed"


def weights_hash(module: torch.nn.Module | None) -> str | None:
    """``DIGITS`` hex digits of SHA-256 over the module's state dict; None for no module. Cached by its files where
    it was loaded from a local directory (``source_directory``)."""
    if module is None:
        return None
    directory = source_directory(module)
    if directory is None:
        return tensors_hash(module)
    dtype = str(next(module.parameters()).dtype)
    key = json.dumps([str(directory), dtype, sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns)
                                                     for f in directory.iterdir() if f.is_file())])
    cache = read_cache()
    if key not in cache:
        cache[key] = tensors_hash(module)
        write_cache(cache)
    return cache[key]


def tensors_hash(module: torch.nn.Module) -> str:
    """SHA-256 over each tensor of the state dict, in name order: its name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        flat = tensor.detach().contiguous().cpu().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
    return digest.hexdigest()[:DIGITS]


def source_directory(module: torch.nn.Module) -> Path | None:
    """The local directory a transformers model was loaded from, None for one from the hub or built in memory."""
    name = getattr(getattr(module, "config", None), "_name_or_path", "") or ""
    path = Path(name)
    return path.resolve() if name and path.is_dir() else None


def cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specdec" / "weight-hashes.json"


def read_cache() -> dict:
    try:
        cache = json.loads(cache_path().read_text())
    except (OSError, ValueError):
        return {}
    return cache if isinstance(cache, dict) else {}


def write_cache(cache: dict) -> None:
    """Best effort: a cache that cannot be written costs a hash next time, nothing else."""
    path = cache_path()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(cache))
        temporary.replace(path)
    except OSError:
        pass


def drafter_modules(drafter, target: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules a drafter holds apart from the target (a draft model, EAGLE or Medusa heads); none for a drafter
    that runs no weights of its own (n-gram, the target's own layers)."""
    modules = drafter.models() + [value for value in vars(drafter).values() if isinstance(value, torch.nn.Module)]
    unique = {id(module): module for module in modules if module is not target}
    return list(unique.values())


def drafter_weights_hash(drafter, target: torch.nn.Module) -> str | None:
    """``weights_hash`` of each of the drafter's own modules, hashed together; None where it holds none."""
    hashes = [weights_hash(module) for module in drafter_modules(drafter, target)]
    if not hashes:
        return None
    return hashes[0] if len(hashes) == 1 else hashlib.sha256("|".join(sorted(hashes)).encode()).hexdigest()[:DIGITS]


def processor_name(device: torch.device) -> str:
    """The GPU's name on CUDA, else the CPU's model name (from /proc/cpuinfo on Linux)."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def load_average() -> float | None:
    """The machine's 1-minute load average; None where the system gives none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None
