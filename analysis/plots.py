"""The plots researchers expect from a sweep, each a function (summary or per-prompt frame, PNG path).

Figures are built with `matplotlib.figure.Figure` and saved through Agg, never through pyplot, so importing
this module leaves the caller's backend (e.g. a notebook's) alone and no figure stays open.
The x axis is k where k varies, else what the sweep varies (temperature, lenience, batch size, a drafter, ...:
``analysis.summarize.plot_axes``; ``x=`` and ``hue=`` override it); a setting is a distinct combination of the
other varying settings, labelled by their values: one line per setting along x, or one panel per setting where
the plot already uses its x axis for something else. Figures are pooled over prompts with 95% bootstrap
intervals.
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import numpy as np
import pandas as pd


def import_matplotlib() -> None:
    """Import matplotlib, ignoring an ``MPLBACKEND`` it refuses (matplotlib raises at import on an unknown name;
    figures here are saved through Agg whatever the backend), with one line saying so."""
    try:
        import matplotlib  # noqa: F401
    except ValueError:
        if "MPLBACKEND" not in os.environ:
            raise
        print(f"warning: MPLBACKEND={os.environ.pop('MPLBACKEND')!r} is not a matplotlib backend; ignored (figures "
              f"are drawn with Agg)", file=sys.stderr)
        for name in [name for name in sys.modules if name.split(".")[0] == "matplotlib"]:  # the failed import's
            del sys.modules[name]
        import matplotlib  # noqa: F401


import_matplotlib()

from matplotlib import colormaps  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from analysis.summarize import format_value, plot_axes, setting_label, summarize_runs, varying_axes  # noqa: E402

DODGE = 0.06  # sideways offset between settings, in units of the x axis's spacing
BEST_MARKER = dict(marker="*", markersize=16, markeredgecolor="black", linestyle="none", zorder=5)


def plot_acceptance(data: pd.DataFrame, path: str | Path, x: str | None = None, hue: str | None = None) -> Path:
    """Acceptance rate and mean accepted length (tau), pooled over prompts, along the sweep's x axis (k, or what
    varies: ``analysis.summarize.plot_axes``), one line per setting, 95% bootstrap bars."""
    summary = as_summary(data)
    x, hue_axes = plot_axes(summary, x, hue)
    fig = Figure(figsize=(11, 5), layout="constrained")
    rate_ax, tau_ax = fig.subplots(1, 2)
    for label, color, runs, positions in settings(summary, x, hue_axes):
        errorbar(rate_ax, positions, runs, "acceptance_rate", color, label)
        errorbar(tau_ax, positions, runs, "mean_accepted_length", color, "_nolegend_")
    rate_ax.set(xlabel=axis_label(x), ylabel="acceptance rate A/D", ylim=(0, 1.05), title="Acceptance rate")
    tau_ax.set(xlabel=axis_label(x), ylabel="mean accepted length τ = E/N (tokens per target call)",
               title="Mean accepted length")
    tau_ax.axhline(1, color="grey", linestyle=":", linewidth=1, label="plain decoding (τ = 1)")
    for ax in (rate_ax, tau_ax):
        x_ticks(ax, summary, x)
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title(summary, f"Acceptance vs {axis_label(x)} (pooled over prompts, 95% bootstrap CI)"))
    return save(fig, path)


def plot_speedup(data: pd.DataFrame, path: str | Path, x: str | None = None, hue: str | None = None) -> Path:
    """Measured speedup (pooled, 95% bootstrap CI) and Leviathan's predicted speedup along the x axis; a star
    marks each setting's best point."""
    summary = as_summary(data)
    x, hue_axes = plot_axes(summary, x, hue)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    for label, color, runs, positions in settings(summary, x, hue_axes):
        measured = runs["speedup_pooled"].to_numpy(dtype=float)
        if np.isnan(measured).all():  # no prompt of this setting has a measured speedup: nothing to star
            errorbar(ax, positions, runs, "speedup", color, f"{label} (no measured speedup)")
        else:
            best = np.nanargmax(measured)
            errorbar(ax, positions, runs, "speedup", color,
                     f"{label} (best {x}={format_value(runs[x].iloc[best])})")
            ax.plot(positions[best], measured[best], color=color, **BEST_MARKER)
        ax.plot(positions, runs["predicted_speedup"], color=color, linestyle="--" if runs["_line"].iloc[0] == "-"
                else "none", marker=".")
    ax.axhline(1, color="grey", linestyle=":", linewidth=1)
    x_ticks(ax, summary, x)
    ax.set(xlabel=axis_label(x), ylabel="speedup over autoregressive baseline (×)")
    style_keys = [Line2D([], [], color="black", marker="o", label="measured, pooled (95% bootstrap CI)"),
                  Line2D([], [], color="black", linestyle="--", marker=".",
                         label="predicted (Leviathan, pooled a, mean c)"),
                  Line2D([], [], color="white", **BEST_MARKER, label=f"best measured {x}"),
                  Line2D([], [], color="grey", linestyle=":", label="baseline (1×)")]
    handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=handles, loc="outside lower left", fontsize="small")
    fig.legend(handles=style_keys, loc="outside lower right", fontsize="small")
    fig.suptitle(title(summary, "Measured vs predicted speedup"))
    return save(fig, path)


def plot_per_position(data: pd.DataFrame, path: str | Path, x: str | None = None, hue: str | None = None) -> Path:
    """Per-position acceptance a_i vs position i, pooled over prompts with 95% bootstrap bars where the rows count
    positions (else the mean over prompts): a panel per setting, a line per value of the x axis, the legend giving
    the verified first positions each rests on."""
    summary = as_summary(data)
    facets = panels(summary, x, hue)
    fig, grid = panel_grid(facets, width=5.5, height=3.8)
    longest = 1
    for ax, (panel_title, runs, names) in zip(grid, facets):
        for (_, run), name, color in zip(runs.iterrows(), names, colors(len(runs))):
            values, low, high, attempts = per_position(run)
            longest = max(longest, len(values))
            positions = np.arange(1, len(values) + 1)
            counted = f" (n={attempts[0]})" if attempts else ""
            ax.errorbar(positions, values, yerr=np.nan_to_num(np.vstack([values - low, high - values])),
                        marker="o", color=color, capsize=3, label=f"{name}{counted}")
        ax.set(title=panel_title, xlabel="draft position i", ylim=(0, 1.05))
        ax.set_xticks(range(1, longest + 1))
        ax.legend(fontsize="small", loc="lower left")
    label_first_column(grid, "P(token i accepted | tokens 1..i-1 accepted)")
    fig.suptitle(title(summary, "Per-position acceptance (pooled, 95% CI; n: verified at i = 1)"))
    return save(fig, path)


def plot_throughput(data: pd.DataFrame, path: str | Path, x: str | None = None, hue: str | None = None) -> Path:
    """Baseline vs speculative tokens/s, pooled, grouped bars with 95% bootstrap CI: a panel per setting, a bar
    pair per value of the x axis."""
    summary = as_summary(data)
    facets = panels(summary, x, hue)
    longest = max(len(line) for _, _, names in facets for name in names for line in name.split(", "))
    bars = max(len(runs) for _, runs, _ in facets)
    fig, grid = panel_grid(facets, width=max(5.5, 1 + 0.1 * longest * bars), height=3.8)  # room for the names
    for ax, (panel_title, runs, names) in zip(grid, facets):
        positions = np.arange(len(runs))
        for offset, metric, name, color in ((-0.2, "baseline_tokens_per_s", "baseline (autoregressive)", "tab:grey"),
                                            (0.2, "spec_tokens_per_s", "measured system", "tab:blue")):
            ax.bar(positions + offset, runs[f"{metric}_pooled"], width=0.4, yerr=ci_error(runs, metric),
                   color=color, label=name, capsize=3)
        ax.set_xticks(positions, [name.replace(", ", "\n") for name in names])  # long setting names wrap
        ax.set_title(panel_title)
    label_first_column(grid, "tokens / s")
    fig.legend(*grid[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title(summary, "Throughput: baseline vs measured (pooled over prompts, 95% bootstrap CI)"))
    return save(fig, path)


def plot_accepted_histogram(data: pd.DataFrame, path: str | Path, x: str | None = None, hue: str | None = None
                            ) -> Path:
    """Per run, the share of its drafting steps that kept j drafts (j = 0..k, the bonus token not counted): a panel
    per run, a dashed line at its mean (vLLM's acceptance length less 1)."""
    summary = as_summary(data)
    axes = varying_axes(summary)
    runs = [(label, run) for (_, run), label in
            zip(summary.iterrows(), (setting_label(run, axes) for _, run in summary.iterrows()))]
    fig, grid = panel_grid(runs, width=5.5, height=3.4)
    for ax, (label, run) in zip(grid, runs):
        counts = np.asarray(run.get("accepted_histogram") or [], dtype=float)
        ax.set(title=label, xlabel="drafts accepted in a step", ylim=(0, 1.05))
        if not counts.sum():
            ax.text(0.5, 0.5, "no histogram in these rows", ha="center", va="center", transform=ax.transAxes)
            continue
        shares = counts / counts.sum()
        ax.bar(np.arange(len(shares)), shares, color="tab:blue")
        mean = float((np.arange(len(shares)) * shares).sum())
        ax.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.2f} (AL {1 + mean:.2f})")
        ax.set_xticks(range(len(shares)))
        ax.legend(fontsize="small", loc="upper left")
    label_first_column(grid, "share of drafting steps")
    fig.suptitle(title(summary, "Accepted drafts per step (all prompts of each run)"))
    return save(fig, path)


def as_summary(data: pd.DataFrame) -> pd.DataFrame:
    """Accept a per-prompt frame (it has prompt_id) or a summary."""
    return summarize_runs(data) if "prompt_id" in data.columns else data


def is_numeric(summary: pd.DataFrame, column: str) -> bool:
    return pd.api.types.is_numeric_dtype(summary[column]) and not pd.api.types.is_bool_dtype(summary[column])


def x_values(summary: pd.DataFrame, x: str) -> dict:
    """Where each value of the x axis sits: itself for a number, its rank for a name (drafter, policy, ...)."""
    values = sorted(summary[x].unique(), key=lambda value: (value is None, str(value)) if not is_numeric(summary, x)
                    else value)
    return {value: value if is_numeric(summary, x) else index for index, value in enumerate(values)}


def settings(summary: pd.DataFrame, x: str, hue_axes: list[str]):
    """(label, color, runs in x order, positions) for each combination of the hue axes.

    Positions are the x values nudged sideways per setting, so that settings sharing an x value do not hide each
    other's error bars. ``_line`` says how to join them: a line along a numeric axis, none between names.
    """
    groups = [runs for _, runs in summary.groupby(hue_axes, sort=False, dropna=False)] if hue_axes else [summary]
    where = x_values(summary, x)
    spacing = min(np.diff(sorted(where.values())), default=1) or 1
    for index, (runs, color) in enumerate(zip(groups, colors(len(groups)))):
        runs = runs.assign(_at=runs[x].map(where), _line="-" if is_numeric(summary, x) else "none").sort_values("_at")
        positions = runs["_at"].to_numpy(dtype=float) + spacing * DODGE * (index - (len(groups) - 1) / 2)
        yield setting_label(runs.iloc[0], hue_axes) if hue_axes else "all runs", color, runs, positions


def axis_label(x: str) -> str:
    return "draft length k" if x == "k" else x


def x_ticks(ax, summary: pd.DataFrame, x: str) -> None:
    """Ticks at the x values: integers and numbers as they are, names at their ranks."""
    where = x_values(summary, x)
    ax.set_xticks(list(where.values()), [format_value(value) for value in where])


def colors(n: int) -> list:
    """Distinct qualitative colours; a sequential map once there are more settings than tab10 holds."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 0.95, n)]


def errorbar(ax, x, runs: pd.DataFrame, metric: str, color, label: str) -> None:
    """A pooled figure with its bootstrap bars; joined by a line only along a numeric axis (names have no
    between)."""
    ax.errorbar(x, runs[f"{metric}_pooled"], yerr=ci_error(runs, metric), color=color, marker="o",
                capsize=3, label=label, linestyle=runs["_line"].iloc[0])


def ci_error(runs: pd.DataFrame, metric: str) -> np.ndarray:
    """[2, n] distances from a pooled figure to its bootstrap interval's bounds; 0 where a bound is undefined."""
    value = runs[f"{metric}_pooled"].to_numpy(float)
    low = runs[f"{metric}_pooled_ci_low"].to_numpy(float)
    high = runs[f"{metric}_pooled_ci_high"].to_numpy(float)
    return np.nan_to_num(np.vstack([value - low, high - value]))


def per_position(run: pd.Series) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    """A run's a_i pooled with its interval and counts where its rows count positions, else the per-prompt mean
    without an interval."""
    pooled = run.get("per_position_pooled")
    if isinstance(pooled, list) and pooled:
        return (np.asarray(pooled, float), np.asarray(run["per_position_ci_low"], float),
                np.asarray(run["per_position_ci_high"], float), list(run["per_position_attempts"]))
    values = np.asarray(run["per_position_acceptance_mean"], float)
    return values, values, values, []


def panels(summary: pd.DataFrame, x: str | None = None, hue: str | None = None
           ) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """(panel title, runs, a name per run): a panel per setting with its runs named by their x value when the x
    axis varies, else one panel with every run named by its setting."""
    x, hue_axes = plot_axes(summary, x, hue)
    if x in varying_axes(summary) or summary[x].nunique(dropna=False) > 1:
        return [(label, runs, [f"{x}={format_value(value)}" for value in runs[x]])
                for label, _, runs, _ in settings(summary, x, hue_axes)]
    axes = varying_axes(summary)
    return [("", summary, [setting_label(run, axes) for _, run in summary.iterrows()])]


def panel_grid(facets: list, width: float, height: float) -> tuple[Figure, list]:
    """A figure with one axes per facet, two columns at most, sharing the y axis."""
    ncols = min(2, len(facets))
    nrows = math.ceil(len(facets) / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    grid = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax in grid[len(facets):]:
        ax.set_visible(False)
    return fig, list(grid)


def label_first_column(grid: list, ylabel: str) -> None:
    """The y axis is shared along each row, so only the first column carries its label."""
    for ax in grid:
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel(ylabel)


def title(summary: pd.DataFrame, subject: str) -> str:
    pairs = ", ".join(sorted(map(str, summary["pair"].unique())))
    samplings = "; ".join(sorted(map(str, summary["sampling"].unique())))
    return f"{subject}\npair: {pairs} · sampling: {samplings}"


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
