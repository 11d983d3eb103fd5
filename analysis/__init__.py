"""Read specdec results (local run/sweep directories or W&B) into pandas, compare settings, plot, report."""

from analysis.load import (
    DamagedRunWarning,
    PartialRunWarning,
    ResultsError,
    load_runs,
    load_wandb_runs,
    per_position_long,
)
from analysis.summarize import predicted_speedup, summarize_runs
from analysis.tables import pivot_metric, to_markdown
from specdec.results import confidence_interval

__all__ = [
    "DamagedRunWarning",
    "PartialRunWarning",
    "ResultsError",
    "confidence_interval",
    "load_runs",
    "load_wandb_runs",
    "per_position_long",
    "pivot_metric",
    "predicted_speedup",
    "summarize_runs",
    "to_markdown",
]
