"""The plots researchers expect from a sweep, each a function (summary or per-prompt frame, PNG path).

Figures are built with `matplotlib.figure.Figure` and saved through Agg, never through pyplot, so importing
this module leaves the caller's backend (e.g. a notebook's) alone and no figure stays open.
A setting is a distinct combination of the varying config columns other than k, labelled by them: one line
per setting along k, or one panel per setting where the plot already uses its x axis for something else.
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

from analysis.summarize import setting_label, summarize_runs, varying_axes  # noqa: E402

DODGE = 0.06  # sideways offset between settings, in units of k
BEST_MARKER = dict(marker="*", markersize=16, markeredgecolor="black", linestyle="none", zorder=5)


def plot_acceptance(data: pd.DataFrame, path: str | Path) -> Path:
    """Acceptance rate and mean accepted length (tau) vs k, one line per setting, 95% CI bars."""
    summary = as_summary(data)
    fig = Figure(figsize=(11, 5), layout="constrained")
    rate_ax, tau_ax = fig.subplots(1, 2)
    for label, color, runs, x in settings(summary):
        errorbar(rate_ax, x, runs, "acceptance_rate", color, label)
        errorbar(tau_ax, x, runs, "mean_accepted_length", color, "_nolegend_")
    rate_ax.set(xlabel="draft length k", ylabel="acceptance rate A/D", ylim=(0, 1.05), title="Acceptance rate")
    tau_ax.set(xlabel="draft length k", ylabel="mean accepted length τ = E/N (tokens per target call)",
               title="Mean accepted length")
    tau_ax.axhline(1, color="grey", linestyle=":", linewidth=1, label="plain decoding (τ = 1)")
    for ax in (rate_ax, tau_ax):
        integer_ticks(ax, summary["k"])
    fig.legend(loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title(summary, "Acceptance vs draft length (mean over prompts, 95% CI)"))
    return save(fig, path)


def plot_speedup(data: pd.DataFrame, path: str | Path) -> Path:
    """Measured speedup (95% CI) and Leviathan's predicted speedup vs k; a star marks each setting's best k."""
    summary = as_summary(data)
    fig = Figure(figsize=(9, 6), layout="constrained")
    ax = fig.subplots()
    for label, color, runs, x in settings(summary):
        measured = runs["speedup_mean"].to_numpy(dtype=float)
        if np.isnan(measured).all():  # no prompt of this setting has a measured speedup: nothing to star
            errorbar(ax, x, runs, "speedup", color, f"{label} (no measured speedup)")
        else:
            best = np.nanargmax(measured)
            errorbar(ax, x, runs, "speedup", color, f"{label} (best k={runs['k'].iloc[best]})")
            ax.plot(x[best], measured[best], color=color, **BEST_MARKER)
        ax.plot(x, runs["predicted_speedup"], color=color, linestyle="--", marker=".")
    ax.axhline(1, color="grey", linestyle=":", linewidth=1)
    integer_ticks(ax, summary["k"])
    ax.set(xlabel="draft length k", ylabel="speedup over autoregressive baseline (×)")
    style_keys = [Line2D([], [], color="black", marker="o", label="measured (95% CI)"),
                  Line2D([], [], color="black", linestyle="--", marker=".",
                         label="predicted (Leviathan, mean a and c)"),
                  Line2D([], [], color="white", **BEST_MARKER, label="best measured k"),
                  Line2D([], [], color="grey", linestyle=":", label="baseline (1×)")]
    handles, _ = ax.get_legend_handles_labels()
    fig.legend(handles=handles, loc="outside lower left", fontsize="small")
    fig.legend(handles=style_keys, loc="outside lower right", fontsize="small")
    fig.suptitle(title(summary, "Measured vs predicted speedup"))
    return save(fig, path)


def plot_per_position(data: pd.DataFrame, path: str | Path) -> Path:
    """Per-position acceptance a_i (mean over prompts) vs position i: a panel per setting, a line per k."""
    summary = as_summary(data)
    facets = panels(summary)
    fig, grid = panel_grid(facets, width=5.5, height=3.8)
    for ax, (panel_title, runs, names) in zip(grid, facets):
        for (_, run), name, color in zip(runs.iterrows(), names, colors(len(runs))):
            values = run["per_position_acceptance"]
            ax.plot(range(1, len(values) + 1), values, marker="o", color=color, label=name)
        integer_ticks(ax, range(1, max(map(len, runs["per_position_acceptance"]), default=1) + 1))
        ax.set(title=panel_title, xlabel="draft position i", ylim=(0, 1.05))
        ax.legend(fontsize="small", loc="lower left")
    label_first_column(grid, "P(token i accepted | tokens 1..i-1 accepted)")
    fig.suptitle(title(summary, "Per-position acceptance (mean over prompts)"))
    return save(fig, path)


def plot_throughput(data: pd.DataFrame, path: str | Path) -> Path:
    """Baseline vs speculative tokens/s, grouped bars with 95% CI: a panel per setting, a bar pair per k."""
    summary = as_summary(data)
    facets = panels(summary)
    longest = max(len(line) for _, _, names in facets for name in names for line in name.split(", "))
    bars = max(len(runs) for _, runs, _ in facets)
    fig, grid = panel_grid(facets, width=max(5.5, 1 + 0.1 * longest * bars), height=3.8)  # room for the names
    for ax, (panel_title, runs, names) in zip(grid, facets):
        positions = np.arange(len(runs))
        for offset, metric, name, color in ((-0.2, "baseline_tokens_per_s", "baseline (autoregressive)", "tab:grey"),
                                            (0.2, "spec_tokens_per_s", "speculative", "tab:blue")):
            ax.bar(positions + offset, runs[f"{metric}_mean"], width=0.4, yerr=ci_error(runs, metric),
                   color=color, label=name, capsize=3)
        ax.set_xticks(positions, [name.replace(", ", "\n") for name in names])  # long setting names wrap
        ax.set_title(panel_title)
    label_first_column(grid, "tokens / s")
    fig.legend(*grid[0].get_legend_handles_labels(), loc="outside lower center", ncols=2, fontsize="small")
    fig.suptitle(title(summary, "Throughput: baseline vs speculative (mean over prompts, 95% CI)"))
    return save(fig, path)


def plot_accepted_histogram(data: pd.DataFrame, path: str | Path) -> Path:
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
        integer_ticks(ax, range(len(shares)))
        ax.legend(fontsize="small", loc="upper left")
    label_first_column(grid, "share of drafting steps")
    fig.suptitle(title(summary, "Accepted drafts per step (all prompts of each run)"))
    return save(fig, path)


def as_summary(data: pd.DataFrame) -> pd.DataFrame:
    """Accept a per-prompt frame (it has prompt_id) or a summary."""
    return summarize_runs(data) if "prompt_id" in data.columns else data


def settings(summary: pd.DataFrame):
    """(label, color, runs sorted by k, x) for each combination of the varying axes other than k.

    x is k nudged sideways per setting, so that settings sharing a k do not hide each other's error bars.
    """
    axes = varying_axes(summary, exclude=("k",))
    groups = [runs for _, runs in summary.groupby(axes, sort=False, dropna=False)] if axes else [summary]
    for index, (runs, color) in enumerate(zip(groups, colors(len(groups)))):
        runs = runs.sort_values("k")
        x = runs["k"].to_numpy() + DODGE * (index - (len(groups) - 1) / 2)
        yield setting_label(runs.iloc[0], axes), color, runs, x


def colors(n: int) -> list:
    """Distinct qualitative colours; a sequential map once there are more settings than tab10 holds."""
    if n <= 10:
        return [colormaps["tab10"](i) for i in range(n)]
    return [colormaps["viridis"](x) for x in np.linspace(0, 0.95, n)]


def errorbar(ax, x, runs: pd.DataFrame, metric: str, color, label: str) -> None:
    ax.errorbar(x, runs[f"{metric}_mean"], yerr=ci_error(runs, metric), color=color, marker="o",
                capsize=3, label=label)


def ci_error(runs: pd.DataFrame, metric: str) -> np.ndarray:
    """[2, n] distances from the mean to the CI bounds; 0 where the bound is undefined (one prompt)."""
    mean = runs[f"{metric}_mean"].to_numpy(float)
    low = runs[f"{metric}_ci_low"].to_numpy(float)
    high = runs[f"{metric}_ci_high"].to_numpy(float)
    return np.nan_to_num(np.vstack([mean - low, high - mean]))


def integer_ticks(ax, values) -> None:
    ax.set_xticks(sorted(set(int(v) for v in values)))


def panels(summary: pd.DataFrame) -> list[tuple[str, pd.DataFrame, list[str]]]:
    """(panel title, runs, a name per run): a panel per setting with its runs named by k when k varies,
    else one panel with every run named by its setting."""
    if "k" in varying_axes(summary):
        return [(label, runs, [f"k={k}" for k in runs["k"]]) for label, _, runs, _ in settings(summary)]
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
    samplings = ", ".join(sorted(map(str, summary["sampling"].unique())))
    return f"{subject}\npair: {pairs} · sampling: {samplings}"


def save(fig: Figure, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
