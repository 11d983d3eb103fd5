"""Hydra callbacks of experiments.run (registered in configs/hydra/default.yaml)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from experiments.common import rundir

REPO = Path(__file__).resolve().parents[2]  # where `python -m analysis.report` runs from


class CheckOutputDirectory(Callback):
    """Fail in one line (exit 2) when the run or sweep directory cannot be created or written, before Hydra tries
    and prints a traceback, and before anything is loaded."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        exit_unless_writable("hydra.run.dir", config.hydra.run.dir)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        exit_unless_writable("hydra.sweep.dir", config.hydra.sweep.dir)


def exit_unless_writable(key: str, directory: str) -> None:
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=directory).close()
    except OSError as err:
        holds_rows = (Path(directory) / rundir.ROWS).exists()  # a run to continue: its rows must not be left behind
        remedy = (f"make it writable, then continue with resume={directory}" if holds_rows
                  else f"choose another with {key}=<path>")
        print(f"config error: {key}={directory!r} cannot be created or written ({err.strerror or err}); {remedy}",
              file=sys.stderr)
        sys.exit(2)


class WriteSweepReport(Callback):
    """When a sweep ends, with any launcher: report.md, its plots and CSVs in the sweep directory. Then, if jobs
    failed (each recorded its error, see experiments.run), one line naming them, and the sweep exits with their
    highest exit status.

    Jobs that fail return normally after recording their error: a job that raised would stop Hydra's sweeper
    before this callback runs, so the report would never be written.
    """

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir).resolve()
        write_report(sweep_dir)
        failed = rundir.failures(sweep_dir)
        if failed:
            names = "; ".join(f"job {job_dir.name}: {mark['error']}" for job_dir, mark in failed.items())
            print(f"sweep: {len(failed)} job(s) failed ({names}); see {sweep_dir / 'report.md'}", file=sys.stderr)
            sys.exit(max(mark["exit_code"] for mark in failed.values()))


def write_report(sweep_dir: Path) -> None:
    """``python -m analysis.report <sweep_dir>`` in a child process: experiments never import analysis, and a run
    never pays for pandas. A report that fails leaves the sweep's results as they are, with one line saying so."""
    done = subprocess.run([sys.executable, "-m", "analysis.report", str(sweep_dir)], cwd=REPO)
    if done.returncode != 0:
        print(f"sweep report not written (exit {done.returncode}); rerun: python -m analysis.report {sweep_dir}",
              file=sys.stderr)
