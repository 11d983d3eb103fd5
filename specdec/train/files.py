"""Durable writes of the training package: every file is written beside its path, fsynced, and renamed over it,
then the directory is fsynced, so a kill leaves the old file or the new one, never a part of either."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


class DamagedFile(RuntimeError):
    """A file the training package wrote cannot be read as written: one line naming it and what to do."""


def durable_rename(partial: Path, path: Path) -> None:
    """Rename the fsynced ``partial`` over ``path`` and make the rename durable."""
    partial.replace(path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:  # file systems that cannot fsync a directory are left as they are
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def replace_bytes(path: Path, data: bytes) -> None:
    """``path`` holds ``data``, whole, or what it held before."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    durable_rename(partial, path)


def save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """A safetensors file, whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, str(partial))
    with open(partial, "rb") as handle:
        os.fsync(handle.fileno())
    durable_rename(partial, path)


def save_state(state: dict, path: Path) -> None:
    """A ``torch.save`` file, whole or not at all."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as handle:
        torch.save(state, handle)
        handle.flush()
        os.fsync(handle.fileno())
    durable_rename(partial, path)


def load_tensors(path: Path, shapes: dict[str, tuple[int | None, ...]], remedy: str,
                 below: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file this package wrote, checked: each name in ``shapes`` present with that
    shape (None: any size there), and the integer tensors named in ``below`` within [0, bound); anything else is a
    ``DamagedFile`` naming ``path`` and ``remedy``."""
    try:
        tensors = load_file(str(path))
    except Exception as err:  # noqa: BLE001 - safetensors raises several kinds over a damaged file
        raise DamagedFile(f"{path} is damaged ({' '.join(str(err).split())[:160]}): {remedy}") from None
    for name, shape in shapes.items():
        tensor = tensors.get(name)
        if tensor is None or tensor.ndim != len(shape) or any(want is not None and have != want
                                                                for have, want in zip(tensor.shape, shape)):
            found = "no such tensor" if tensor is None else f"shape {list(tensor.shape)}"
            raise DamagedFile(f"{path} is damaged: {name!r} should have shape "
                              f"{['*' if want is None else want for want in shape]}, has {found}: {remedy}")
    for name, bound in (below or {}).items():
        values = tensors[name]
        if values.numel() and (int(values.min()) < 0 or int(values.max()) >= bound):
            raise DamagedFile(f"{path} is damaged: {name!r} holds values outside [0, {bound}): {remedy}")
    return tensors
