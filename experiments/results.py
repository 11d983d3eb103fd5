"""Writing a run directory (layout and file names: ``specdec.results``): rows appended as produced, resume, and
the closing summary.
"""

from __future__ import annotations

import json
import math
import os
import shutil
from pathlib import Path

import yaml

from experiments.config_checks import ConfigError
from specdec.results import (
    CONFIG,
    FAILURE,
    INTERVAL_METRICS,
    MIN_PROMPTS_FOR_INTERVAL,
    ROWS,
    SET_ASIDE,
    SUMMARY,
    confidence_interval,
    finite_values,
    parse_rows,
    read_rows,
)

HYDRA_OWN_FILES = {".hydra", "run.log"}  # what Hydra writes into a run directory before the job starts
# Keys that may differ between a run and its resumption.
RESUME_FREE_KEYS = ("resume", "group")


def finite_or_none(value):
    """JSON has no NaN: undefined metrics (nothing drafted, never reached) are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, list):
        return [finite_or_none(v) for v in value]
    return value


class RowWriter:
    """Appends rows to rows.jsonl. Each row reaches the file as one write of its line and newline, then is flushed
    and fsynced before the next prompt starts: a killed run loses at most the row being written, and a torn line
    can only be the last one."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / ROWS
        self.file = open(self.path, "a+b")
        if self.file.tell() > 0:
            self.file.seek(-1, os.SEEK_END)
            if self.file.read(1) != b"\n":  # a last row that lost its newline: the next row must not join it
                self.file.write(b"\n")

    def write(self, row: dict) -> None:
        line = json.dumps({k: finite_or_none(v) for k, v in row.items()}) + "\n"
        self.file.write(line.encode("utf-8"))
        self.file.flush()
        os.fsync(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def recover_rows(run_dir: Path) -> tuple[list[dict], int]:
    """Before rows are appended to an existing rows.jsonl: rewrite it as one row per line, keeping every row that
    parses (also two rows merged on one line), and move every piece that does not parse to rows.set-aside.jsonl.
    Returns the rows and the number of pieces set aside. The file is replaced atomically, so a kill leaves either
    the old file or the new one."""
    path = run_dir / ROWS
    if not path.exists():
        return [], 0
    text = path.read_text(encoding="utf-8")
    rows, unparsed = parse_rows(text)
    clean = "".join(json.dumps(row) + "\n" for row in rows)
    if unparsed:
        with open(run_dir / SET_ASIDE, "a", encoding="utf-8") as side:
            side.write("".join(piece + "\n" for _, piece in unparsed))
    if clean != text:
        staging = path.with_suffix(".jsonl.tmp")
        staging.write_text(clean, encoding="utf-8")
        os.replace(staging, path)
    return rows, len(unparsed)


def remove_if_only_hydra_files(run_dir: Path) -> None:
    """Delete a run directory that holds nothing but what Hydra wrote before the job started."""
    if run_dir.is_dir() and {entry.name for entry in run_dir.iterdir()} <= HYDRA_OWN_FILES:
        shutil.rmtree(run_dir, ignore_errors=True)


def comparable(config: dict) -> dict:
    """A config with the keys that may change on resume removed (also inside the logger)."""
    config = {k: v for k, v in config.items() if k not in RESUME_FREE_KEYS}
    if isinstance(config.get("logger"), dict):
        config["logger"] = {k: v for k, v in config["logger"].items() if k != "group"}
    return config


def read_config(run_dir: Path) -> dict | None:
    path = run_dir / CONFIG
    return yaml.safe_load(path.read_text(encoding="utf-8")) if path.exists() else None


def config_difference(old: dict, new: dict, prefix: str = "") -> str | None:
    """The first differing dotted key as 'key: old -> new', or None if equal."""
    for key in sorted(set(old) | set(new), key=str):
        a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
        if isinstance(a, dict) and isinstance(b, dict):
            found = config_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}: {a!r} -> {b!r}"
    return None


def check_same_config(run_dir: Path, config: dict) -> None:
    """Rows of one run directory must come from one config."""
    old = read_config(run_dir)
    if old is None:
        return
    difference = config_difference(comparable(old), comparable(config))
    if difference:
        raise ConfigError(
            f"run directory {run_dir} holds a run with another config ({difference}); "
            f"use a new hydra.run.dir or resume with the same settings"
        )


def find_unfinished(search_root: Path, config: dict, exclude: Path) -> Path | None:
    """The newest run directory under ``search_root`` (depth <= 2) with this config and no summary.json."""
    if not search_root.is_dir():
        return None
    candidates = []
    for config_path in [*search_root.glob(f"*/{CONFIG}"), *search_root.glob(f"*/*/{CONFIG}")]:
        run_dir = config_path.parent
        if run_dir.resolve() == exclude.resolve() or (run_dir / SUMMARY).exists():
            continue
        old = read_config(run_dir)
        if old is not None and config_difference(comparable(old), comparable(config)) is None:
            candidates.append(run_dir)
    return max(candidates, key=lambda d: (d / CONFIG).stat().st_mtime, default=None)


def results_dir(resume: bool | str, run_dir: Path, search_root: Path, config: dict) -> tuple[Path, str | None]:
    """Where this run's rows go, and a one-line note when it continues an earlier run.

    The run's own directory, unless ``resume`` is a directory path, or ``resume=true`` finds an unfinished run with
    the same config under ``search_root``. A directory that already has rows is always continued, never overwritten.
    """
    if isinstance(resume, str):
        target = Path(resume).expanduser()
        if not (target / CONFIG).is_file():
            raise ConfigError(f"resume={resume!r}: not a run directory (no {CONFIG} in it)")
        check_same_config(target, config)
        return target, f"resuming {target}"
    check_same_config(run_dir, config)
    if resume and not read_rows(run_dir):
        found = find_unfinished(search_root, config, exclude=run_dir)
        if found is not None:
            return found, f"resuming {found}"
        return run_dir, f"resume=true: no unfinished run with this config under {search_root}; starting a new run"
    return run_dir, None


def record_failure(run_dir: Path, exit_code: int, error: str) -> None:
    """Mark a sweep job that ended with an error, so that the sweep's report names it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json(run_dir / FAILURE, {"exit_code": exit_code, "error": error})


def clear_failure(run_dir: Path) -> None:
    """A job run again starts without the mark of its last failure."""
    (run_dir / FAILURE).unlink(missing_ok=True)


def failures(sweep_dir: Path) -> dict[Path, dict]:
    """The failure marks of a sweep's jobs, by job directory (at any depth, as hydra.sweep.subdir may nest)."""
    marks = sorted(sweep_dir.rglob(FAILURE), key=lambda path: job_order(path.parent))
    return {path.parent: json.loads(path.read_text(encoding="utf-8")) for path in marks}


def job_order(job_dir: Path) -> tuple:
    """Sweep jobs in their numbers' order (2 before 10), other directories after them by name."""
    return (0, int(job_dir.name), "") if job_dir.name.isdigit() else (1, 0, job_dir.name)


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(finite_or_none_deep(data), indent=2) + "\n", encoding="utf-8")


def finite_or_none_deep(data):
    if isinstance(data, dict):
        return {k: finite_or_none_deep(v) for k, v in data.items()}
    if isinstance(data, list):
        return [finite_or_none_deep(v) for v in data]
    return finite_or_none(data)


def mean_ci(values: list, metric: str | None = None) -> tuple[float, float, float, int]:
    """(mean, low, high, n) over the finite values: the schema's 95% Student t interval (the one analysis/
    reports), clipped to the metric's range, NaN bounds with too few prompts."""
    x = finite_values(values)
    return (*confidence_interval(x, metric=metric), len(x))


def summarize(rows: list[dict]) -> dict:
    """Per metric: mean and 95% t interval over prompts; pooled totals as a cross-check."""
    metrics = {}
    for name in INTERVAL_METRICS:
        mean, low, high, n = mean_ci([row.get(name) for row in rows], metric=name)
        metrics[name] = {"mean": mean, "ci_low": low, "ci_high": high, "n": n}
    total = lambda key: sum(row.get(key) or 0 for row in rows)  # noqa: E731
    drafted = total("drafted")
    pooled = {
        "acceptance_rate": total("accepted") / drafted if drafted else math.nan,
        "mean_accepted_length": total("emitted") / total("target_calls") if total("target_calls") else math.nan,
        "emitted": total("emitted"),
        "baseline_emitted": total("baseline_emitted"),
    }
    return {"prompts": len(rows), "metrics": metrics, "pooled": pooled}


def format_table(summary: dict, title: str) -> str:
    """The run summary as a short fixed-width table."""
    lines = [title, f"{'metric':<22} {'mean':>9}   {'95% CI':<21} {'n':>4}"]
    for name, m in summary["metrics"].items():
        ci = (f"[{m['ci_low']:.3f}, {m['ci_high']:.3f}]" if m["n"] >= MIN_PROMPTS_FOR_INTERVAL
              else f"n/a (< {MIN_PROMPTS_FOR_INTERVAL} prompts)")
        mean = f"{m['mean']:.3f}" if m["n"] else "n/a"
        lines.append(f"{name:<22} {mean:>9}   {ci:<21} {m['n']:>4}")
    return "\n".join(lines)
