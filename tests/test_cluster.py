"""Sweeps beyond one process: Hydra's submitit launcher (the SLURM preset up to sbatch, the local preset end to
end), requeue after preemption and rerun after a kill, the report at the end of every sweep, failed jobs named in
it, and rows that say when jobs shared a machine."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml
from conftest import REPO, tiny_overrides

from experiments.common import runner
from experiments import run as run_app
from experiments.common.concurrency import LiveJobs, live_jobs_dir

# The shipped embedded pair decodes slowly enough (about half a second a prompt here) that a signal sent after the
# first row lands with most prompts left; the tiny test pair would finish first.
EMBEDDED = ["num_prompts=12", "max_new_tokens=48", "warmup=0", "device=cpu", "threads=1"]


def main(argv: list[str], monkeypatch) -> None:
    """The Hydra app in-process, as `python -m experiments.run ARGV` runs it."""
    monkeypatch.setattr(sys, "argv", [str(REPO / "experiments" / "run.py"), *argv])
    run_app.main()


def rows_of(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def sweep(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m experiments.run -m ARGV` from the repository root, as a user types it."""
    return subprocess.run([sys.executable, "-m", "experiments.run", "-m", *argv], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=env)


def job_logs(sweep_dir: Path) -> str:
    """Everything submitit logged for the sweep's jobs (stdout and stderr of every attempt)."""
    return "".join(path.read_text(errors="replace") for path in sorted((sweep_dir / ".submitit").rglob("*_log.*")))


# The SLURM preset ------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_slurm_preset_composes_with_partition_account_and_time_from_overrides():
    done = subprocess.run([sys.executable, "-m", "experiments.run", "hydra/launcher=slurm",
                           "hydra.launcher.partition=gpu", "hydra.launcher.account=proj",
                           "hydra.launcher.timeout_min=90", "--cfg", "hydra", "-p", "hydra.launcher"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    launcher = yaml.safe_load(done.stdout)
    assert launcher["_target_"] == "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
    assert (launcher["partition"], launcher["account"], launcher["timeout_min"]) == ("gpu", "proj", 90)
    assert launcher["gpus_per_node"] == 1 and launcher["tasks_per_node"] == 1 and launcher["mem_gb"] == 32
    assert launcher["max_num_timeout"] == 3 and launcher["submitit_folder"] == "${hydra.sweep.dir}/.submitit/%j"


@pytest.mark.slow
def test_slurm_sweep_submits_one_array_with_one_gpu_per_job(tmp_path):
    """The real launcher and submitit up to the sbatch call: a stand-in sbatch keeps the script it is given and
    refuses it, so nothing runs; the script is what SLURM would have received."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = tmp_path / "submitted.sh"
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\ncp "$1" {script}\necho "sbatch: error: no cluster here" >&2\nexit 1\n')
    (bin_dir / "srun").write_text("#!/bin/sh\nexit 1\n")  # submitit only checks that srun exists
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    sweep_dir = tmp_path / "sweep"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = sweep("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.account=proj",
                 "hydra.launcher.timeout_min=90", "draft_length.k=2,4", f"hydra.sweep.dir={sweep_dir}", env=env)
    assert done.returncode != 0 and "sbatch: error: no cluster here" in done.stderr
    directives = {line.split("=")[0]: line.split("=", 1)[1] for line in script.read_text().splitlines()
                  if line.startswith("#SBATCH --") and "=" in line}
    assert directives["#SBATCH --array"] == "0-1%2"  # both jobs in one array, both may run at once
    assert directives["#SBATCH --gpus-per-node"] == "1" and directives["#SBATCH --ntasks-per-node"] == "1"
    assert directives["#SBATCH --partition"] == "gpu" and directives["#SBATCH --account"] == "proj"
    assert directives["#SBATCH --time"] == "90" and directives["#SBATCH --mem"] == "32GB"
    assert directives["#SBATCH --signal"] == "USR2@120"  # submitit's cue to requeue before the time limit
    assert f"-m submitit.core._submit {sweep_dir}/.submitit/%j" in script.read_text()
    assert len(list((sweep_dir / ".submitit").glob("*.pkl"))) == 2  # one pickled job each


# The local preset: the same launcher path, each job a subprocess ----------------------------------------------------

@pytest.mark.slow
def test_two_job_sweep_through_the_local_submitit_launcher(tiny, tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = sweep("hydra/launcher=local", "draft_length.k=2,4", *tiny_overrides(tiny, num_prompts=3, warmup=0),
                 f"hydra.sweep.dir={sweep_dir}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(list((sweep_dir / ".submitit").glob("*/*_result.pkl"))) == 2  # each ran as a submitit job
    rows = {job: rows_of(sweep_dir / job) for job in ("0", "1")}
    assert {job: [row["k"] for row in job_rows] for job, job_rows in rows.items()} == {"0": [2] * 3, "1": [4] * 3}
    assert all((sweep_dir / job / "summary.json").exists() for job in rows)
    every_row = rows["0"] + rows["1"]
    assert {row["host"] for row in every_row} == {socket.gethostname()}
    assert {row["concurrent_jobs"] for row in every_row} <= {1, 2}  # both jobs start at once; they may overlap
    report = (sweep_dir / "report.md").read_text()
    assert "2 runs, 6 (run, prompt) rows" in report and "| k |" in report
    assert ("distorted timings" in report) == any(row["concurrent_jobs"] == 2 for row in every_row)


def wait_for_rows(rows_file: Path, process: subprocess.Popen, timeout: float = 300) -> int:
    """Wait until the job has written at least one row; return how many it had."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, "the sweep ended before its job wrote a row"
        if rows_file.exists() and rows_file.read_text().count("\n") >= 1:
            return rows_file.read_text().count("\n")
        time.sleep(0.05)
    raise AssertionError(f"no row in {rows_file} after {timeout} s")


def job_pid(sweep_dir: Path) -> int:
    """The process of the sweep's one running job, from the entry it holds among the live jobs."""
    [entry] = [p for p in live_jobs_dir(sweep_dir).iterdir() if not p.name.startswith(".")]
    return int(entry.name.split("-")[0])


def assert_each_prompt_once(run_dir: Path, total: int) -> None:
    rows = rows_of(run_dir)
    assert Counter(row["prompt_id"] for row in rows) == Counter({f"heldout-{i:03d}": 1 for i in range(total)})
    assert len({row["run_id"] for row in rows}) == 1 and (run_dir / "summary.json").exists()


@pytest.mark.slow
def test_preempted_job_is_requeued_into_its_own_run_directory_and_skips_finished_prompts(tmp_path):
    """SLURM preempts a job by sending it SIGUSR2; submitit then calls the launcher's checkpoint, which resubmits
    the same job, and exits. The job comes back in the same <sweep>/<num>/ (the sweep directory's timestamp is the
    one resolved at launch, not at requeue) and decodes only the prompts it had not finished."""
    log = (tmp_path / "sweep.log").open("w")
    process = subprocess.Popen([sys.executable, "-m", "experiments.run", "-m", "hydra/launcher=local", *EMBEDDED,
                                f"hydra.sweep.dir={tmp_path}/sweep_${{now:%H-%M-%S-%f}}"],
                               cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not list(tmp_path.glob("sweep_*/0/rows.jsonl")) and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "sweep.log").read_text()[-3000:]
            time.sleep(0.05)
        [sweep_dir] = list(tmp_path.glob("sweep_*"))
        rows_at_signal = wait_for_rows(sweep_dir / "0" / "rows.jsonl", process)
        os.kill(job_pid(sweep_dir), signal.SIGUSR2)
        assert process.wait(timeout=300) == 0, (tmp_path / "sweep.log").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
    assert rows_at_signal < 12 and list(tmp_path.glob("sweep_*")) == [sweep_dir]
    logs = job_logs(sweep_dir)
    assert "this job is preempted" in logs and "Requeued job" in logs
    [resumed] = [line for line in logs.replace("\r", "\n").splitlines() if line.startswith("continuing")]
    kept = int(resumed.split(": ")[1].split(" row(s)")[0])
    assert resumed.startswith(f"continuing {sweep_dir}/0: ") and 1 <= kept < 12
    assert_each_prompt_once(sweep_dir / "0", 12)
    assert (sweep_dir / "report.md").exists()


@pytest.mark.slow
def test_killed_job_run_again_continues_and_decodes_each_prompt_once(tmp_path):
    """kill -9 leaves no chance to checkpoint: submitit reports the job lost and the sweep fails without a report.
    The same command again continues the job's run directory."""
    sweep_dir = tmp_path / "sweep"
    command = [sys.executable, "-m", "experiments.run", "-m", "hydra/launcher=local", *EMBEDDED,
               f"hydra.sweep.dir={sweep_dir}"]
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        rows_at_kill = wait_for_rows(sweep_dir / "0" / "rows.jsonl", process)
        os.kill(job_pid(sweep_dir), signal.SIGKILL)
        _, stderr = process.communicate(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode != 0 and "has not produced any output" in stderr
    assert rows_at_kill < 12 and not (sweep_dir / "0" / "summary.json").exists()
    assert not (sweep_dir / "report.md").exists()

    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"continuing {sweep_dir}/0: " in job_logs(sweep_dir)
    assert_each_prompt_once(sweep_dir / "0", 12)
    assert (sweep_dir / "report.md").exists()


# Failed jobs are named, with any launcher ----------------------------------------------------------------------------

@pytest.mark.slow
def test_failed_job_is_named_in_the_report_and_the_sweep_exits_with_its_status(tiny, tmp_path, monkeypatch, capfd):
    """A job that fails records its error and returns, so the other jobs run and the report is written; a run of
    the same job that succeeds clears the mark. (The failure is one the sweep's check cannot see before the job
    reads its prompts: two prompts sharing an id. A setting wrong before any prompt is read stops the whole sweep
    before any job: tests/test_sweep_checks.py.)"""
    sweep_dir = tmp_path / "sweep"
    repeated = tmp_path / "repeated.jsonl"
    repeated.write_text('{"id": "a", "text": "the first time he said"}\n{"id": "a", "text": "she was not there"}\n')
    overrides = tiny_overrides(tiny, num_prompts=2, max_new_tokens=4, warmup=0)
    with pytest.raises(SystemExit) as exit_info:
        main(["-m", *overrides, f"data.source={repeated},{tiny['prompts']}", f"hydra.sweep.dir={sweep_dir}"],
             monkeypatch)
    assert exit_info.value.code == 2
    failure = json.loads((sweep_dir / "0" / "failure.json").read_text())
    error = f"config error: data.source='{repeated}': prompt ids must be unique"
    assert failure["exit_code"] == 2 and failure["error"].startswith(error)
    assert len(rows_of(sweep_dir / "1")) == 2
    report = (sweep_dir / "report.md").read_text()
    assert f"- **Failed job** `{(sweep_dir / '0').resolve()}`: {error}" in report
    assert "1 runs, 2 (run, prompt) rows" in report
    err = capfd.readouterr().err
    assert f"sweep: 1 job(s) failed (job 0: {error}" in err and "report.md" in err

    repeated.write_text('{"id": "a", "text": "the first time he said"}\n{"id": "b", "text": "she was not there"}\n')
    main(["-m", *overrides, f"data.source={repeated}", f"hydra.sweep.dir={sweep_dir}"], monkeypatch)  # fixed
    assert not (sweep_dir / "0" / "failure.json").exists() and len(rows_of(sweep_dir / "0")) == 2
    assert "Failed job" not in (sweep_dir / "report.md").read_text()


@pytest.mark.slow
def test_a_job_that_raises_is_recorded_with_exit_1_and_its_traceback(tiny, tmp_path, monkeypatch, capfd):
    """Not a config error (those exit 2 before any model loads): an error inside the decode loop."""
    import specdec

    def fail(*args, **kwargs):
        raise RuntimeError("boom")
    monkeypatch.setattr(specdec.Decoder, "generate", fail)
    sweep_dir = tmp_path / "sweep"
    with pytest.raises(SystemExit) as exit_info:
        main(["-m", "draft_length.k=2,3", *tiny_overrides(tiny, num_prompts=1, warmup=0),
              f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    assert exit_info.value.code == 1
    for job in ("0", "1"):
        failure = json.loads((sweep_dir / job / "failure.json").read_text())
        assert failure["exit_code"] == 1 and failure["error"].startswith("RuntimeError: boom")
    report = (sweep_dir / "report.md").read_text()
    assert report.count("**Failed job**") == 2 and "No job wrote rows" in report
    assert "Traceback" in capfd.readouterr().err


@pytest.mark.slow
def test_default_launcher_is_sequential_and_reports_every_sweep(tiny, tmp_path, monkeypatch):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("run", return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    sweep_dir = tmp_path / "sweep"
    main(["-m", "draft_length.k=2,3", *tiny_overrides(tiny, num_prompts=2, max_new_tokens=4, warmup=0),
          f"hydra.sweep.dir={sweep_dir}"], monkeypatch)
    rows = rows_of(sweep_dir / "0") + rows_of(sweep_dir / "1")
    assert [row["concurrent_jobs"] for row in rows] == [1] * 4  # one job at a time
    report = (sweep_dir / "report.md").read_text()
    assert "2 runs, 4 (run, prompt) rows" in report and "distorted timings" not in report


# Counting the jobs that share a machine ------------------------------------------------------------------------------

def test_live_jobs_count_each_other_and_forget_the_ones_that_ended(tmp_path):
    directory = tmp_path / ".running" / "host"
    with LiveJobs(directory) as first:
        assert first.count() == 1
        with LiveJobs(directory) as second:
            assert first.count() == second.count() == 2
        assert first.count() == 1 and len(list(directory.iterdir())) == 1
    assert not list(directory.iterdir())
    assert LiveJobs(None).count() == 1  # a single run


def test_a_job_killed_outright_is_not_counted_and_its_entry_goes(tmp_path):
    """The kernel drops a dead process's lock, however it died; the stale file it left is removed."""
    directory = tmp_path / ".running" / "host"
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from experiments.common.concurrency import LiveJobs\n"
                               f"with LiveJobs(__import__('pathlib').Path({str(directory)!r})):\n"
                               "    print('holding', flush=True); time.sleep(600)"],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "holding\n"
        with LiveJobs(directory) as mine:
            assert mine.count() == 2
            holder.kill()
            holder.wait(timeout=60)
            assert mine.count() == 1
            assert [entry.name for entry in directory.iterdir()] == [mine.path.name]
    finally:
        holder.kill()
        holder.wait(timeout=60)


def test_rows_decoded_beside_another_job_say_so_and_the_report_warns(tiny, tmp_path):
    """A job of the same sweep holds its entry on this host for the whole run: every row counts 2."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from analysis.report import write_report

    sweep_dir = tmp_path / "sweep"
    with initialize_config_dir(config_dir=str(REPO / "configs"), version_base="1.3"):
        cfg = compose("run", overrides=tiny_overrides(tiny, num_prompts=3, max_new_tokens=4, warmup=0),
                      return_hydra_config=True)
    job = runner.Job(sweep_dir / "0", "sweep", dict(cfg.hydra.runtime.choices), tmp_path, in_sweep=True,
                     live_jobs_dir=live_jobs_dir(sweep_dir))
    with open_dict(cfg):
        del cfg["hydra"]
    with LiveJobs(live_jobs_dir(sweep_dir)):
        runner.run(cfg, job)
    rows = rows_of(sweep_dir / "0")
    assert [row["concurrent_jobs"] for row in rows] == [2, 2, 2]
    assert {row["host"] for row in rows} == {socket.gethostname()}
    report = write_report([str(sweep_dir)]).read_text()
    assert "**Warning: distorted timings.** 3 of 3 rows (1 of 1 runs)" in report and "up to 2 at once" in report
    assert "| partial | concurrent jobs |" in report  # the runs table says which runs shared the machine
