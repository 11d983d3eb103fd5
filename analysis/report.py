"""Write report.md (summary, pivots, plots, the fastest setting) for run or sweep directories.

    python -m analysis.report <run or sweep dir> [more dirs...] [--out DIR]     (from the repository root)
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from pathlib import Path

import pandas as pd

from analysis.load import (
    DamagedRunWarning,
    PartialRunWarning,
    ResultsError,
    RunRows,
    UnfinishedJob,
    build_frame,
    find_run_dirs,
    loadable_run_dirs,
    read_runs,
    unfinished_jobs,
)
from analysis.plots import (
    plot_accepted_histogram, plot_acceptance, plot_per_position, plot_speedup, plot_throughput,
)
from analysis.summarize import format_value, setting_label, summarize_runs, varying_axes
from analysis.tables import format_cell, pivot_metric, to_markdown
from experiments.refusal import ArgumentParser
from specdec.results import INTERVAL_METRICS, MIN_PROMPTS_FOR_INTERVAL, ROWS, SUMMARY, finite_values

PIVOT_METRICS = ("speedup", "acceptance_rate", "mean_accepted_length")
TREE_DRAFTERS = {"tree", "dynamic_tree"}  # drafters whose rows are token trees
PLOTS = (
    ("speedup.png", plot_speedup, "Measured vs predicted speedup"),
    ("acceptance.png", plot_acceptance, "Acceptance rate and mean accepted length"),
    ("per_position.png", plot_per_position, "Per-position acceptance"),
    ("throughput.png", plot_throughput, "Throughput"),
    ("accepted_histogram.png", plot_accepted_histogram, "Accepted drafts per step"),
)
# Our metrics beside the names vLLM and Spec-Bench (Xia et al. 2024) give the same things: (column, definition,
# vLLM, Spec-Bench).
DEFINITIONS = (
    ("`mean_accepted_length` τ", "E / N: tokens emitted per target call, the bonus token included",
     "mean acceptance length (AL) = 1 + accepted / drafts (steps that drafted)", "#mean accepted tokens (τ)"),
    ("`acceptance_rate`", "A / D: draft tokens kept / draft tokens proposed (a tree's nodes all count)",
     "draft acceptance rate", "—"),
    ("`per_position_acceptance` a_i", "P(draft i kept given drafts 1..i-1 kept), per depth for a tree",
     "per-position acceptance rate, unconditional: a_1 ⋯ a_i", "—"),
    ("`accepted_histogram` h_j", "steps that drafted and kept j drafts, j = 0..k (bonus not counted)",
     "per-request acceptance histogram", "—"),
    ("`speedup`", "baseline seconds per token / speculative seconds per token, same prompts and process",
     "— (throughput, tokens/s)", "speedup (walltime over vanilla autoregressive decoding)"),
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PartialRunWarning)
            warnings.simplefilter("always", DamagedRunWarning)
            report = write_report(args.paths, args.out)
    except ResultsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the report's own files: a full disk, a file where a directory should be
        print(f"error: cannot write the report into {args.out or args.paths[0]}: {err.strerror or err}"
              f"{f' ({err.filename})' if err.filename else ''}; choose another --out", file=sys.stderr)
        return 2
    finally:
        for warning in caught:  # one line each, without the source line Python would print
            print(f"warning: {warning.message}", file=sys.stderr)
    print(f"wrote {report}")
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = ArgumentParser(prog="python -m analysis.report",
                                     description="Summarize specdec runs into report.md with tables and plots.")
    parser.add_argument("paths", nargs="+", help=f"run directories or sweep directories (searched for {ROWS})")
    parser.add_argument("--out", help="directory for report.md, CSVs and PNGs (default: the first path)")
    return parser.parse_args(argv)


def write_report(paths: list[str], out: str | None = None) -> Path:
    """Load the runs, write report.md, summary.csv, pivot_<metric>.csv and the plots into `out`. Jobs that failed,
    were skipped or left no rows are named; when no job left rows, report.md names them and nothing else."""
    jobs = unfinished_jobs(*paths)
    out_dir = Path(out or paths[0])
    check_out_dir(out_dir)
    run_dirs = loadable_run_dirs(paths, jobs)
    if jobs and not run_dirs:
        return write_markdown(out_dir, "\n".join(["# Speculative decoding report", "", *job_lines(jobs),
                                                  "", "No job wrote rows: nothing to compare.", ""]))
    runs = read_runs(run_dirs or find_run_dirs(paths))  # with nothing to load, find_run_dirs names what is missing
    frame = build_frame(runs)
    summary = summarize_runs(frame)
    summary.to_csv(out_dir / "summary.csv", index=False)
    sections = [
        header(paths, frame, summary, jobs, runs),
        summary_section(summary),
        pivot_section(summary, out_dir),
        tree_section(frame, summary),
        acceptance_section(summary),
        plot_section(summary, out_dir),
    ]
    return write_markdown(out_dir, "\n".join(sections))


def check_out_dir(out_dir: Path) -> None:
    """The report's directory, created and written to before anything is loaded; one line if it cannot be."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out_dir).close()
    except OSError as err:
        raise ResultsError(f"--out {out_dir}: cannot be created or written ({err.strerror or err}); choose another "
                           "directory with --out DIR") from None


def write_markdown(out_dir: Path, text: str) -> Path:
    report = out_dir / "report.md"
    report.write_text(text)
    return report


def label_axes(summary: pd.DataFrame) -> list[str]:
    """The axes that tell runs apart; strategy and k when a single setting was run."""
    return varying_axes(summary) or [axis for axis in ("strategy", "k") if axis in summary.columns]


def label(run: pd.Series, axes: list[str]) -> str:
    return setting_label(run, axes) + (" (partial run)" if run["partial"] else "")


def header(paths: list[str], frame: pd.DataFrame, summary: pd.DataFrame, jobs: list[UnfinishedJob],
           runs: list[RunRows]) -> str:
    lines = [
        "# Speculative decoding report",
        "",
        f"- pair: {', '.join(map(str, summary['pair'].unique()))}; "
        f"sampling: {', '.join(map(str, summary['sampling'].unique()))}",
        f"- {len(summary)} runs, {len(frame)} (run, prompt) rows, "
        f"{frame['prompt_id'].nunique()} distinct prompts; from {', '.join(f'`{p}`' for p in paths)}",
    ]
    failed = {str(job.job_dir) for job in jobs if job.state == "failed"}
    for _, run in summary[summary["partial"]].iterrows():
        if run["run_dir"] not in failed:  # a failed job's line says why it is partial
            lines.append(f"- **Partial run** (no {SUMMARY}, killed?): `{run['run_dir']}`, "
                         f"{run['n_prompts']} prompts loaded")
    lines += [f"- **Left out:** {line}" for run in runs for line in run.left_out]
    lines += job_lines(jobs) + gap_lines(frame) + timing_lines(frame, summary)
    lines += ["", fastest_sentence(summary), ""]
    return "\n".join(lines)


JOB_TITLES = {"failed": "Failed job", "skipped": "Skipped job", "no rows": "Job without rows",
              "unreadable": "Unreadable job"}


def job_lines(jobs: list[UnfinishedJob]) -> list[str]:
    """One line per job that left no complete run, so that none is silently missing from the comparison."""
    return [f"- **{JOB_TITLES[job.state]}** `{job.job_dir}`: {job.detail}" for job in jobs]


def gap_lines(frame: pd.DataFrame) -> list[str]:
    """Metrics no row measured (null everywhere: nothing drafted, runs with no timings), so that empty cells and
    plots say why they are empty."""
    empty = [metric for metric in INTERVAL_METRICS if not finite_values(frame[metric])]
    if not empty:
        return []
    return [f"- **No values:** {', '.join(empty)} {'is' if len(empty) == 1 else 'are'} null in every row, so "
            "their cells below are empty and their plots show nothing."]


def timing_lines(frame: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """Warnings about timings that cannot be compared as they are: rows decoded while other jobs of the sweep ran
    on the same machine, and runs spread over several machines."""
    lines = []
    if "concurrent_jobs" in frame:
        counts = pd.to_numeric(frame["concurrent_jobs"])
        shared = frame[counts > 1]
        if len(shared):
            lines.append(
                f"- **Warning: distorted timings.** {len(shared)} of {len(frame)} rows "
                f"({shared['run_dir'].nunique()} of {len(summary)} runs) were decoded while other jobs of the sweep "
                f"ran on the same machine (up to {int(counts.max())} at once); their seconds, tokens/s, speedups and "
                "cost ratios are not those of a machine to themselves (column `concurrent jobs` below). For timings, "
                "run jobs one at a time per machine (the default launcher, or one job per SLURM node).")
        if counts.isna().any():
            lines.append(f"- {int(counts.isna().sum())} rows could not count the jobs beside them "
                         "(`concurrent_jobs` is null: the file system gave no locks).")
    if "host" in frame and frame["host"].nunique() > 1:
        hosts = sorted(map(str, frame["host"].dropna().unique()))
        lines.append(f"- Runs ran on {len(hosts)} machines ({', '.join(hosts)}); timings compare across runs only if "
                     "the machines are alike (column `hosts` below).")
    return lines


def fastest_sentence(summary: pd.DataFrame) -> str:
    """The setting with the highest mean speedup, its CI, and its ratio over the next best."""
    ranked = summary.dropna(subset=["speedup_mean"]).sort_values("speedup_mean", ascending=False)
    if ranked.empty:
        return "**Fastest:** no run has a measured speedup."
    axes = label_axes(summary)
    best = ranked.iloc[0]
    sentence = (f"**Fastest:** {label(best, axes)}, mean speedup {best['speedup_mean']:.2f}× over the "
                f"autoregressive baseline ({ci_text(best, 'speedup')}, {best['n_prompts']} prompts)")
    if len(ranked) > 1:
        runner_up = ranked.iloc[1]
        sentence += (f", {best['speedup_mean'] / runner_up['speedup_mean']:.2f}× the next best "
                     f"({label(runner_up, axes)}: {runner_up['speedup_mean']:.2f}×)")
        if math.isnan(best["speedup_ci_low"]) or math.isnan(runner_up["speedup_ci_high"]):
            sentence += "; without intervals (too few prompts) treat this ordering with caution"
        elif best["speedup_ci_low"] <= runner_up["speedup_ci_high"]:
            sentence += "; their 95% CIs overlap, so treat this ordering with caution"
    return sentence + "."


def ci_text(run: pd.Series, metric: str) -> str:
    low, high = run[f"{metric}_ci_low"], run[f"{metric}_ci_high"]
    if math.isnan(low):
        return f"no 95% CI: fewer than {MIN_PROMPTS_FOR_INTERVAL} prompts"
    return f"95% CI {low:.2f}–{high:.2f}"


def summary_section(summary: pd.DataFrame) -> str:
    """One line per run: its setting, then each metric as mean [95% CI]."""
    axes = label_axes(summary)
    table = summary[axes].copy()
    for metric, name in (("speedup", "speedup"), ("acceptance_rate", "acceptance rate"),
                         ("mean_accepted_length", "τ (tokens/target call)"),
                         ("spec_tokens_per_s", "spec tok/s"), ("baseline_tokens_per_s", "baseline tok/s")):
        table[name] = [with_ci(run, metric) for _, run in summary.iterrows()]
    table["predicted speedup"] = summary["predicted_speedup"]
    table["prompts"] = summary["n_prompts"]
    table["partial"] = summary["partial"].map({True: "yes", False: ""})
    if "most_concurrent_jobs" in summary and (summary["most_concurrent_jobs"] > 1).any():
        table["concurrent jobs"] = summary["most_concurrent_jobs"]
    if "hosts" in summary and len(set(", ".join(summary["hosts"]).split(", "))) > 1:
        table["hosts"] = summary["hosts"]
    return ("## Runs\n\nMean over prompts [95% Student t interval, clipped to the metric's range; none with fewer "
            f"than {MIN_PROMPTS_FOR_INTERVAL} prompts]; predicted speedup from the mean acceptance "
            "rate and cost ratio (Leviathan et al., 2023). All columns in `summary.csv`.\n\n"
            + to_markdown(table, index=False))


def with_ci(run: pd.Series, metric: str) -> str:
    mean, low, high = (run[f"{metric}_{stat}"] for stat in ("mean", "ci_low", "ci_high"))
    if math.isnan(low):
        return format_cell(mean)
    return f"{format_cell(mean)} [{format_cell(low)}, {format_cell(high)}]"


def pivot_axes(summary: pd.DataFrame) -> tuple[list[str], str | None]:
    """k (else the most varied axis) across the columns, every other varying axis down the rows, so that
    each cell is one run; a single varying axis goes down the rows."""
    axes = varying_axes(summary)
    if len(axes) < 2:
        return axes, None
    cols = "k" if "k" in axes else max(axes, key=lambda axis: summary[axis].nunique(dropna=False))
    return [axis for axis in axes if axis != cols], cols


def pivot_section(summary: pd.DataFrame, out_dir: Path) -> str:
    rows, cols = pivot_axes(summary)
    if not rows:
        return "## Comparisons\n\nA single setting was run; nothing to pivot.\n"
    parts = [f"## Comparisons\n\nMean over prompts; rows: {', '.join(rows)}"
             + (f"; columns: {cols}" if cols else "") + ". CSVs: "
             + ", ".join(f"`pivot_{metric}.csv`" for metric in PIVOT_METRICS) + ".\n"]
    for metric in PIVOT_METRICS:
        table = pivot_metric(summary, metric, rows, cols)
        table.to_csv(out_dir / f"pivot_{metric}.csv")
        if cols:
            table.columns = [f"{cols}={format_value(value)}" for value in table.columns]
        else:
            table.columns = [metric]
        parts.append(f"### {metric}\n\n{to_markdown(table)}")
    return "\n".join(parts)


def plot_section(summary: pd.DataFrame, out_dir: Path) -> str:
    parts = ["## Plots\n"]
    for filename, plot, caption in PLOTS:
        plot(summary, out_dir / filename)
        parts.append(f"### {caption}\n\n![{caption}]({filename})\n")
    return "\n".join(parts)


def tree_section(frame: pd.DataFrame, summary: pd.DataFrame) -> str:
    """Token trees beside chains that verify about as many draft tokens per target call: tau and speedup. Empty
    unless the runs hold both."""
    drafters = set(summary["drafter"]) if "drafter" in summary else set()
    if not drafters & TREE_DRAFTERS or not drafters - TREE_DRAFTERS:
        return ""
    runs = frame.groupby("run_dir", sort=False)[["drafted", "target_calls"]].sum()
    verified = (runs["drafted"] / runs["target_calls"]).reindex(summary["run_dir"]).to_numpy()  # per run
    axes = label_axes(summary)
    table = pd.DataFrame({
        "setting": [label(run, axes) for _, run in summary.iterrows()],
        "drafted per call": [format_cell(v) for v in verified],
        "τ (tokens/target call)": [with_ci(run, "mean_accepted_length") for _, run in summary.iterrows()],
        "speedup": [with_ci(run, "speedup") for _, run in summary.iterrows()],
    }).iloc[verified.argsort(kind="stable")]
    return ("## Trees against chains\n\nEach run's draft tokens verified per target call (a chain's k, a tree's "
            "nodes), then τ and speedup, mean [95% CI]: compare a tree with the chain that verifies as many tokens. "
            "A tree's acceptance rate counts every node it drafted, so compare τ, not acceptance.\n\n"
            + to_markdown(table, index=False) + "\n")


def acceptance_section(summary: pd.DataFrame) -> str:
    """The acceptance metrics as the field reports them: a definitions table with vLLM's and Spec-Bench's names,
    then per run τ and vLLM's AL with 95% CIs, the acceptance rate, a_i and the accepted-per-step histogram."""
    definitions = pd.DataFrame(DEFINITIONS, columns=["ours", "definition", "vLLM", "Spec-Bench"])
    axes = label_axes(summary)
    table = pd.DataFrame({
        "setting": [label(run, axes) for _, run in summary.iterrows()],
        "τ (our AL)": [with_ci(run, "mean_accepted_length") for _, run in summary.iterrows()],
        "vLLM AL": [with_ci(run, "vllm_acceptance_length") for _, run in summary.iterrows()],
        "acceptance rate": [with_ci(run, "acceptance_rate") for _, run in summary.iterrows()],
        "a_i (i = 1..k)": [per_position_text(run["per_position_acceptance"]) for _, run in summary.iterrows()],
        "steps by drafts kept, h_0..h_k (share)": [histogram_text(run["accepted_histogram"])
                                                   for _, run in summary.iterrows()],
    })
    return ("## Acceptance, as the field reports it\n\nDefinitions, beside vLLM's and Spec-Bench's names for the "
            "same things:\n\n" + to_markdown(definitions, index=False)
            + "\n\nPer run: means over prompts [95% Student t interval]; a_i the per-position mean over prompts; the "
            "histogram sums every prompt's steps (plot below). τ counts every target call, vLLM's AL only those "
            "that verified drafts.\n\n" + to_markdown(table, index=False) + "\n")


def per_position_text(values: list) -> str:
    """'0.97, 0.98, 0.63, –': a_i where some prompt reached position i, a dash where none did."""
    return ", ".join("–" if value is None or math.isnan(value) else format_cell(value) for value in values)


def histogram_text(histogram: list) -> str:
    """'0: 12%, 1: 30%, ...' for h_0..h_k; an empty cell where the rows hold none."""
    total = sum(histogram) if isinstance(histogram, list) else 0
    if not total:
        return ""
    return ", ".join(f"{j}: {100 * count / total:.0f}%" for j, count in enumerate(histogram))


if __name__ == "__main__":
    sys.exit(main())
