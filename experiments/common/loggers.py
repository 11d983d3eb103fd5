"""Remote loggers. The run directory is the source of truth; a logger only mirrors it.

``NullLogger`` does nothing. ``WandbLogger`` imports wandb only when a run starts, and turns any wandb failure
(import, init, log, finish) into one warning, after which it stays silent and the run goes on.

What W&B holds (``WandbLogger``): the config as resolved (config.yaml, then the device, dtype and k the run loaded);
one history step per prompt, its numbers under ``prompt/`` (so that the run summary, which W&B fills with each
key's last value, never shows the last prompt's figure as the run's); and at the end the run summary: the run's
pooled figures under their plain names (``speedup``, ``acceptance_rate``, ``mean_accepted_length``, ...) with
their intervals, per-position acceptance and the accepted histogram, and summary.json whole under ``summary/``.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from pathlib import Path

from specdec.results import POOLED_FIGURES, json_ready


class WandbWarning(UserWarning):
    """W&B failed; logging to it stopped for this run (local files are unaffected)."""


class NullLogger:
    """Logs nothing (logger=none)."""

    def start(self, run_id: str, group: str, name: str, config: dict, run_dir: Path) -> None:
        """Nothing to open."""

    def update_config(self, values: dict) -> None:
        """config.yaml holds the config."""

    def log_row(self, row: dict, index: int) -> None:
        """Rows are already in rows.jsonl."""

    def finish(self, rows: list[dict], summary: dict, failed: bool = False) -> None:
        """Nothing to close."""


class WandbLogger:
    """Weights & Biases: resolved config, one step per prompt row (under ``prompt/``), a ``rows`` table, and the run's
    figures in the run summary at the end (``run_summary``)."""

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
            self.run.define_metric(f"{PROMPT_PREFIX}*", step_metric="prompt_index")

        self.guard("init", init)

    def update_config(self, values: dict) -> None:
        """What the run resolved once its pair loaded (device, dtype, k), over the config's own values."""
        if self.run is not None:
            self.guard("config", lambda: self.run.config.update(values, allow_val_change=True))

    def log_row(self, row: dict, index: int) -> None:
        """One step per prompt (``prompt_step``)."""
        if self.run is not None:
            self.guard("log", lambda: self.run.log(prompt_step(row, index)))

    def finish(self, rows: list[dict], summary: dict, failed: bool = False) -> None:
        """All rows as a ``rows`` table, per-position acceptance and the accepted histogram as tables, the run
        summary (``run_summary``), then close the run."""
        def finish():
            import wandb

            if rows:
                columns = list(dict.fromkeys(key for row in rows for key in row))
                data = [[table_cell(row.get(column)) for column in columns] for row in rows]
                self.run.log({"rows": wandb.Table(columns=columns, data=data), **figure_tables(summary, wandb.Table)})
            self.run.summary.update(run_summary(json_ready(summary)))
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


PROMPT_PREFIX = "prompt/"  # where each prompt's numbers go in the history
# The run's figures under their plain names in the run summary: the pooled ones (specdec.results.POOLED_FIGURES:
# vLLM's acceptance length and Spec-Bench's speedup among them) and the one predicted speedup.
PLAIN_FIGURES = tuple(POOLED_FIGURES)


def prompt_step(row: dict, index: int) -> dict:
    """A prompt's history step: every numeric column (booleans and nulls are not sent) and each position of
    per-position acceptance, under ``prompt/``, and the prompt index."""
    data = {f"{PROMPT_PREFIX}{key}": value for key, value in row.items() if is_scalar_number(value)}
    for position, value in enumerate(row.get("per_position_acceptance") or [], 1):
        if value is not None:
            data[f"{PROMPT_PREFIX}per_position_acceptance/{position}"] = value
    return data | {"prompt_index": index}


def run_summary(summary: dict) -> dict:
    """W&B's run summary from summary.json: each pooled figure under its plain name (``speedup``) with
    ``<name>/ci_low`` and ``<name>/ci_high``, each per-prompt mean under ``per_prompt/<name>``, pooled per-position
    acceptance as ``per_position_acceptance/<i>`` with ``per_position_attempts/<i>``, the accepted histogram as
    ``accepted_histogram/<j>``, with several rounds each pooled figure's spread between them
    (``<name>/between_rounds_min``, ``_max``, ``_sd``), the short prompts' count, every number at summary.json's top level under its own
    name (a training run's ``simulated_tau``), and summary.json whole under ``summary/``."""
    flat = {f"summary/{key}": value for key, value in flatten(summary).items()}
    flat |= {key: value for key, value in summary.items() if is_scalar_number(value)}
    pooled, means = summary.get("pooled") or {}, summary.get("metrics") or {}
    for name in PLAIN_FIGURES:
        if name in pooled:
            figure = pooled[name]
            flat |= {name: figure["value"], f"{name}/ci_low": figure["ci_low"], f"{name}/ci_high": figure["ci_high"]}
    if "predicted_speedup" in pooled:  # a model's figure: no interval
        flat["predicted_speedup"] = pooled["predicted_speedup"]["value"]
    for name, mean in means.items():
        flat[f"per_prompt/{name}"] = mean["mean"]
    spread = summary.get("between_rounds") or {}
    for name in POOLED_FIGURES:
        if name in spread and spread.get("replicates", 1) > 1:
            flat |= {f"{name}/between_rounds_{stat}": spread[name][stat] for stat in ("min", "max", "sd")}
    for position, figure in enumerate(pooled.get("per_position_acceptance") or [], 1):
        flat |= {f"per_position_acceptance/{position}": figure["value"],
                 f"per_position_attempts/{position}": figure["attempts"]}
    for accepted, steps in enumerate(pooled.get("accepted_histogram") or []):
        flat[f"accepted_histogram/{accepted}"] = steps
    if "short_prompts" in summary:
        flat["short_prompts"] = summary["short_prompts"]["count"]
    return flat


def figure_tables(summary: dict, table) -> dict:
    """Pooled per-position acceptance (with its interval and count) and the accepted histogram as W&B tables, for
    charts; none where the summary has none (a failed run)."""
    pooled = summary.get("pooled") or {}
    tables = {}
    if pooled.get("per_position_acceptance"):
        tables["per_position_acceptance"] = table(
            columns=["position", "acceptance", "ci_low", "ci_high", "attempts"],
            data=[[i, f["value"], f["ci_low"], f["ci_high"], f["attempts"]]
                  for i, f in enumerate(pooled["per_position_acceptance"], 1)])
    if pooled.get("accepted_histogram"):
        tables["accepted_histogram"] = table(columns=["accepted", "steps"],
                                             data=[[j, n] for j, n in enumerate(pooled["accepted_histogram"])])
    return tables


def is_scalar_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def table_cell(value):
    """W&B table cells are scalars: lists go in as JSON text."""
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def flatten(data: dict, prefix: str = "") -> dict:
    """{"metrics": {"speedup": {"mean": 1}}} -> {"metrics/speedup/mean": 1}; a list of objects (pooled per-position
    acceptance) by index: {"a": [{"value": 1}]} -> {"a/1/value": 1}."""
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}/"))
        elif isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            flat.update(flatten({str(i): item for i, item in enumerate(value, 1)}, f"{prefix}{key}/"))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


# Training loggers --------------------------------------------------------------------------------------------------

class NullTrainingLogger(NullLogger):
    """Logs nothing (logger=none): the run directory holds everything."""

    def log_step(self, data: dict, step: int) -> None:
        """log.jsonl already has it."""


class WandbTrainingLogger(WandbLogger):
    """W&B for training (logger=wandb; offline unless told): one W&B step per optimizer step, the summary at the
    end. Any wandb failure warns once and logging stops; training goes on."""

    def start(self, run_id: str, group: str, name: str, config: dict, run_dir: Path) -> None:
        super().start(run_id, group, name, config, run_dir)
        if self.run is not None:
            self.guard("init", lambda: self.run.define_metric("*", step_metric="step"))

    def log_step(self, data: dict, step: int) -> None:
        if self.run is not None:
            self.guard("log", lambda: self.run.log({**data, "step": step}))
