"""Durable writes of the training package: every file is written beside its path, fsynced, and renamed over it,
then the directory is fsynced, so a kill leaves the old file or the new one, never a part of either."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import torch
from safetensors.torch import save_file


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
