"""The results schema: the files of a run directory, the metric columns of a row, and how rows are read back.

``experiments/`` writes run directories and ``analysis/`` reads them; both take the schema from here, so the two
sides cannot drift apart. Plain Python and json only (scipy is imported inside ``confidence_interval``), so
writing results pulls in neither pandas nor the analysis code. What each column means, and the identity columns,
are in docs/results-schema.md.

A run directory holds

    config.yaml             the resolved config, written before the first prompt
    rows.jsonl              one JSON object per prompt, appended and flushed as each prompt finishes
    summary.json            written at the end; its absence marks a partial (killed) run
    rows.set-aside.jsonl    pieces of rows.jsonl that did not parse, moved aside on resume (rarely present)
    failure.json            a sweep job that ended with an error: its exit code and the one-line error
"""

from __future__ import annotations

import json
import math
from pathlib import Path

CONFIG, ROWS, SUMMARY, SET_ASIDE = "config.yaml", "rows.jsonl", "summary.json", "rows.set-aside.jsonl"
FAILURE = "failure.json"

# The per-prompt measurements of a row, in the order a row holds them; every other column of a row describes the
# run's setting or the prompt.
METRIC_COLUMNS = (
    "emitted", "drafted", "accepted", "target_calls", "draft_calls",
    "acceptance_rate", "mean_accepted_length", "per_position_acceptance", "expected_acceptance",
    "draft_seconds", "target_seconds", "other_seconds", "spec_seconds", "baseline_seconds", "baseline_emitted",
    "spec_tokens_per_s", "baseline_tokens_per_s", "speedup", "cost_ratio", "predicted_speedup",
    "ttft_seconds", "itl_seconds", "baseline_ttft_seconds", "baseline_itl_seconds",
)
PROMPT_COLUMNS = ("prompt_id", "prompt_tokens")
# Where and beside what a row was measured: neither a setting to compare nor a metric, but what its timings depend on.
CONDITION_COLUMNS = ("host", "concurrent_jobs")
# Metrics whose value is a list (one per draft position); a W&B table holds them as JSON text.
LIST_COLUMNS = ("per_position_acceptance",)
# Metrics summarised per run as the mean over prompts with a 95% Student t interval (summary.json, analysis/).
INTERVAL_METRICS = (
    "speedup", "acceptance_rate", "mean_accepted_length", "spec_tokens_per_s", "baseline_tokens_per_s",
    "cost_ratio", "predicted_speedup",
)
# Where a summarised metric can lie: its interval is clipped to this range (a t interval on few, spread-out prompts
# can reach below 0 or above 1).
METRIC_RANGES = {
    "speedup": (0.0, math.inf), "acceptance_rate": (0.0, 1.0), "mean_accepted_length": (0.0, math.inf),
    "spec_tokens_per_s": (0.0, math.inf), "baseline_tokens_per_s": (0.0, math.inf), "cost_ratio": (0.0, math.inf),
    "predicted_speedup": (0.0, math.inf),
}
MIN_PROMPTS_FOR_INTERVAL = 3  # with 2, t_{0.975, 1} = 12.7: an "interval" that says nothing


def confidence_interval(values, level: float = 0.95, metric: str | None = None) -> tuple[float, float, float]:
    """(mean, low, high): mean ± t_{(1+level)/2, n-1} · s / sqrt(n) over the finite values (None and NaN are
    skipped), clipped to the metric's range (``METRIC_RANGES``); NaN bounds with fewer than
    ``MIN_PROMPTS_FOR_INTERVAL`` values, NaN throughout with none."""
    x = finite_values(values)
    n = len(x)
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = math.fsum(x) / n
    if n < MIN_PROMPTS_FOR_INTERVAL:
        return mean, math.nan, math.nan
    from scipy.stats import t  # here, so that importing the schema costs nothing

    deviation = math.sqrt(math.fsum((v - mean) ** 2 for v in x) / (n - 1))
    half = float(t.ppf((1 + level) / 2, n - 1)) * deviation / math.sqrt(n)
    lowest, highest = METRIC_RANGES.get(metric, (-math.inf, math.inf))
    return mean, max(mean - half, lowest), min(mean + half, highest)


def finite_values(values) -> list[float]:
    """The values that are finite numbers, as floats (JSON writes an undefined metric as null)."""
    numbers = (float(v) for v in values if v is not None)
    return [v for v in numbers if math.isfinite(v)]


def parse_line(line: str) -> tuple[list[dict], list[str]]:
    """The rows on one line of rows.jsonl, and the pieces of it that do not parse. A line can hold more than one
    row: a row that lost its newline had the next one appended to it. After a piece that does not parse, parsing
    resumes at the next "{", so a torn row never takes an intact one with it."""
    decoder, rows, unparsed, text = json.JSONDecoder(), [], [], line.strip()
    position = 0
    while position < len(text):
        try:
            row, end = decoder.raw_decode(text, position)
            if not isinstance(row, dict):
                raise ValueError("a row is a JSON object")
        except ValueError:
            following = text.find("{", position + 1)
            end = following if following != -1 else len(text)
            unparsed.append(text[position:end].strip())
            position = end
            continue
        rows.append(row)
        position = len(text) - len(text[end:].lstrip())
    return rows, unparsed


def parse_rows(text: str) -> tuple[list[dict], list[tuple[int, str]]]:
    """Every row in rows.jsonl text (two rows merged on one line included), and each piece of a line that does
    not parse as (line number, piece). What to do with those pieces is the reader's choice: resume sets them
    aside, analysis/ drops the torn last line of a killed run and refuses any other."""
    rows, unparsed = [], []
    for number, line in enumerate(text.splitlines(), 1):
        line_rows, line_unparsed = parse_line(line)
        rows += line_rows
        unparsed += [(number, piece) for piece in line_unparsed]
    return rows, unparsed


def read_rows(run_dir: Path) -> list[dict]:
    """The rows of a run directory that parse (none if it has no rows.jsonl yet)."""
    path = Path(run_dir) / ROWS
    return parse_rows(path.read_text(encoding="utf-8"))[0] if path.exists() else []


def markdown_table(header: list, rows: list[list]) -> str:
    """A GitHub Markdown table, each cell as ``str(cell)`` with "|" escaped; no trailing newline. The benches and
    analysis/ both write theirs with it, each formatting its numbers first."""
    lines = [header, ["---"] * len(header), *rows]
    return "\n".join("| " + " | ".join(str(cell).replace("|", r"\|") for cell in line) + " |" for line in lines)
