"""Read experiment results (docs/results-schema.md) into one tidy frame: one row per (run, prompt).

Run directories are found by their `rows.jsonl`; a run without a readable `summary.json` was killed and is loaded
as `partial`. Files are read by the readers resume uses (``specdec.results``), so both sides keep the same rows: one
per prompt of one run. What they leave out (damaged pieces, duplicate rows, rows of another run) is said in one
`DamagedRunWarning` per run; what cannot be loaded at all raises a one-line `ResultsError` naming the file or run.
"""

from __future__ import annotations

import json
import numbers
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from specdec.results import (
    CODE_AND_WEIGHTS,
    CONDITION_COLUMNS,
    CONFIG,
    METRIC_COLUMNS,
    OUTPUT_COLUMNS,
    PROMPT_COLUMNS,
    PROMPT_SELECTION_KEYS,
    PROVENANCE_COLUMNS,
    FAILURE,
    FREE_KEYS,
    INTERVAL_METRICS,
    LIST_COLUMNS,
    ROW_KEY,
    ROWS,
    SUMMARY,
    UNREADABLE,
    RowsRead,
    config_difference,
    describe_pieces,
    read_config,
    read_failure,
    read_rows_file,
    read_summary,
    type_problem,
)

# What analysis/ itself reads; other schema columns are loaded when present (rows of older runs lack some).
REQUIRED_COLUMNS = (*ROW_KEY, "pair", "strategy", "k", "sampling", *INTERVAL_METRICS, "per_position_acceptance")


class ResultsError(ValueError):
    """Results on disk or in W&B that cannot be loaded as they are."""


class PartialRunWarning(UserWarning):
    """A run without summary.json (killed or still running) was loaded."""


class DamagedRunWarning(UserWarning):
    """Part of a run directory could not be read as it should be and was left out: pieces of rows.jsonl that are
    not rows, duplicate rows (each prompt counts once), rows of another run, an unreadable summary.json."""


@dataclass
class UnfinishedJob:
    """A run or sweep job directory that holds no complete run."""

    job_dir: Path
    state: str  # "failed" (failure.json), "skipped" (summary.json says so), "no rows" (neither, and no rows),
    # "unreadable" (rows.jsonl cannot be read: a directory, no permission)
    detail: str  # the error, the reason, or what may have happened
    rows: int  # rows it kept


@dataclass
class RunRows:
    source: str  # run directory or W&B run URL, named in every error
    rows: list[dict]
    partial: bool
    left_out: list[str] = field(default_factory=list)  # one line per thing the readers left out (also warned)
    config: dict | None = None  # the run's resolved config (config.yaml, W&B's config); None where unreadable


def load_runs(*paths: str | os.PathLike, config_keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """Load run and sweep directories into one frame, one row per (run, prompt).

    Adds `run_dir` and `partial` (no readable summary.json). `config_keys` are dotted keys of config.yaml
    (e.g. "model.target.name") copied into columns of that name, for settings the rows do not carry.
    """
    return build_frame(read_runs(find_run_dirs(paths), config_keys))


def read_runs(run_dirs: list[Path], config_keys: tuple[str, ...] = ()) -> list[RunRows]:
    return [read_run(run_dir, config_keys) for run_dir in run_dirs]


def check_paths(paths) -> list[Path]:
    """The paths as directories, or a one-line ResultsError naming the first that is not one."""
    if not paths:
        raise ResultsError("no paths given; pass run or sweep directories")
    for path in map(Path, paths):
        if not path.exists():
            raise ResultsError(f"{path}: no such file or directory")
        if not path.is_dir():
            raise ResultsError(f"{path}: not a directory; pass a run or sweep directory")
    return list(map(Path, paths))


def find_run_dirs(paths) -> list[Path]:
    """Run directories (those holding rows.jsonl) at or below each path, in natural job order."""
    found: dict[Path, None] = {}  # ordered set: the same run reached twice is loaded once
    for path in check_paths(paths):
        rows_files = sorted(path.rglob(ROWS), key=lambda p: _natural_key(p.relative_to(path)))
        if not rows_files:
            raise ResultsError(f"{path}: no runs found (no {ROWS} in it or below it)")
        found.update((p.parent.resolve(), None) for p in rows_files)
    return list(found)


def loadable_run_dirs(paths, jobs: list[UnfinishedJob]) -> list[Path]:
    """Run directories at or below the paths, in natural job order, without those of ``jobs`` that kept no row: a
    job that failed or was killed before its first prompt finished leaves an empty rows.jsonl, which `load_runs`
    refuses; a report names such jobs instead."""
    empty = {job.job_dir for job in jobs if job.rows == 0}
    found: dict[Path, None] = {}
    for path in check_paths(paths):
        for rows_file in sorted(path.rglob(ROWS), key=lambda p: _natural_key(p.relative_to(path))):
            if rows_file.parent.resolve() not in empty:
                found[rows_file.parent.resolve()] = None
    return list(found)


# What marks a directory as a run or sweep job, whatever became of it: Hydra writes .hydra/ as the job starts.
JOB_MARKERS = (".hydra", CONFIG, ROWS, SUMMARY, FAILURE)


def unfinished_jobs(*paths: str | os.PathLike) -> list[UnfinishedJob]:
    """Run and sweep job directories at or below the paths that hold no complete run, in natural job order: jobs
    that failed (with their error, and how many rows they kept), jobs a sweep skipped (with the reason), and jobs
    with neither a summary nor a row (killed before their first prompt finished, or still running). A run with rows
    but no summary and no error is not listed here: `load_runs` loads it as partial."""
    job_dirs: dict[Path, None] = {}
    for path in check_paths(paths):
        for marker in (found for name in JOB_MARKERS for found in path.rglob(name)):
            # Not Hydra's own .hydra/config.yaml, nor what submitit keeps under .submitit/.
            if not any(part.startswith(".") for part in marker.relative_to(path).parent.parts):
                job_dirs[marker.parent.resolve()] = None
    unfinished = (job_state(job_dir) for job_dir in sorted(job_dirs, key=_natural_key))
    return [job for job in unfinished if job is not None]


def job_state(job_dir: Path) -> UnfinishedJob | None:
    """What became of one job directory; None for a complete run, or a partial one with rows and no error."""
    found = read_rows_file(job_dir)
    if found.problem:
        return UnfinishedJob(job_dir, "unreadable", found.problem, 0)
    rows = len(found.rows)
    failure, failure_problem = read_failure(job_dir)
    if failure is not None or failure_problem is not None:
        error = failure["error"] if failure is not None else f"unreadable failure mark: {failure_problem}"
        return UnfinishedJob(job_dir, "failed", f"{error} ({rows} row(s) kept)", rows)
    summary = read_summary(job_dir).value
    if summary is not None and summary.get("status") == "skipped":
        return UnfinishedJob(job_dir, "skipped", str(summary.get("reason")), rows)
    if rows:
        return None
    if found.set_aside:
        return UnfinishedJob(job_dir, "unreadable", f"{job_dir / ROWS} holds no readable row "
                                                    f"({describe_pieces(found.set_aside)})", 0)
    if summary is not None:
        return UnfinishedJob(job_dir, "no rows", f"{SUMMARY} but no rows", 0)
    return UnfinishedJob(job_dir, "no rows", f"no {SUMMARY} and no rows: killed before its first prompt finished, "
                                             "or still running", 0)


def _natural_key(path: Path) -> list:
    """Sort sweep jobs 0, 1, 2, ..., 10 rather than 0, 1, 10, 2."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", path.as_posix())]


def read_run(run_dir: Path, config_keys: tuple[str, ...] = ()) -> RunRows:
    """Rows of one run directory, one per prompt; warns when the run is partial or when anything was left out."""
    summary = read_summary(run_dir)
    partial = summary.value is None
    found = read_rows_file(run_dir)
    if found.problem:
        raise ResultsError(found.problem)
    if not found.rows:
        raise ResultsError(f"{run_dir / ROWS}: no rows; a run must finish at least one prompt to be loaded")
    left_out = left_out_lines(run_dir, found, partial)
    if summary.problem:
        left_out.append(f"{summary.problem}; loaded as a partial run")
    for line in left_out:
        warnings.warn(line, DamagedRunWarning)
    if partial and summary.problem is None:
        warnings.warn(f"{run_dir}: no {SUMMARY}, loaded {len(found.rows)} rows of a partial (killed?) run",
                      PartialRunWarning)
    if config_keys:
        add_config(found.rows, config_of(run_dir), config_keys, run_dir)
    return RunRows(str(run_dir), found.rows, partial, left_out, read_config(run_dir).value)


def left_out_lines(run_dir: Path, found: RowsRead, partial: bool) -> list[str]:
    """What the reader left out of rows.jsonl, in one line (none if nothing). A killed run may end in a
    half-written line: that one is expected, and warned about as part of the partial run."""
    pieces = found.set_aside
    torn = [piece for piece in pieces if partial and piece.reason == UNREADABLE and piece.line == found.last_line]
    for piece in torn:
        warnings.warn(f"{run_dir / ROWS}:{piece.line}: dropped a half-written last row ({shorten(piece.raw)})",
                      PartialRunWarning)
    damage = [piece for piece in pieces if piece not in torn]
    if not damage:
        return []
    lines = ", ".join(str(piece.line) for piece in damage[:5]) + (", ..." if len(damage) > 5 else "")
    return [f"{run_dir / ROWS}: left out {describe_pieces(damage)} (line(s) {lines}); each prompt counts once"]


def shorten(piece: bytes, width: int = 40) -> str:
    text = piece.decode("utf-8", errors="replace")
    return repr(text if len(text) <= width else text[:width] + "...")


def config_of(run_dir: Path) -> dict:
    """The resolved Hydra config of a run, for ``config_keys``."""
    config, problem = read_config(run_dir)
    if config is None:
        raise ResultsError(problem or f"{run_dir / CONFIG}: missing; config_keys need the run's {CONFIG}")
    return config


def add_config(rows: list[dict], config: dict, keys: tuple[str, ...], source) -> None:
    """Copy dotted config keys into every row; columns the rows already carry win."""
    for key in keys:
        value = config
        for part in key.split("."):
            if not isinstance(value, dict) or part not in value:
                raise ResultsError(f"{source}: config has no key {key!r}")
            value = value[part]
        if isinstance(value, (list, dict)):
            value = json.dumps(value)  # a hashable scalar, so the column can be grouped and compared
        for row in rows:
            row.setdefault(key, value)


def build_frame(runs: list[RunRows]) -> pd.DataFrame:
    """Check the runs share one schema and can be told apart, then concatenate their rows."""
    for run in runs:
        check_required(run)
    check_kinds(runs)
    check_run_ids(runs)
    check_settings_apart(runs)
    return pd.DataFrame([row | {"run_dir": run.source, "partial": run.partial} for run in runs for row in run.rows])


def check_required(run: RunRows) -> None:
    """Each row holds the columns analysis/ reads, and every schema column it holds has the record's type."""
    for number, row in enumerate(run.rows, 1):
        missing = [column for column in REQUIRED_COLUMNS if column not in row]
        if missing:
            raise ResultsError(f"{run.source}: row {number} lacks required column(s) {', '.join(missing)}; "
                               f"required: {', '.join(REQUIRED_COLUMNS)}")
        problem = type_problem(row)
        if problem:
            raise ResultsError(f"{run.source}: row {number}: {problem}")


JSON_KINDS = {bool: "bool", int: "number", float: "number"}  # a float column may hold 1 and 0.5


def _kind(value) -> str:
    """JSON-level type; ints and floats are both numbers."""
    kind = JSON_KINDS.get(type(value))  # the common cases without isinstance: a report may read millions of values
    if kind is not None:
        return kind
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, numbers.Number):
        return "number"
    return type(value).__name__


def check_kinds(runs: list[RunRows]) -> None:
    """Each column holds one kind of value (nulls aside) across all runs."""
    first: dict[str, tuple[str, str]] = {}  # column -> (kind, source where first seen)
    for run in runs:
        for row in run.rows:
            for column, value in row.items():
                if value is None:
                    continue
                kind = _kind(value)
                first_kind, source = first.setdefault(column, (kind, run.source))
                if kind != first_kind:
                    raise ResultsError(f"{run.source}: column {column!r} holds {kind} values "
                                       f"({value!r}) but {source} holds {first_kind}; incompatible schemas")


def check_run_ids(runs: list[RunRows]) -> None:
    """One run_id per run, and no two runs sharing one."""
    owner: dict[str, str] = {}
    for run in runs:
        ids = {row["run_id"] for row in run.rows}
        if len(ids) != 1:
            raise ResultsError(f"{run.source}: rows carry {len(ids)} run_ids {sorted(map(str, ids))}; expected one")
        run_id = ids.pop()
        if owner.setdefault(run_id, run.source) != run.source:
            raise ResultsError(f"{run.source}: run_id {run_id!r} is also used by {owner[run_id]}")


# Row columns that are no setting: which run, which prompt, where it ran, what it measured, what it emitted.
# Provenance is a setting where it names the code or the weights (``CODE_AND_WEIGHTS``: runs differing there are
# never merged), a condition where it names the machine (processor, threads).
MACHINE_COLUMNS = tuple(column for column in PROVENANCE_COLUMNS if column not in CODE_AND_WEIGHTS)
NOT_SETTINGS = {"run_id", "group", *PROMPT_COLUMNS, *CONDITION_COLUMNS, *MACHINE_COLUMNS, *METRIC_COLUMNS,
                *OUTPUT_COLUMNS}
# A seed is a replicate, never a setting: runs that differ only in seed are pooled (``pool_replicates``).
REPLICATE_COLUMNS = ("seed",)


def pool_replicates(frame: pd.DataFrame) -> pd.DataFrame:
    """The frame with the runs that differ only in a replicate column (the seed) as one run: their rows under one
    ``run_dir`` and ``run_id`` (the runs' own, joined by " + "), ``replicate`` naming each row's run and round
    (what the spread between replicates is taken over), ``seed`` as the seeds pooled ("0, 1, 2") wherever a run
    pools several, and ``partial`` where any of them is. Runs that differ in anything else, code and weights
    included, stay apart. A frame whose runs all differ keeps its runs (``replicate`` still names run and
    round)."""
    settings = [column for column in frame.columns if column not in NOT_SETTINGS | set(REPLICATE_COLUMNS)
                and column not in ("run_dir", "partial")
                and not frame[column].map(lambda v: isinstance(v, (list, dict))).any()]
    firsts = frame.drop_duplicates("run_dir")
    keys = {run_dir: json.dumps([None if pd.isna(v) else v for v in values], default=str)
            for run_dir, values in zip(firsts["run_dir"], firsts[settings].astype(object).itertuples(index=False))}
    members: dict[str, list] = {}
    for run_dir in firsts["run_dir"]:
        members.setdefault(keys[run_dir], []).append(run_dir)
    pooled = frame.copy()
    rounds = pooled["round"].fillna(0).astype(int).astype(str) if "round" in pooled else "0"
    pooled["replicate"] = pooled["run_id"].astype(str) + "/" + rounds
    joined_dirs = {run_dir: " + ".join(map(str, dirs)) for dirs in members.values() for run_dir in dirs}
    run_ids = firsts.set_index("run_dir")["run_id"]
    joined_ids = {run_dir: " + ".join(str(run_ids[d]) for d in dirs) for dirs in members.values() for run_dir in dirs}
    pooled["run_id"] = pooled["run_dir"].map(joined_ids)
    if "seed" in pooled and any(len(dirs) > 1 for dirs in members.values()):
        seeds = {run_dir: ", ".join(sorted({str(v) for v in frame.loc[frame["run_dir"].isin(dirs), "seed"]}, key=str))
                 for dirs in members.values() for run_dir in dirs}
        pooled["seed"] = pooled["run_dir"].map(seeds)
    pooled["partial"] = pooled.groupby(pooled["run_dir"].map(joined_dirs))["partial"].transform("any")
    pooled["run_dir"] = pooled["run_dir"].map(joined_dirs)
    return pooled


def run_setting(run: RunRows) -> dict:
    """The setting a run's rows record: every column that is no metric, prompt, condition or output, with the value
    its first row holds (a run's rows share it)."""
    return {column: value for column, value in run.rows[0].items() if column not in NOT_SETTINGS}


def check_settings_apart(runs: list[RunRows]) -> None:
    """Runs whose rows record the same setting but whose configs differ would be merged into one setting by every
    table and plot (a key the rows do not record, or rows written before they recorded it): refused in one line
    naming every key that differs. Runs of one config (repeats) are kept; runs without a readable config are
    not compared."""
    first_with: dict[str, RunRows] = {}
    for run in runs:
        key = json.dumps(run_setting(run), sort_keys=True, default=str)
        earlier = first_with.setdefault(key, run)
        if earlier is run or earlier.config is None or run.config is None:
            continue
        difference = config_difference(earlier.config, run.config, free=FREE_KEYS + PROMPT_SELECTION_KEYS)
        if difference:
            raise ResultsError(f"{run.source} and {earlier.source} record the same setting in their rows, but their "
                               f"configs differ at {difference}; a table would merge them: report them apart, or "
                               "rerun with a version whose rows record that key")


def per_position_long(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-position acceptance in long form: run_id, prompt_id, position (1-based), acceptance.

    A position a prompt never reached has acceptance NaN.
    """
    records = [
        (run_id, prompt_id, position, acceptance)
        for run_id, prompt_id, values in zip(frame["run_id"], frame["prompt_id"], frame["per_position_acceptance"])
        if isinstance(values, list)
        for position, acceptance in enumerate(values, 1)
    ]
    long = pd.DataFrame(records, columns=["run_id", "prompt_id", "position", "acceptance"])
    long["acceptance"] = long["acceptance"].astype(float)
    return long


def load_wandb_runs(project: str, group: str | None = None, entity: str | None = None,
                    config_keys: tuple[str, ...] = ()) -> pd.DataFrame:
    """Load W&B runs into the same frame as `load_runs`.

    Rows are read from the W&B table logged under the key `rows`, `config_keys` from the run config;
    a run whose state is not "finished" is partial. `run_dir` holds the run's URL.
    """
    import wandb  # lazily: loading local results must not pay for, or depend on, wandb

    path = f"{entity}/{project}" if entity else project
    mode = os.environ.get("WANDB_MODE", "")
    if mode in ("offline", "disabled"):
        raise ResultsError(f"W&B project {path}: WANDB_MODE={mode}; the W&B API needs the network, "
                           "load local run directories instead")
    try:
        api = wandb.Api()
        wandb_runs = list(api.runs(path, filters={"group": group} if group else None))
    # The API raises assorted network, auth and lookup errors; all mean "cannot read this project".
    except Exception as err:
        raise ResultsError(f"W&B project {path}: cannot list runs ({_first_line(err)})") from err
    if not wandb_runs:
        raise ResultsError(f"W&B project {path}: no runs" + (f" in group {group!r}" if group else ""))
    return build_frame([read_wandb_run(api, run, config_keys) for run in wandb_runs])


def read_wandb_run(api, run, config_keys: tuple[str, ...]) -> RunRows:
    """Rows of one W&B run, from the `run_table` artifact W&B makes when a wandb.Table is logged as `rows`."""
    try:
        table = api.artifact(f"{run.entity}/{run.project}/run-{run.id}-rows:latest", type="run_table").get("rows")
    except Exception as err:  # same reason as in load_wandb_runs
        raise ResultsError(f"{run.url}: cannot read the `rows` table ({_first_line(err)})") from err
    if table is None or not table.data:
        raise ResultsError(f"{run.url}: the `rows` table is empty")
    rows = [decode_lists(dict(zip(table.columns, values))) for values in table.data]
    partial = run.state != "finished"
    if partial:
        warnings.warn(f"{run.url}: state {run.state!r}, loaded {len(rows)} rows of a partial run",
                      PartialRunWarning)
    add_config(rows, dict(run.config), config_keys, run.url)
    return RunRows(run.url, rows, partial, config=dict(run.config))


def decode_lists(row: dict) -> dict:
    """A W&B table row with its list columns, which the logger wrote as JSON text, as lists again."""
    return row | {column: json.loads(row[column]) for column in LIST_COLUMNS if isinstance(row.get(column), str)}


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0]}" if text else type(err).__name__
