"""A run's summary, once its rows are on disk: summary.json's figures (``specdec.results.summarize_rows``) with the
run's identity, compile time and provenance, and the fixed-width table the console shows of them."""

from __future__ import annotations

import math
from pathlib import Path

from specdec.results import IDENTITY_COLUMNS, MIN_PROMPTS_FOR_INTERVAL, PROVENANCE_COLUMNS, summarize_rows


def complete_summary(rows: list[dict], batch_size: int, rounds: int, load_at_start: float | None,
                load_at_end: float | None) -> dict:
    """summary.json of a complete run: its identity, how it was batched and repeated, its compile time and
    provenance, and the figures of ``summarize_rows``."""
    return {"status": "complete", **identity(rows[0]), "batch_size": batch_size, "rounds": rounds,
            "compile_seconds": run_compile_seconds(rows),
            "provenance": run_provenance(rows, load_at_start, load_at_end), **summarize_rows(rows)}


def identity(row: dict) -> dict:
    """The identity columns of a row: the setting every row of its run shares."""
    return {name: row[name] for name in IDENTITY_COLUMNS if name in row}


def run_provenance(rows: list[dict], load_at_start: float | None, load_at_end: float | None) -> dict:
    """summary.json's ``provenance``: the provenance columns of the run's first row, the machine's load average
    when this process started decoding and when it ended, and ``differs``: the provenance columns whose value is
    not the same in every row (a run resumed at another commit or on another machine), so that it is never hidden."""
    first = rows[0]
    differs = [name for name in PROVENANCE_COLUMNS if len({repr(row.get(name)) for row in rows}) > 1]
    return {**{name: first.get(name) for name in PROVENANCE_COLUMNS},
            "load_average": {"start": load_at_start, "end": load_at_end}, "differs": differs}


def run_compile_seconds(rows: list[dict]) -> float | None:
    """The summary's ``compile_seconds``: the longest warm-up among the rows (a resumed run warmed up once per
    process); None for an eager run."""
    values = [row.get("compile_seconds") for row in rows]
    return max((value for value in values if isinstance(value, (int, float))), default=None)


def title(row: dict, num_rows: int, out_dir: Path) -> str:
    system = "" if row["system"] == "specdec" else f"system={row['system']} "
    eos = "stops at EOS" if row.get("stop_at_eos") else "EOS ignored"
    return (f"{out_dir}: pair={row['pair']} {system}drafter={row['drafter']} strategy={row['strategy']} "
            f"(lossless: {'yes' if row['lossless'] else 'no'}) k={row['k']} sampling={row['sampling']} "
            f"stop_at_eos={str(bool(row.get('stop_at_eos'))).lower()} ({eos}) ({num_rows} rows)\n"
            f"code {row.get('git_commit') or 'unknown'}{' (dirty)' if row.get('git_dirty') else ''}, torch "
            f"{row.get('torch_version')}, transformers {row.get('transformers_version')}; weights target "
            f"{row.get('target_weights')}, drafter {row.get('drafter_weights')}; {row.get('processor')}, "
            f"{row.get('torch_threads')} threads")


# The console's rows, in order: each pooled figure beside its per-prompt mean where it has one.
CONSOLE_FIGURES = ("speedup", "spec_bench_speedup", "acceptance_rate", "mean_accepted_length",
                   "vllm_acceptance_length", "spec_tokens_per_s", "baseline_tokens_per_s", "cost_ratio",
                   "predicted_speedup")


def format_table(summary: dict, title: str) -> str:
    """The run summary as a short fixed-width table: each figure pooled over the prompts and rounds (with its
    bootstrap interval) beside its per-prompt mean (with its t interval), the spread of the pooled figure between
    rounds where there are several, the greedy repeats that disagree, and the prompts too short to time, named."""
    def bounds(low, high, n) -> str:
        if 0 < n < MIN_PROMPTS_FOR_INTERVAL:
            return f"n/a (< {MIN_PROMPTS_FOR_INTERVAL} prompts)"
        if low is None or not math.isfinite(low):
            return "n/a"
        return f"[{low:.3f}, {high:.3f}]"

    def number(value) -> str:
        return f"{value:.3f}" if isinstance(value, (int, float)) and math.isfinite(value) else "n/a"

    spread = summary.get("between_rounds") or {}
    several = spread.get("replicates", 1) > 1
    lines = [title, f"{'figure':<22} {'pooled':>9}   {'95% CI (bootstrap)':<21} {'per-prompt mean':>15}   "
                    f"{'95% CI (t)':<21} {'n':>4}" + (f"   {'between rounds (min-max, sd)':<28}" if several else "")]
    for name in CONSOLE_FIGURES:
        mean, pooled = summary["metrics"].get(name), summary["pooled"].get(name)
        pooled_cells = f"{'':>9}   {'':<21}"
        if pooled:
            interval = bounds(pooled["ci_low"], pooled["ci_high"], pooled["prompts"])
            pooled_cells = f"{number(pooled['value']):>9}   {'' if name == 'predicted_speedup' else interval:<21}"
        mean_cells = f"{'':>15}   {'':<21} {'':>4}"
        if mean:
            mean_cells = (f"{number(mean['mean']):>15}   {bounds(mean['ci_low'], mean['ci_high'], mean['n']):<21} "
                          f"{mean['n']:>4}")
        rounds_cell = ""
        if several and name in spread:
            figure = spread[name]
            rounds_cell = f"   {number(figure['min'])}-{number(figure['max'])}, sd {number(figure['sd'])}"
        lines.append(f"{name:<22} {pooled_cells} {mean_cells}{rounds_cell}")
    short = summary["short_prompts"]
    if short["count"]:
        named = ", ".join(short["prompt_ids"][:8]) + (", ..." if short["count"] > 8 else "")
        rows = summary.get("rows", summary["prompts"])
        counted = f"{rows} prompts" if rows == summary["prompts"] else f"{rows} (prompt, round) rows"
        lines.append(f"too short to time: {short['count']} of {counted} ({named}), left out of "
                     "the per-prompt means of timings, counted in the pooled figures (rule in summary.json)")
    if summary.get("greedy_repeats_disagree"):
        lines.append(f"warning: greedy repeats disagree in their counts for {', '.join(summary['greedy_repeats_disagree'])}"
                     " (only other code, other weights or a nondeterministic kernel can cause it)")
    lines.append("pooled: totals over all prompts and rounds (speedup = baseline s/token / speculative s/token; "
                 "spec_bench_speedup = mean tok/s / mean baseline tok/s, Spec-Bench's; vllm_acceptance_length = "
                 "1 + accepted / calls that drafted; predicted_speedup from the pooled acceptance, the k the steps "
                 "drafted and the mean cost ratio); n: prompts in the per-prompt mean (timings leave out the short "
                 "ones; cost ratio needs a decode step that drafted)")
    return "\n".join(lines)
