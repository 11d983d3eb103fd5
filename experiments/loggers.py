"""Remote loggers. The run directory is the source of truth; a logger only mirrors it.

``NullLogger`` does nothing. ``WandbLogger`` imports wandb only when a run starts, and turns any wandb failure
(import, init, log, finish) into one warning, after which it stays silent and the run goes on.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path


class WandbWarning(UserWarning):
    """W&B failed; logging to it stopped for this run (local files are unaffected)."""


class NullLogger:
    """Logs nothing (logger=none)."""

    def start(self, run_id: str, group: str, name: str, config: dict, run_dir: Path) -> None:
        """Nothing to open."""

    def log_row(self, row: dict, index: int) -> None:
        """Rows are already in rows.jsonl."""

    def finish(self, rows: list[dict], summary: dict, failed: bool = False) -> None:
        """Nothing to close."""


class WandbLogger:
    """Weights & Biases: resolved config, one step per prompt row, a ``rows`` table and the summary at the end."""

    def __init__(
        self,
        project: str = "specdec",
        entity: str | None = None,
        group: str | None = None,
        mode: str = "offline",
        tags: list[str] | tuple[str, ...] = (),
        dir: str | None = None,  # noqa: A002 - wandb's own name for it
        init_timeout: float = 15.0,
    ):
        """``init_timeout``: seconds ``wandb.init`` may wait for its service or server (W&B's own default is 90,
        which an unreachable server costs every run); past it W&B logging is off with one warning."""
        if isinstance(init_timeout, bool) or not isinstance(init_timeout, (int, float)) or not init_timeout > 0:
            raise ValueError(f"init_timeout must be a number of seconds > 0, got {init_timeout!r}")
        if init_timeout == math.inf:
            raise ValueError("init_timeout must be a finite number of seconds, got inf: W&B could then wait for ever")
        self.init_timeout = float(init_timeout)
        self.project, self.entity, self.group, self.mode = project, entity, group, mode
        self.tags, self.dir = list(tags), dir
        self.run = None
        self.failed = False

    def start(self, run_id: str, group: str, name: str, config: dict, run_dir: Path) -> None:
        """Open (or, for a resumed run, reopen) the W&B run with id ``run_id``."""
        def init():
            import wandb

            directory = self.dir or os.environ.get("WANDB_DIR") or str(run_dir)
            Path(directory).mkdir(parents=True, exist_ok=True)
            self.run = wandb.init(
                project=self.project,
                entity=self.entity,
                group=self.group or group,
                mode=self.mode,
                tags=self.tags,
                dir=directory,
                id=run_id,
                name=name,
                resume="allow",
                reinit="finish_previous",
                config=config,
                settings=wandb.Settings(silent=True, console="off", init_timeout=self.init_timeout),
            )
            self.run.define_metric("prompt_index")
            self.run.define_metric("*", step_metric="prompt_index")

        self.guard("init", init)

    def log_row(self, row: dict, index: int) -> None:
        """One step per prompt: every numeric column, and per-position acceptance as position_1..k."""
        def log():
            data = {key: value for key, value in row.items() if is_scalar_number(value)}
            for position, value in enumerate(row.get("per_position_acceptance") or [], 1):
                if value is not None:
                    data[f"per_position_acceptance/{position}"] = value
            data["prompt_index"] = index
            self.run.log(data)

        if self.run is not None:
            self.guard("log", log)

    def finish(self, rows: list[dict], summary: dict, failed: bool = False) -> None:
        """All rows as a ``rows`` table, the summary, then close the run."""
        def finish():
            import wandb

            if rows:
                columns = list(dict.fromkeys(key for row in rows for key in row))
                data = [[table_cell(row.get(column)) for column in columns] for row in rows]
                self.run.log({"rows": wandb.Table(columns=columns, data=data)})
            self.run.summary.update(flatten(summary))
            self.run.finish(exit_code=1 if failed else 0)

        if self.run is not None:
            self.guard("finish", finish)
            self.run = None

    def guard(self, what: str, action) -> None:
        """Run a wandb call; on any failure warn once and stop logging to W&B."""
        if self.failed:
            return
        try:
            action()
        except Exception as err:  # noqa: BLE001 - any wandb failure must not end the run
            self.failed = True
            message = " ".join(f"{type(err).__name__}: {err}".split())
            warnings.warn(f"W&B {what} failed, W&B logging off for this run ({message}); rows.jsonl is unaffected",
                          WandbWarning, stacklevel=3)
            if self.run is not None:
                try:
                    self.run.finish(exit_code=1)
                except Exception:  # noqa: BLE001
                    pass
                self.run = None


def is_scalar_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table_cell(value):
    """W&B table cells are scalars: lists go in as JSON text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def flatten(data: dict, prefix: str = "") -> dict:
    """{"metrics": {"speedup": {"mean": 1}}} -> {"metrics/speedup/mean": 1}."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
