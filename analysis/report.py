"""Write report.md (summary, pivots, per-category results, ours against transformers, plots, the fastest lossless
and lossy settings) for run or sweep directories. Figures are pooled over prompts (totals, with 95% bootstrap
intervals: ``specdec.results.pooled``) beside per-prompt means; tables and plots run along what the sweep varies.

    python -m analysis.report <run or sweep dir> [more dirs...] [--out DIR] [--x KEY] [--hue KEY]
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np
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
    pool_replicates,
    read_runs,
    unfinished_jobs,
)
from analysis.plots import (
    plot_accepted_histogram, plot_acceptance, plot_per_position, plot_speedup, plot_throughput,
)
from analysis.summarize import (
    format_value,
    none_for_nan,
    plot_axes,
    setting_label,
    summarize_runs,
    varying_axes,
)
from analysis.tables import format_cell, pivot_metric, to_markdown
from experiments.refusal import ArgumentParser
from specdec.results import (
    CODE_AND_WEIGHTS,
    INTERVAL_METRICS,
    MIN_PROMPTS_FOR_INTERVAL,
    ROWS,
    SHORT_RULE,
    SUMMARY,
    finite_values,
    pooled_figure,
    too_short,
)

PIVOT_METRICS = ("speedup", "acceptance_rate", "mean_accepted_length")
# Per category, pooled over its prompts, as Spec-Bench tabulates: metric -> heading.
CATEGORY_METRICS = {"speedup": "Speedup (pooled)", "mean_accepted_length": "τ, tokens per target call (pooled)",
                    "acceptance_rate": "Acceptance rate (pooled)"}
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
    ("`vllm_acceptance_length`", "1 + total accepted / total target calls that verified drafts: τ over the calls "
     "that drafted (a head's draftless first call left out)", "mean acceptance length (AL), as its counters "
     "compute it", "—"),
    ("`speedup`", "baseline seconds per token / speculative seconds per token, same prompts and process, pooled: "
     "total time per total tokens", "— (throughput, tokens/s)", "—"),
    ("`spec_bench_speedup`", "mean over prompts (and rounds) of speculative tokens/s / the same mean of baseline "
     "tokens/s", "—", "speedup, as its evaluation/speed.py computes it (ratio of mean per-question tokens/s)"),
    ("pooled", "a run's figure from totals over its prompts and rounds (total accepted / total drafted, total "
     "baseline seconds per token / total speculative seconds per token, ...), 95% bootstrap interval over prompts "
     "and, within each, its rounds and seeds", "what its counters report (totals)", "— (it averages per question)"),
)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", PartialRunWarning)
            warnings.simplefilter("always", DamagedRunWarning)
            report = write_report(args.paths, args.out, args.x, args.hue)
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
    parser.add_argument("--x", help="the setting tables and plots run along (default: k where it varies, else the "
                                    "first numeric setting that varies, e.g. temperature)")
    parser.add_argument("--hue", help="the one setting plots draw apart (default: every other setting that varies)")
    return parser.parse_args(argv)


def write_report(paths: list[str], out: str | None = None, x: str | None = None, hue: str | None = None) -> Path:
    """Load the runs, write report.md, summary.csv, pivot_<metric>.csv, categories.csv (where prompts carry a
    category) and the plots into `out`, along the axis ``x`` with the settings ``hue`` apart (defaults:
    ``analysis.summarize.plot_axes``). Jobs that failed, were skipped or left no rows are named; when no job left
    rows, report.md names them and nothing else."""
    jobs = unfinished_jobs(*paths)
    out_dir = Path(out or paths[0])
    check_out_dir(out_dir)
    run_dirs = loadable_run_dirs(paths, jobs)
    if jobs and not run_dirs:
        return write_markdown(out_dir, "\n".join(["# Speculative decoding report", "", *job_lines(jobs),
                                                  "", "No job wrote rows: nothing to compare.", ""]))
    runs = read_runs(run_dirs or find_run_dirs(paths))  # with nothing to load, find_run_dirs names what is missing
    frame = pool_replicates(build_frame(runs))
    summary = summarize_runs(frame)
    x, hue_axes = plot_axes(summary, x, hue)
    summary.to_csv(out_dir / "summary.csv", index=False)
    sections = [
        header(paths, frame, summary, jobs, runs),
        summary_section(summary),
        pivot_section(summary, out_dir, x, hue_axes),
        category_section(frame, summary, out_dir),
        systems_section(summary),
        tree_section(frame, summary),
        acceptance_section(summary),
        load_section(summary, out_dir),
        plot_section(summary, out_dir, x, hue),
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


def table_label(run: pd.Series, axes: list[str]) -> str:
    """A run's label in a table without a lossless column: marked where its rule is lossy."""
    return label(run, axes) + (" (lossy)" if lossless_kind(run.get("lossless")) is False else "")


def header(paths: list[str], frame: pd.DataFrame, summary: pd.DataFrame, jobs: list[UnfinishedJob],
           runs: list[RunRows]) -> str:
    lines = [
        "# Speculative decoding report",
        "",
        f"- pair: {', '.join(map(str, summary['pair'].unique()))}; "
        f"sampling: {'; '.join(map(str, summary['sampling'].unique()))}",
        f"- {len(runs)} runs, {len(frame)} (run, prompt) rows, "
        f"{frame['prompt_id'].nunique()} distinct prompts; from {', '.join(f'`{p}`' for p in paths)}",
    ]
    failed = {str(job.job_dir) for job in jobs if job.state == "failed"}
    for _, run in summary[summary["partial"]].iterrows():
        if run["run_dir"] not in failed:  # a failed job's line says why it is partial
            lines.append(f"- **Partial run** (no {SUMMARY}, killed?): `{run['run_dir']}`, "
                         f"{run['n_prompts']} prompts loaded")
    lines += [f"- **Left out:** {line}" for run in runs for line in run.left_out]
    lines += eos_lines(summary) + provenance_lines(frame, summary) + replicate_lines(frame, summary, len(runs))
    lines += job_lines(jobs) + gap_lines(frame) + timing_lines(frame, summary) + short_lines(summary)
    lines += ["", *fastest_lines(summary), ""]
    return "\n".join(lines)


EOS_CONVENTIONS = {True: "prompts end at the tokenizer's EOS (`stop_at_eos=true`)",
                   False: "EOS ignored: every prompt decodes `max_new_tokens` (`stop_at_eos=false`)"}


def eos_lines(summary: pd.DataFrame) -> list[str]:
    """The EOS convention the runs decoded under: it changes τ, acceptance and speedup (a drafter that drafts past an
    EOS loses those drafts), so no table is read without it."""
    values = summary["stop_at_eos"].map(lossless_kind).tolist() if "stop_at_eos" in summary else [None]
    named = [EOS_CONVENTIONS.get(value, "EOS convention unrecorded (rows written before `stop_at_eos`)")
             for value in dict.fromkeys(values)]
    if len(named) == 1:
        return [f"- EOS: {named[0]}."]
    return [f"- **EOS conventions differ between runs:** {'; '.join(named)} (column `stop_at_eos`)."]


def provenance_lines(frame: pd.DataFrame, summary: pd.DataFrame) -> list[str]:
    """The code and weights the runs ran, and, where they differ, that the runs are reported apart and why."""
    present = [column for column in CODE_AND_WEIGHTS if column in frame]
    if not present:
        return ["- Code and weights: unrecorded (rows written before provenance existed)."]
    values = {column: [format_value(v) for v in dict.fromkeys(frame[column].tolist())] for column in present}
    same = [f"{column} {values[column][0]}" for column in present if len(values[column]) == 1]
    lines = [f"- Code and weights: {', '.join(same)}." if same else "- Code and weights: see below."]
    differing = [column for column in present if len(values[column]) > 1]
    if differing:
        lines.append(f"- **Reported apart:** these runs differ in {', '.join(differing)} "
                     f"({'; '.join(f'{c}: ' + ', '.join(values[c]) for c in differing)}): other code or other weights "
                     "can change every figure, so such runs are never merged into one setting; the tables name them "
                     "by those columns.")
    return lines


def replicate_lines(frame: pd.DataFrame, summary: pd.DataFrame, runs: int) -> list[str]:
    """How the runs were pooled (a seed is a replicate, never a setting), the spread between replicates, and the
    greedy repeats whose counts disagree."""
    lines = []
    if runs > len(summary):
        lines.append(f"- {runs} runs pooled into {len(summary)} settings: runs that differ only in seed (or not at "
                     "all: repeats) are replicates of one setting, pooled (column `seed` lists the seeds), never "
                     "ranked apart.")
    if "replicates" in summary and (summary["replicates"] > 1).any():
        lines.append("- Replicates (rounds, and seeds' runs where pooled): the column `speedup between replicates` "
                     "gives the range and standard deviation of each replicate's pooled speedup; intervals resample "
                     "prompts and then each prompt's replicates.")
    if "greedy_repeats_disagree" in summary:
        axes = label_axes(summary)
        for _, run in summary[summary["greedy_repeats_disagree"].astype(bool)].iterrows():
            lines.append(f"- **Warning: greedy repeats disagree** in {label(run, axes)}: prompts "
                         f"{run['greedy_repeats_disagree']} have different counts in different repeats at temperature "
                         "0; only other code, other weights or a nondeterministic kernel can cause it.")
    return lines


def short_lines(summary: pd.DataFrame) -> list[str]:
    """The prompts too short to time, counted and named per run: left out of the per-prompt means of timings,
    counted in the pooled figures."""
    if "short_prompts" not in summary or not summary["short_prompts"].sum():
        return []
    axes = label_axes(summary)
    named = "; ".join(f"{label(run, axes)}: {run['short_prompt_ids']}" for _, run in summary.iterrows()
                      if run["short_prompts"])
    return [f"- **Too short to time:** {int(summary['short_prompts'].sum())} of {int(summary['n_prompts'].sum())} "
            f"(run, prompt) rows ({SHORT_RULE}): {named}. Their timings are left out of the per-prompt means and "
            "counted, by their few tokens and seconds, in the pooled figures."]


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


LOSSLESS_KINDS = ((True, "lossless"), (False, "lossy"), (None, "lossless or not unrecorded"))


def lossless_kind(value) -> bool | None:
    """A run's ``lossless`` as True, False, or None where its rows do not say."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


def fastest_lines(summary: pd.DataFrame) -> list[str]:
    """The fastest lossless setting and the fastest lossy one, apart, by pooled speedup: a lossy rule's speed is
    bought with its outputs, so it is never crowned beside the lossless ones."""
    ranked = summary.dropna(subset=["speedup_pooled"]).sort_values("speedup_pooled", ascending=False)
    if ranked.empty:
        return ["**Fastest:** no run has a measured speedup."]
    kinds = ranked["lossless"].map(lossless_kind) if "lossless" in ranked else pd.Series(None, index=ranked.index)
    return [fastest_sentence(ranked[kinds.map(lambda kind, wanted=wanted: kind is wanted)], name, label_axes(summary))
            + "  " for wanted, name in LOSSLESS_KINDS if (kinds.map(lambda kind, wanted=wanted: kind is wanted)).any()]


def fastest_sentence(ranked: pd.DataFrame, kind: str, axes: list[str]) -> str:
    """The setting with the highest pooled speedup among ``ranked`` (one kind), its interval, and its ratio over the
    next best of the same kind; a lossy one with what its outputs are worth."""
    best = ranked.iloc[0]
    sentence = (f"**Fastest {kind}:** {label(best, axes)}, pooled speedup {best['speedup_pooled']:.2f}× over the "
                f"autoregressive baseline ({pooled_ci_text(best, 'speedup')}, {best['n_prompts']} prompts)")
    if len(ranked) > 1:
        runner_up = ranked.iloc[1]
        sentence += (f", {best['speedup_pooled'] / runner_up['speedup_pooled']:.2f}× the next {kind} "
                     f"({label(runner_up, axes)}: {runner_up['speedup_pooled']:.2f}×)")
        if math.isnan(best["speedup_pooled_ci_low"]) or math.isnan(runner_up["speedup_pooled_ci_high"]):
            sentence += "; without intervals (too few prompts) treat this ordering with caution"
        elif best["speedup_pooled_ci_low"] <= runner_up["speedup_pooled_ci_high"]:
            sentence += "; their 95% CIs overlap, so treat this ordering with caution"
    if kind == "lossy":
        sentence += quality_text(best)
    return sentence + "."


def quality_text(run: pd.Series) -> str:
    """What a lossy run's outputs are worth: the share identical to the target's own at temperature 0, and the
    target's mean log-likelihood of them beside that of its own outputs."""
    parts = []
    if not math.isnan(run.get("identical_outputs", math.nan)):
        parts.append(f"{100 * run['identical_outputs']:.0f}% of outputs identical to the target's greedy ones")
    if not math.isnan(run.get("log_likelihood_mean", math.nan)):
        parts.append(f"target log-likelihood per token {run['log_likelihood_mean']:.2f} vs "
                     f"{run['baseline_log_likelihood_mean']:.2f} for its own outputs")
    return f"; lossy: {', '.join(parts)}" if parts else "; lossy: its outputs do not follow the target's distribution"


def pooled_ci_text(run: pd.Series, metric: str) -> str:
    low, high = run[f"{metric}_pooled_ci_low"], run[f"{metric}_pooled_ci_high"]
    if math.isnan(low):
        return f"no 95% CI: fewer than {MIN_PROMPTS_FOR_INTERVAL} prompts"
    return f"95% bootstrap CI {low:.2f}–{high:.2f}"


def ci_text(run: pd.Series, metric: str) -> str:
    low, high = run[f"{metric}_ci_low"], run[f"{metric}_ci_high"]
    if math.isnan(low):
        return f"no 95% CI: fewer than {MIN_PROMPTS_FOR_INTERVAL} prompts"
    return f"95% CI {low:.2f}–{high:.2f}"


def summary_section(summary: pd.DataFrame) -> str:
    """One line per run: its setting, whether it is lossless, each figure pooled [95% bootstrap CI], the speedup's
    per-prompt mean [95% t CI] beside it, and what its outputs say."""
    axes = label_axes(summary)
    table = summary[axes].copy()
    table["lossless"] = [lossless_text(run) for _, run in summary.iterrows()]
    table["speedup (pooled)"] = [with_pooled_ci(run, "speedup") for _, run in summary.iterrows()]
    table["speedup (per-prompt mean)"] = [with_ci(run, "speedup") for _, run in summary.iterrows()]
    if (summary["replicates"] > 1).any():
        table["speedup between replicates"] = [between_text(run, "speedup") for _, run in summary.iterrows()]
    table["Spec-Bench speedup"] = [with_pooled_ci(run, "spec_bench_speedup") for _, run in summary.iterrows()]
    for metric, name in (("acceptance_rate", "acceptance rate"), ("mean_accepted_length", "τ (tokens/target call)"),
                         ("vllm_acceptance_length", "vLLM AL"),
                         ("spec_tokens_per_s", "tok/s"), ("baseline_tokens_per_s", "baseline tok/s")):
        table[f"{name} (pooled)"] = [with_pooled_ci(run, metric) for _, run in summary.iterrows()]
    table["predicted speedup"] = summary["predicted_speedup"]
    table["prompts"] = summary["n_prompts"]
    table["too short"] = summary["short_prompts"]
    if summary["identical_outputs"].notna().any():
        table["identical outputs"] = [format_share(value) for value in summary["identical_outputs"]]
    if summary["log_likelihood_mean"].notna().any():
        table["log-likelihood (target's own)"] = [
            "" if math.isnan(run["log_likelihood_mean"]) else
            f"{run['log_likelihood_mean']:.2f} ({run['baseline_log_likelihood_mean']:.2f})"
            for _, run in summary.iterrows()]
    table["partial"] = summary["partial"].map({True: "yes", False: ""})
    if "most_concurrent_jobs" in summary and (summary["most_concurrent_jobs"] > 1).any():
        table["concurrent jobs"] = summary["most_concurrent_jobs"]
    if "hosts" in summary and len(set(", ".join(summary["hosts"]).split(", "))) > 1:
        table["hosts"] = summary["hosts"]
    return ("## Runs\n\nPooled: totals over a run's prompts (speedup: total baseline seconds per token over total "
            "speculative seconds per token; acceptance: total accepted over total drafted; τ: total emitted over "
            "total "
            "target calls) [95% bootstrap interval over prompts]. Per-prompt mean: the mean of each prompt's ratio "
            "[95% Student t interval], without the prompts too short to time (`too short`). Predicted speedup from "
            "the pooled acceptance rate, the k the steps drafted and the mean cost ratio (Leviathan et al., 2023), "
            "the same figure as summary.json's. Identical outputs: the share "
            "of prompts (temperature 0) whose output equals the baseline's; log-likelihood: the target's mean "
            "log-probability per token of a lossy run's outputs (of its own). All columns in `summary.csv`.\n\n"
            + to_markdown(table, index=False))


def between_text(run: pd.Series, metric: str) -> str:
    """'0.87–1.10, sd 0.10 (4)': a pooled figure's range and standard deviation over the run's replicates."""
    if run["replicates"] < 2:
        return ""
    low, high, sd = (run[f"{metric}_between_{stat}"] for stat in ("min", "max", "sd"))
    return f"{format_cell(low)}–{format_cell(high)}, sd {format_cell(sd)} ({run['replicates']})"


def lossless_text(run: pd.Series) -> str:
    kind = lossless_kind(run.get("lossless"))
    return {True: "yes", False: "**no**", None: "?"}[kind]


def format_share(value: float) -> str:
    return "" if math.isnan(value) else f"{100 * value:.0f}%"


def with_pooled_ci(run: pd.Series, metric: str, prefix: str = "pooled_") -> str:
    """'1.23 [1.1, 1.4]': a pooled figure and its interval, from the columns <metric>_pooled, <metric>_pooled_ci_low
    and <metric>_pooled_ci_high (``prefix=""``: <metric>, <metric>_ci_low, <metric>_ci_high)."""
    names = ("pooled", f"{prefix}ci_low", f"{prefix}ci_high") if prefix else ("", "ci_low", "ci_high")
    value, low, high = (run[f"{metric}_{name}" if name else metric] for name in names)
    if math.isnan(low):
        return format_cell(value)
    return f"{format_cell(value)} [{format_cell(low)}, {format_cell(high)}]"


def with_ci(run: pd.Series, metric: str) -> str:
    mean, low, high = (run[f"{metric}_{stat}"] for stat in ("mean", "ci_low", "ci_high"))
    if math.isnan(low):
        return format_cell(mean)
    return f"{format_cell(mean)} [{format_cell(low)}, {format_cell(high)}]"


def pivot_axes(summary: pd.DataFrame, x: str | None = None, hue: str | None = None) -> tuple[list[str], str | None]:
    """The sweep's x axis (``plot_axes``: k, else what varies) across the columns, the other varying settings
    down the rows, so that each cell is one run; a single varying axis goes down the rows."""
    x, hue_axes = plot_axes(summary, x, hue)
    if not varying_axes(summary):
        return [], None
    if not hue_axes:
        return [x], None
    return hue_axes, x


def pivot_section(summary: pd.DataFrame, out_dir: Path, x: str, hue_axes: list[str]) -> str:
    rows, cols = pivot_axes(summary, x, hue_axes[0] if len(hue_axes) == 1 else None)
    if not rows:
        return "## Comparisons\n\nA single setting was run; nothing to pivot.\n"
    if len(hue_axes) > 1:
        rows = hue_axes
    if "lossless" in summary and "lossless" not in rows + [cols] and determined(summary, rows, "lossless"):
        rows = [*rows, "lossless"]  # every table says which settings are lossless
        summary = summary.assign(lossless=summary["lossless"].map(lambda value: {True: "yes", False: "no"}.get(
            lossless_kind(value), "?")))
    parts = [f"## Comparisons\n\nPooled over prompts; rows: {', '.join(rows)}"
             + (f"; columns: {cols}" if cols else "") + ". CSVs: "
             + ", ".join(f"`pivot_{metric}.csv`" for metric in PIVOT_METRICS) + ".\n"]
    for metric in PIVOT_METRICS:
        table = pivot_metric(summary, f"{metric}_pooled", rows, cols)
        table.to_csv(out_dir / f"pivot_{metric}.csv")
        if cols:
            table.columns = [f"{cols}={format_value(value)}{lossy_mark(summary, cols, value, rows)}"
                             for value in table.columns]
        else:
            table.columns = [metric]
        parts.append(f"### {metric}\n\n{to_markdown(table)}")
    return "\n".join(parts)


def determined(summary: pd.DataFrame, axes: list[str], column: str) -> bool:
    """Whether each combination of ``axes`` comes with one value of ``column``."""
    return (summary.groupby(axes, dropna=False)[column].nunique(dropna=False) <= 1).all()


def lossy_mark(summary: pd.DataFrame, cols: str, value, rows: list[str]) -> str:
    """' (lossy)' on a pivot column whose runs are all lossy, where the rows do not say it."""
    if "lossless" not in summary or "lossless" in rows:
        return ""
    kinds = summary.loc[summary[cols] == value, "lossless"].map(lossless_kind)
    return " (lossy)" if len(kinds) and (kinds.map(lambda kind: kind is False)).all() else ""


def category_section(frame: pd.DataFrame, summary: pd.DataFrame, out_dir: Path) -> str:
    """Per category of the prompts (a task suite's: MT-bench's eight, HumanEval, prose), per run: speedup (with its
    95% bootstrap interval), τ and acceptance rate pooled over the category's prompts, and over all of them, as
    Spec-Bench tabulates them; `categories.csv` holds them with the prompts and the short ones counted. Empty where
    no prompt has a category."""
    if "category" not in frame or not frame["category"].notna().any():
        return ""
    axes = label_axes(summary)
    labels = {run["run_dir"]: table_label(run, axes) for _, run in summary.iterrows()}
    categories = sorted(frame["category"].dropna().unique())
    records = []
    for run_dir, rows in frame.groupby("run_dir", sort=False):
        for category in [*categories, "overall"]:
            chosen = rows if category == "overall" else rows[rows["category"] == category]
            row_dicts = [{key: none_for_nan(value) for key, value in row.items()} for row in chosen.to_dict("records")]
            figures = {metric: pooled_figure(row_dicts, metric) for metric in CATEGORY_METRICS}
            records.append({"setting": labels[run_dir], "category": category, "prompts": len(row_dicts),
                            "too_short": sum(map(too_short, row_dicts)),
                            **{metric: figure["value"] for metric, figure in figures.items()},
                            "speedup_ci_low": figures["speedup"]["ci_low"],
                            "speedup_ci_high": figures["speedup"]["ci_high"]})
    long = pd.DataFrame(records)
    long.to_csv(out_dir / "categories.csv", index=False)
    long["speedup"] = [with_pooled_ci(record, "speedup", prefix="") for _, record in long.iterrows()]
    prompts = frame.drop_duplicates("prompt_id")["category"].value_counts()
    parts = ["## Per category\n\nEach run's figures pooled over the prompts of each category (`overall`: all of "
             f"them), speedup [95% bootstrap CI]; prompts per category: "
             f"{', '.join(f'{c} {prompts.get(c, 0)}' for c in categories)}. CSV: `categories.csv` (with the prompts "
             "too short to time in each).\n"]
    for metric, name in CATEGORY_METRICS.items():
        table = long.pivot(index="setting", columns="category", values=metric)
        table = table.loc[list(dict.fromkeys(long["setting"])), [*categories, "overall"]]
        parts.append(f"### {name}\n\n{to_markdown(table)}")
    return "\n".join(parts)


def systems_section(summary: pd.DataFrame) -> str:
    """Ours against transformers, where the runs hold more than one system (``system=specdec,hf_assisted``): per
    setting, each system's pooled tokens/s and speedup over our baseline (each run interleaved with its own), and
    the ratio of ours to each other system by those speedups. Empty otherwise."""
    if "system" not in summary or summary["system"].nunique() < 2 or "specdec" not in set(summary["system"]):
        return ""
    others = [system for system in summary["system"].unique() if system != "specdec"]
    axes = [axis for axis in label_axes(summary) if axis not in ("system", "system_settings", "drafter", "strategy")]
    groups = summary.groupby(axes, sort=False, dropna=False) if axes else [((), summary)]
    records = []
    for key, runs in groups:
        by_system = {run["system"]: run for _, run in runs.iterrows()}
        ours = by_system.get("specdec")
        record = {axis: format_value(value) for axis, value in zip(axes, key if isinstance(key, tuple) else (key,))}
        for system in ["specdec", *others]:
            run = by_system.get(system)
            lossy = " (lossy)" if run is not None and lossless_kind(run.get("lossless")) is False else ""
            record[f"{system} tok/s"] = with_pooled_ci(run, "spec_tokens_per_s") + lossy if run is not None else ""
            record[f"{system} speedup"] = with_pooled_ci(run, "speedup") if run is not None else ""
            if run is not None and not math.isnan(run["identical_outputs"]):
                record[f"{system} identical to baseline"] = format_share(run["identical_outputs"])
        for system in others:
            run = by_system.get(system)
            both = ours is not None and run is not None
            ratio = ours["speedup_pooled"] / run["speedup_pooled"] if both else math.nan
            record[f"ours / {system}"] = "" if math.isnan(ratio) else f"{ratio:.2f}×"
        records.append(record)
    settings = "; ".join(sorted({str(value) for value in summary["system_settings"].dropna()}))
    return ("## Ours against transformers\n\nEach system's runs decode the same prompts beside our autoregressive "
            "baseline, interleaved; tokens/s and speedup over that baseline pooled over prompts [95% bootstrap CI]. "
            "`ours / X` is the ratio of the speedups, each over its own baseline, so drift between runs cancels. "
            f"transformers ran as: {settings or 'named in the rows'}.\n\n"
            + to_markdown(pd.DataFrame(records), index=False))


def plot_section(summary: pd.DataFrame, out_dir: Path, x: str | None = None, hue: str | None = None) -> str:
    parts = ["## Plots\n"]
    for filename, plot, caption in PLOTS:
        plot(summary, out_dir / filename, x, hue)
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
        "setting": [table_label(run, axes) for _, run in summary.iterrows()],
        "drafted per call": [format_cell(v) for v in verified],
        "τ (tokens/target call)": [with_pooled_ci(run, "mean_accepted_length") for _, run in summary.iterrows()],
        "speedup": [with_pooled_ci(run, "speedup") for _, run in summary.iterrows()],
    }).iloc[verified.argsort(kind="stable")]
    return ("## Trees against chains\n\nEach run's draft tokens verified per target call (a chain's k, a tree's "
            "nodes), then τ and speedup, pooled [95% CI]: compare a tree with the chain that verifies as many tokens. "
            "A tree's acceptance rate counts every node it drafted, so compare τ, not acceptance.\n\n"
            + to_markdown(table, index=False) + "\n")


def acceptance_section(summary: pd.DataFrame) -> str:
    """The acceptance metrics as the field reports them: a definitions table with vLLM's and Spec-Bench's names,
    then per run τ and vLLM's AL with 95% CIs, the acceptance rate, a_i and the accepted-per-step histogram."""
    definitions = pd.DataFrame(DEFINITIONS, columns=["ours", "definition", "vLLM", "Spec-Bench"])
    axes = label_axes(summary)
    table = pd.DataFrame({
        "setting": [table_label(run, axes) for _, run in summary.iterrows()],
        "τ (pooled)": [with_pooled_ci(run, "mean_accepted_length") for _, run in summary.iterrows()],
        "vLLM AL (pooled)": [with_pooled_ci(run, "vllm_acceptance_length") for _, run in summary.iterrows()],
        "acceptance rate (pooled)": [with_pooled_ci(run, "acceptance_rate") for _, run in summary.iterrows()],
        "a_i (i = 1..k), pooled [95% CI] (verified)": [per_position_text(run) for _, run in summary.iterrows()],
        "steps by drafts kept, h_0..h_k (share)": [histogram_text(run["accepted_histogram"])
                                                   for _, run in summary.iterrows()],
    })
    return ("## Acceptance, as the field reports it\n\nDefinitions, beside vLLM's and Spec-Bench's names for the "
            "same things:\n\n" + to_markdown(definitions, index=False)
            + "\n\nPer run, every figure pooled over its prompts and rounds [95% bootstrap interval]: τ (total "
            "emitted / total target calls), vLLM's AL (1 + total accepted / total calls that verified drafts), the "
            "acceptance rate, a_i (accepted at i over verified at i) with the positions verified, where the rows "
            "count them (else the per-prompt mean); the histogram sums every prompt's steps (plot below). τ counts "
            "every target call, vLLM's AL only those that verified drafts: it is τ over the calls that drafted, "
            "and differs from τ where a drafter's first call drafts nothing (EAGLE and Medusa heads). Per-prompt "
            "means are in `summary.csv` (`<metric>_mean`).\n\n" + to_markdown(table, index=False) + "\n")


def per_position_text(run: pd.Series) -> str:
    """'0.97 [0.95, 0.99] (240), 0.63 [...] (12), –': a_i pooled with its interval and count where the rows count
    positions, else the per-prompt means; a dash where no prompt reached position i."""
    pooled = run.get("per_position_pooled")
    if not (isinstance(pooled, list) and pooled):
        return ", ".join("–" if value is None or math.isnan(value) else format_cell(value)
                         for value in run["per_position_acceptance_mean"])
    cells = []
    for value, low, high, attempts in zip(pooled, run["per_position_ci_low"], run["per_position_ci_high"],
                                          run["per_position_attempts"]):
        if not attempts:
            cells.append("–")
        elif math.isnan(low):
            cells.append(f"{format_cell(value)} ({attempts})")
        else:
            cells.append(f"{format_cell(value)} [{format_cell(low)}, {format_cell(high)}] ({attempts})")
    return ", ".join(cells)


def load_section(summary: pd.DataFrame, out_dir: Path) -> str:
    """Where the batch size varies (a load study, docs/load.md): pooled speedup by batch size per setting
    (`pivot_speedup_by_batch.csv`, `speedup_by_batch.png`); and, for every run, the draft lengths its steps took
    (share of steps by k) and a cost-modelling policy's modelled against measured seconds per step."""
    if "batch_size" not in summary or summary["batch_size"].nunique() < 2:
        return ""
    axes = [axis for axis in varying_axes(summary) if axis != "batch_size"] or ["draft_length"]
    table = pivot_metric(summary, "speedup_pooled", axes, "batch_size")
    table.to_csv(out_dir / "pivot_speedup_by_batch.csv")
    table.columns = [f"batch {format_value(value)}" for value in table.columns]
    plot_speedup(summary, out_dir / "speedup_by_batch.png", x="batch_size", hue=axes[0])
    labels = label_axes(summary)
    chosen = pd.DataFrame({
        "setting": [table_label(run, labels) for _, run in summary.iterrows()],
        "steps by k drafted (share)": [histogram_text(run.get("k_histogram")) for _, run in summary.iterrows()],
        "modelled / measured ms per step": [step_cost_text(run) for _, run in summary.iterrows()],
    })
    return ("## Speedup by load\n\nPooled speedup over the same loop without a draft, by batch size (a setting "
            "with fewer than 4 timed calls per side is noise; its run warned). CSV: `pivot_speedup_by_batch.csv`.\n\n"
            + to_markdown(table) + "\n\n![speedup by batch size](speedup_by_batch.png)\n\n"
            "What each run drafted: its steps by the k they drafted (0: a plain decode step), and where the policy "
            "models step costs (`cost_optimal`), its mean modelled and measured milliseconds per decode step.\n\n"
            + to_markdown(chosen, index=False) + "\n")


def step_cost_text(run: pd.Series) -> str:
    modelled, measured = run.get("modelled_step_seconds"), run.get("measured_step_seconds")
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (modelled, measured)):
        return ""
    return f"{1000 * modelled:.2f} / {1000 * measured:.2f}"


def histogram_text(histogram: list) -> str:
    """'0: 12%, 1: 30%, ...' for h_0..h_k; an empty cell where the rows hold none."""
    total = sum(histogram) if isinstance(histogram, list) else 0
    if not total:
        return ""
    return ", ".join(f"{j}: {100 * count / total:.0f}%" for j, count in enumerate(histogram))


if __name__ == "__main__":
    sys.exit(main())
