"""Hydra callbacks of experiments.run (registered in configs/hydra/default.yaml)."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class CheckOutputDirectory(Callback):
    """Fail in one line (exit 2) when the run or sweep directory cannot be created or written, before Hydra tries
    and prints a traceback, and before anything is loaded."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        exit_unless_writable("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        exit_unless_writable("hydra.sweep.dir", config.hydra.sweep.dir)


def exit_unless_writable(key: str, directory: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as err:
        print(f"config error: {key}={directory!r} cannot be created or written ({err.strerror or err}); "
              f"choose another with {key}=<path>", file=sys.stderr)
        sys.exit(2)
