"""One row per run: its configuration, its pooled figures with 95% bootstrap intervals (``specdec.results.pooled``,
the figures summary.json leads with) and, per metric, the mean over prompts with a 95% Student t interval."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

import specdec
from analysis.load import MACHINE_COLUMNS, ResultsError, per_position_long
from specdec.results import (
    CONDITION_COLUMNS,
    INTERVAL_METRICS,
    METRIC_COLUMNS,
    OUTPUT_COLUMNS,
    POOLED_FIGURES,
    PROMPT_COLUMNS,
    TIMED_METRICS,
    confidence_interval,
    disagreeing_repeats,
    finite_values,
    pooled,
    replicate_spread,
    round_of,
    too_short,
)
from specdec.stats import vllm_acceptance_length

# A run's predicted speedup is recomputed from its mean acceptance rate and mean cost ratio, not averaged.
SUMMARIZED_METRICS = tuple(metric for metric in INTERVAL_METRICS if metric != "predicted_speedup")
# Metrics derived per prompt from a row's columns (``per_prompt_metrics``), summarised like the others.
DERIVED_METRICS = ("vllm_acceptance_length",)
STAT_COLUMNS = tuple(f"{metric}_{stat}" for metric in SUMMARIZED_METRICS + DERIVED_METRICS
                     for stat in ("mean", "ci_low", "ci_high")) + tuple(
    f"{figure}_{stat}" for figure in POOLED_FIGURES for stat in ("pooled", "pooled_ci_low", "pooled_ci_high")) + tuple(
    f"{figure}_between_{stat}" for figure in POOLED_FIGURES for stat in ("min", "max", "sd"))
# Per-position acceptance pooled over a run's prompts: value, interval and count per position (lists).
PER_POSITION_COLUMNS = ("per_position_pooled", "per_position_ci_low", "per_position_ci_high", "per_position_attempts")
# Summary columns that describe neither a setting nor a summarized metric.
BOOKKEEPING_COLUMNS = ("run_id", "group", "run_dir", "partial", "n_prompts", "predicted_speedup",
                       "per_position_acceptance_mean", "accepted_histogram", "most_concurrent_jobs", "hosts",
                       "short_prompts", "short_prompt_ids", "identical_outputs", "log_likelihood_mean",
                       "baseline_log_likelihood_mean", *PER_POSITION_COLUMNS, "replicates", "processors",
                       "greedy_repeats_disagree", "predicted_drafted_k", "k_histogram", "modelled_step_seconds",
                       "measured_step_seconds")


def predicted_speedup(alpha, k, cost_ratio) -> np.ndarray:
    """``specdec.predicted_speedup`` (Leviathan et al. 2023) element-wise over arrays; NaN where a value is
    undefined or, in hand-edited rows, outside its range (the formula refuses those)."""
    alpha, k, cost_ratio = np.asarray(alpha, dtype=float), np.asarray(k, dtype=int), np.asarray(cost_ratio, dtype=float)
    usable = (alpha >= 0) & (alpha <= 1) & (k >= 0) & (cost_ratio >= 0) & np.isfinite(cost_ratio)  # NaN: False
    speedup = np.full(usable.shape, np.nan)
    speedup[usable] = np.vectorize(specdec.predicted_speedup, otypes=[float])(alpha[usable], k[usable],
                                                                              cost_ratio[usable])
    return speedup


def summarize_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per run: the columns constant within every run, `n_prompts`, `partial`; for each pooled figure
    (``specdec.results.POOLED_FIGURES``: speedup, acceptance rate, tau, tokens/s) `<figure>_pooled`,
    `<figure>_pooled_ci_low`, `<figure>_pooled_ci_high` (95% bootstrap interval over prompts); and for each
    summarized metric `<metric>_mean`, `<metric>_ci_low`, `<metric>_ci_high` (95% t interval over prompts; a timed
    metric leaves out the prompts too short to time, counted in `short_prompts` and named in `short_prompt_ids`).

    Also per-position acceptance pooled (`per_position_pooled`, with `per_position_ci_low`, `per_position_ci_high`
    and the verified positions it rests on, `per_position_attempts`, where rows count them), `identical_outputs`
    (the share of prompts whose two outputs are identical, where rows say: temperature 0),
    `log_likelihood_mean` and `baseline_log_likelihood_mean` (a lossy rule's quality beside the target's own),
    `predicted_speedup` recomputed from the pooled acceptance rate and mean cost ratio,
    `per_position_acceptance_mean` as the per-position mean over prompts, `accepted_histogram` summed over prompts
    (steps of the whole run by drafts kept; empty where rows lack it), `k_histogram` likewise (steps by the k
    drafted), `modelled_step_seconds` and `measured_step_seconds` (a cost-modelling policy's mean per step),
    `vllm_acceptance_length` (mean and interval
    over prompts of 1 + accepted / steps that drafted, from each row's histogram), and, where rows count them,
    `most_concurrent_jobs`: the most jobs of the sweep that ran on the run's machine while it decoded, and
    `hosts`: the machines its rows were decoded on (two when a requeued job moved).
    """
    runs = frame.groupby("run_dir", sort=False)
    config = constant_columns(frame)
    records = []
    for run_dir, rows in runs:
        record = {column: rows[column].iloc[0] for column in config}
        record.update(n_prompts=len(rows), partial=bool(rows["partial"].iloc[0]))
        if "concurrent_jobs" in rows:
            record["most_concurrent_jobs"] = pd.to_numeric(rows["concurrent_jobs"]).max()  # NaN: not counted
        if "host" in rows:
            record["hosts"] = ", ".join(sorted(map(str, rows["host"].dropna().unique())))
        if "processor" in rows:
            record["processors"] = ", ".join(sorted(map(str, rows["processor"].dropna().unique())))
        row_dicts = [{key: none_for_nan(value) for key, value in row.items()} for row in rows.to_dict("records")]
        record.update(pooled_columns(row_dicts))
        record.update(spread_columns(row_dicts))
        timed = rows[[not too_short(row) for row in row_dicts]]
        for metric in SUMMARIZED_METRICS:
            record.update(zip((f"{metric}_mean", f"{metric}_ci_low", f"{metric}_ci_high"),
                              confidence_interval((timed if metric in TIMED_METRICS else rows)[metric],
                                                  metric=metric)))
        histograms = rows["accepted_histogram"] if "accepted_histogram" in rows else pd.Series([], dtype=object)
        record.update(zip(("vllm_acceptance_length_mean", "vllm_acceptance_length_ci_low",
                           "vllm_acceptance_length_ci_high"),
                          confidence_interval(map(vllm_acceptance_length, histograms), metric="mean_accepted_length")))
        record["run_dir"] = run_dir
        records.append(record)
    summary = pd.DataFrame(records)
    summary["per_position_acceptance_mean"] = mean_per_position(frame, summary["run_id"])
    return summary


def spread_columns(records: list[dict]) -> dict:
    """A run's replicates (its rounds; and its seeds' runs where ``pool_replicates`` pooled them): how many
    (``replicates``), each pooled figure's min, max and standard deviation over them (``<figure>_between_min``,
    ...), and the prompts whose greedy repeats disagree in their counts (``greedy_repeats_disagree``)."""
    spread = replicate_spread(records, lambda row: row.get("replicate") or round_of(row))
    columns = {"replicates": spread["replicates"],
               "greedy_repeats_disagree": ", ".join(disagreeing_repeats(records))}
    for figure in POOLED_FIGURES:
        columns.update({f"{figure}_between_{stat}": spread[figure][stat] for stat in ("min", "max", "sd")})
    return columns


def pooled_columns(records: list[dict]) -> dict:
    """A run's pooled figures (``specdec.results.pooled``) as summary columns, with its short prompts, per-position
    acceptance pooled, and what its outputs say (identical at temperature 0; mean log-likelihoods). ``records``
    are the run's rows as read from JSON (None where a value is missing)."""
    figures = pooled(records)
    columns = {f"{figure}_{stat}": figures[figure][key] for figure in POOLED_FIGURES
               for stat, key in (("pooled", "value"), ("pooled_ci_low", "ci_low"), ("pooled_ci_high", "ci_high"))}
    columns["predicted_speedup"] = figures["predicted_speedup"]["value"]
    columns["predicted_drafted_k"] = figures["predicted_speedup"]["drafted_k"]
    short = [str(row["prompt_id"]) for row in records if too_short(row)]
    positions = figures["per_position_acceptance"]
    identical = [row.get("identical_output") for row in records if isinstance(row.get("identical_output"), bool)]
    return columns | {
        "accepted_histogram": figures["accepted_histogram"], "k_histogram": figures["k_histogram"],
        "modelled_step_seconds": figures["step_seconds"]["modelled"],
        "measured_step_seconds": figures["step_seconds"]["measured"], "short_prompts": len(short),
        "short_prompt_ids": ", ".join(short),
        "per_position_pooled": [p["value"] for p in positions], "per_position_ci_low": [p["ci_low"] for p in positions],
        "per_position_ci_high": [p["ci_high"] for p in positions],
        "per_position_attempts": [p["attempts"] for p in positions],
        "identical_outputs": sum(identical) / len(identical) if identical else math.nan,
        "log_likelihood_mean": mean_of(row.get("log_likelihood") for row in records),
        "baseline_log_likelihood_mean": mean_of(row.get("baseline_log_likelihood") for row in records),
    }


def none_for_nan(value):
    """A frame's NaN (a missing or null column) as the None a row read from JSON holds."""
    return None if isinstance(value, float) and math.isnan(value) else value


def mean_of(values) -> float:
    found = finite_values(values)
    return sum(found) / len(found) if found else math.nan


def constant_columns(frame: pd.DataFrame) -> list[str]:
    """Non-metric columns with one value (null counts as one) within every run, in frame order."""
    excluded = (set(METRIC_COLUMNS) | set(PROMPT_COLUMNS) | set(CONDITION_COLUMNS) | set(OUTPUT_COLUMNS)
                | set(MACHINE_COLUMNS) | {"run_dir", "partial", "replicate"})
    candidates = [column for column in frame.columns if column not in excluded
                  and not frame[column].map(lambda v: isinstance(v, (list, dict))).any()]  # unhashable
    per_run = frame.groupby("run_dir", sort=False)[candidates].nunique(dropna=False)
    return [column for column in candidates if (per_run[column] <= 1).all()]


def mean_per_position(frame: pd.DataFrame, run_ids: pd.Series) -> list[list[float]]:
    """Per run, the mean over prompts of a_i at each position (prompts that never reached i are skipped)."""
    means = per_position_long(frame).groupby(["run_id", "position"])["acceptance"].mean()
    by_run = {run_id: group.tolist() for run_id, group in means.groupby(level="run_id")}
    return [by_run.get(run_id, []) for run_id in run_ids]


def config_columns(summary: pd.DataFrame) -> list[str]:
    """Setting columns of a summary: everything that is neither bookkeeping nor a metric statistic."""
    return [column for column in summary.columns if column not in BOOKKEEPING_COLUMNS + STAT_COLUMNS]


def varying_axes(summary: pd.DataFrame, exclude: tuple[str, ...] = ()) -> list[str]:
    """Setting columns taking more than one value across runs, in column (schema) order.

    A column determined by an earlier one is left out so labels stay short: temperature when sampling presets
    vary, or an option's own parameters (draft_length_k0 when draft_length varies). k never is, as plots are
    drawn along it.
    """
    axes: list[str] = []
    for column in config_columns(summary):
        if column in exclude or summary[column].nunique(dropna=False) < 2:
            continue
        if column == "k" or not any(determined_by(summary, kept, column) for kept in axes):
            axes.append(column)
    return axes


def determined_by(summary: pd.DataFrame, a: str, b: str) -> bool:
    """Whether each value of column a comes with a single value of column b across runs."""
    pairs = len(summary[[a, b]].drop_duplicates())
    return pairs == summary[a].nunique(dropna=False)


def plot_axes(summary: pd.DataFrame, x: str | None = None, hue: str | None = None) -> tuple[str, list[str]]:
    """The axis a sweep's plots and pivots run along, and the settings they draw apart (the hue).

    x: ``x`` if given; else k where k varies; else the first numeric setting that varies and holds a value for
    every run (temperature, a strategy's lenience, batch size, ...; not a parameter only some options have); else
    the first setting that varies; else k. The hue: ``hue`` if given,
    else every other varying setting that is not x under another name (a temperature sweep's sampling label is its
    temperature in words). A name the summary lacks is one ResultsError listing what varies.
    """
    axes = varying_axes(summary)
    x, hue = as_column(summary, x), as_column(summary, hue)
    for name, given in (("--x", x), ("--hue", hue)):
        if given is not None and given not in config_columns(summary):
            raise ResultsError(f"{name} {given}: no such setting in these runs; settings that vary: "
                               f"{', '.join(axes) or 'none'}")
    if x is None:
        numeric = [column for column in config_columns(summary) if summary[column].nunique(dropna=False) > 1
                   and summary[column].notna().all() and pd.api.types.is_numeric_dtype(summary[column])
                   and not pd.api.types.is_bool_dtype(summary[column])]
        x = "k" if "k" in axes else (numeric or axes or ["k"])[0]
    if hue is not None:
        return x, [hue] if hue != x else []
    return x, [axis for axis in varying_axes(summary, exclude=(x,)) if axis in PARTS
               or not (determined_by(summary, x, axis) and determined_by(summary, axis, x))]


# The parts a run is built of: kept in a sweep's labels even where they come one-to-one with x (a draft-length
# policy sweep whose policies each hold their own k is labelled by policy and k, not by k alone).
PARTS = ("system", "drafter", "strategy", "draft_length")


def as_column(summary: pd.DataFrame, key: str | None) -> str | None:
    """A swept key as typed on the command line, as its column: ``draft_length.k`` is ``k``, ``strategy.lenience``
    is ``strategy_lenience``, ``sampling.temperature`` is ``temperature``; a column name stays itself."""
    if key is None or key in summary.columns or "." not in key:
        return key
    group, name = key.split(".", 1)
    for column in (f"{group}_{name.replace('.', '_')}", name):
        if column in summary.columns:
            return column
    return key


def setting_label(row: pd.Series, axes: list[str]) -> str:
    """'strategy=typical, T=0.7' for the given axes (the sampling label is its values already); the strategy alone
    when no axis varies."""
    if not axes:
        return str(row["strategy"])
    return ", ".join(format_value(row[axis]) if axis == "sampling" else f"{axis}={format_value(row[axis])}"
                     for axis in axes)


def format_value(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "none"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


# summary.csv (``summarize_runs``, one row per setting) column by column: (column or pattern, meaning). "pooled"
# means totals over the setting's rows (every prompt, round and pooled seed), "per-prompt" a mean of each row's own
# ratio; docs/experiments.md holds ``summary_csv_table()``.
SUMMARY_CSV_COLUMNS = (
    ("<setting columns>", "the rows' setting, constant within each setting: `RunIdentity`'s columns, the options' "
                          "`<group>_<key>`, and the code and weights of `Provenance` (`git_commit`, ..., "
                          "`drafter_weights`), by which runs are never merged"),
    ("seed", "the seed, or the seeds pooled (\"0, 1\"): runs that differ only in seed are one setting"),
    ("run_id, run_dir", "the run, or the runs pooled, joined by \" + \""),
    ("group", "the runs' group (a sweep's name; W&B's group)"),
    ("n_prompts", "rows in the setting: prompts x rounds x runs pooled"),
    ("partial", "whether a run of it has no summary.json (killed)"),
    ("replicates", "its replicates: rounds x runs pooled"),
    ("<figure>_pooled, <figure>_pooled_ci_low, <figure>_pooled_ci_high",
     "each pooled figure (`" + "`, `".join(POOLED_FIGURES) + "`) and its 95% bootstrap interval over prompts and "
     "their replicates, as summary.json's `pooled`"),
    ("<figure>_between_min, <figure>_between_max, <figure>_between_sd",
     "each pooled figure's range and standard deviation over the replicates (the run-to-run spread)"),
    ("<metric>_mean, <metric>_ci_low, <metric>_ci_high",
     "per-prompt means (`" + "`, `".join(SUMMARIZED_METRICS + DERIVED_METRICS) + "`) and their 95% Student t "
     "interval; timings without the prompts too short to time"),
    ("predicted_speedup, predicted_drafted_k", "the one predicted speedup (Leviathan et al.) from the pooled "
                                               "acceptance rate, the k the steps drafted (`predicted_drafted_k`) "
                                               "and the mean cost ratio; summary.json's"),
    ("per_position_pooled, per_position_ci_low, per_position_ci_high, per_position_attempts",
     "a_i pooled (accepted at i / verified at i, lists by position), its interval and the positions verified"),
    ("per_position_acceptance_mean", "a_i as the per-prompt mean (prompts that never reached i skipped)"),
    ("accepted_histogram", "steps by drafts kept, h_0..h_k, summed over the rows"),
    ("k_histogram", "steps by the k they drafted, k = 0..k (0: a plain decode step), summed over the rows"),
    ("modelled_step_seconds, measured_step_seconds", "a cost-modelling policy's (`cost_optimal`) mean modelled and "
                                                     "measured seconds per decode step; summary.json's "
                                                     "`pooled.step_seconds`"),
    ("short_prompts, short_prompt_ids", "the rows too short to time, counted and named"),
    ("identical_outputs", "share of rows (temperature 0) whose output equals the baseline's"),
    ("log_likelihood_mean, baseline_log_likelihood_mean", "a lossy rule's target log-likelihood per token, and the "
                                                          "target's own"),
    ("greedy_repeats_disagree", "prompts whose greedy repeats differ in their counts (empty normally)"),
    ("most_concurrent_jobs, hosts, processors", "where it ran: the most jobs of its sweep at once on its machine, "
                                                 "the machines, their processors"),
)


def summary_csv_table() -> str:
    """The table of docs/experiments.md that documents summary.csv (``SUMMARY_CSV_COLUMNS``)."""
    from specdec.results import markdown_table

    return markdown_table(["column", "meaning"], [[f"`{column}`", meaning]
                                                  for column, meaning in SUMMARY_CSV_COLUMNS]) + "\n"


def documented(column: str) -> bool:
    """Whether a summary.csv column is one ``SUMMARY_CSV_COLUMNS`` names (settings aside)."""
    named = {name.strip() for names, _ in SUMMARY_CSV_COLUMNS for name in names.split(",")}
    figures = {f"{figure}_{stat}" for figure in POOLED_FIGURES
               for stat in ("pooled", "pooled_ci_low", "pooled_ci_high", "between_min", "between_max", "between_sd")}
    means = {f"{metric}_{stat}" for metric in SUMMARIZED_METRICS + DERIVED_METRICS
             for stat in ("mean", "ci_low", "ci_high")}
    return column in named | figures | means
