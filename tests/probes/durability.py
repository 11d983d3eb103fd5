"""The probes of run-directory durability: files replaced by links and directories, kills at new points,
concurrency, permissions; config.yaml and rows.jsonl as other tools leave them, and resume."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

from conftest import REPO
from probes.core import (
    CLEAR, CONFUSING, CORRECT, DURABILITY, NOT_RUN, SILENTLY_ACCEPTED, SILENTLY_WRONG, cli, command,
    command_refusal, decoded, each_prompt_once, first_line, holds, Outcome, overrides, probe, refusal, report,
    report_counts, rows_on_disk, run_app, scratch, time_limit, validated,
)


# --- Durability: files replaced by links and directories, kills at new points, concurrency, permissions ------------

def partial_run(name: str, keep: int = 2) -> Path:
    """A run directory of 4 prompts that was killed after ``keep`` rows (no summary)."""
    run_dir = scratch(name)
    run_app(run_dir)
    lines = (run_dir / "rows.jsonl").read_text().splitlines()[:keep]
    (run_dir / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    (run_dir / "summary.json").unlink()
    return run_dir


def resumed(run_dir: Path) -> Outcome:
    """Continue ``run_dir``: correct when every prompt ends decoded once."""
    return holds(lambda: decoded(run_dir))


def resume_refusal(run_dir: Path, *named: str) -> Outcome:
    return refusal(lambda: run_app(run_dir), *named)


@probe(DURABILITY, CLEAR, before=SILENTLY_WRONG)
def rows_file_linked_to_another_runs() -> Outcome:
    """rows.jsonl a symbolic link to another unfinished run's rows.jsonl: resume kept that run's rows as its own,
    appended its new rows into the other directory, and both directories counted them."""
    other = partial_run("other")
    before = (other / "rows.jsonl").read_bytes()
    run_dir = partial_run("linked", keep=0)
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to(other / "rows.jsonl")
    outcome = resume_refusal(run_dir, "rows.jsonl", "symbolic link")
    if outcome.kind == SILENTLY_ACCEPTED and (other / "rows.jsonl").read_bytes() != before:
        return Outcome(SILENTLY_WRONG, "rows appended into the other run's directory, counted by both")
    return outcome


@probe(DURABILITY, CLEAR, before=CONFUSING)
def rows_file_a_dangling_link() -> Outcome:
    """rows.jsonl a symbolic link to nothing: "No such file or directory (ENOENT) ... fix that"."""
    run_dir = partial_run("dangling")
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to(run_dir / "nowhere" / "rows.jsonl")
    return resume_refusal(run_dir, "rows.jsonl", "symbolic link")


@probe(DURABILITY, CLEAR, before=CONFUSING)
def rows_file_linked_to_dev_null() -> Outcome:
    """rows.jsonl a symbolic link to /dev/null: "Invalid argument (EINVAL) ... fix that"."""
    run_dir = partial_run("dev_null")
    (run_dir / "rows.jsonl").unlink()
    (run_dir / "rows.jsonl").symlink_to("/dev/null")
    return resume_refusal(run_dir, "rows.jsonl", "symbolic link")


@probe(DURABILITY, CLEAR, before=CONFUSING)
def lock_file_linked_to_dev_null() -> Outcome:
    """run.lock a symbolic link to /dev/null: "Invalid argument (EINVAL) ... fix that"."""
    run_dir = partial_run("lock_link")
    (run_dir / "run.lock").symlink_to("/dev/null")
    return resume_refusal(run_dir, "run.lock", "symbolic link")


@probe(DURABILITY, CLEAR)
def lock_file_a_directory() -> Outcome:
    """run.lock a directory."""
    run_dir = partial_run("lock_dir")
    (run_dir / "run.lock").mkdir()
    return resume_refusal(run_dir, "run.lock", "directory")


@probe(DURABILITY, CORRECT)
def config_a_directory() -> Outcome:
    """config.yaml a directory: moved aside, the run goes on."""
    run_dir = partial_run("config_dir")
    (run_dir / "config.yaml").unlink()
    (run_dir / "config.yaml").mkdir()
    return resumed(run_dir)


@probe(DURABILITY, CORRECT)
def summary_a_directory() -> Outcome:
    """summary.json a directory: the report loads the run as partial; resume moves it aside and finishes."""
    run_dir = partial_run("summary_dir")
    (run_dir / "summary.json").mkdir()
    out = scratch("out")

    def check():
        problem = report_counts(*report(run_dir, out=out), out, runs=1, rows=2)
        return problem or decoded(run_dir)
    return holds(check)


@probe(DURABILITY, CORRECT)
def set_aside_file_linked_to_dev_full() -> Outcome:
    """rows.set-aside.jsonl a symbolic link to /dev/full, with a damaged line to set aside: moved aside."""
    run_dir = partial_run("dev_full")
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write("not a row\n")
    (run_dir / "rows.set-aside.jsonl").symlink_to("/dev/full")
    return resumed(run_dir)


@probe(DURABILITY, CORRECT)
def stale_staging_files() -> Outcome:
    """Staging files a killed atomic write left (.rows.jsonl.tmp, .config.yaml.tmp, .summary.json.tmp) hold
    garbage."""
    run_dir = partial_run("staging")
    for name in (".rows.jsonl.tmp", ".config.yaml.tmp", ".summary.json.tmp"):
        (run_dir / name).write_bytes(b"\x00garbage{")
    return resumed(run_dir)


KILLED_RUN = """
import os, signal, sys
from experiments import rundir, runner

def die():
    os.kill(os.getpid(), signal.SIGKILL)

{patch}
sys.argv = ["experiments/run.py", *{argv!r}]
from experiments.run import main
main()
"""


def killed_at(run_dir: Path, patch: str, *extra: str) -> Outcome | None:
    """Run into ``run_dir`` in a child process that ``patch`` SIGKILLs at some point; None once it died so."""
    code = KILLED_RUN.format(patch=patch, argv=[*overrides(), f"hydra.run.dir={run_dir}", *extra])
    done = command("-c", code)
    if done.returncode != -signal.SIGKILL:
        return Outcome(CONFUSING, f"the child was not killed (exit {done.returncode}): {first_line(done.stderr)}")
    return None


@probe(DURABILITY, CORRECT, slow=True)
def killed_between_setting_aside_and_rewriting_rows() -> Outcome:
    """SIGKILL in resume after the pieces reached rows.set-aside.jsonl, before rows.jsonl was rewritten: the
    duplicates are in both files; the next resume counts each prompt once."""
    run_dir = partial_run("set_aside_kill")
    rows = (run_dir / "rows.jsonl").read_text()
    (run_dir / "rows.jsonl").write_text(rows + rows + "torn{\n")
    patch = ("real = rundir.append_pieces\n"
             "def append_then_die(path, pieces):\n    real(path, pieces)\n    die()\n"
             "rundir.append_pieces = append_then_die")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_before_config_is_renamed() -> Outcome:
    """SIGKILL after config.yaml's new content was staged, before its rename."""
    run_dir = partial_run("config_kill")
    patch = ("real = os.replace\n"
             "def replace(source, target):\n"
             "    if str(target).endswith('config.yaml'):\n        die()\n    return real(source, target)\n"
             "os.replace = replace")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_after_the_last_row_before_the_summary() -> Outcome:
    """SIGKILL once every row is written, before summary.json."""
    run_dir = scratch("summary_kill")
    patch = ("real = rundir.write_json\n"
             "def write_json(path, data):\n"
             "    if path.name == 'summary.json':\n        die()\n    return real(path, data)\n"
             "rundir.write_json = write_json")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_while_signing_the_lock() -> Outcome:
    """SIGKILL after run.lock was emptied, before this process wrote itself into it."""
    run_dir = partial_run("lock_kill")
    patch = ("def sign(self):\n    os.ftruncate(self.fd, 0)\n    die()\n"
             "rundir.RunLock.sign = sign")
    return killed_at(run_dir, patch) or resumed(run_dir)


@probe(DURABILITY, CORRECT, slow=True)
def killed_in_the_warm_up() -> Outcome:
    """SIGKILL in the warm-up of a fresh run (config.yaml written, no row yet)."""
    run_dir = scratch("warmup_kill")
    patch = "runner.warm_up = lambda *args, **kwargs: die()"
    return killed_at(run_dir, patch, "warmup=1") or holds(lambda: decoded(run_dir, "warmup=1"))


SLOW_ROWS = """
import sys, time
from experiments import rundir
real = rundir.RowWriter.write
def write(self, row):
    real(self, row)
    time.sleep(1.5)
rundir.RowWriter.write = write
sys.argv = ["experiments/run.py", *{argv!r}]
from experiments.run import main
main()
"""


@probe(DURABILITY, CORRECT, slow=True)
def report_and_resume_while_a_run_writes() -> Outcome:
    """While a run writes its rows (1.5 s apart): a report of the directory, then a second writer resuming it. The
    report reads a partial run and writes nothing into it; the second writer is refused; the run ends whole."""
    run_dir = scratch("concurrent")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    code = SLOW_ROWS.format(argv=[*overrides(), f"hydra.run.dir={run_dir}"])
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=environment, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)

    def check():
        with time_limit(120):
            while not (run_dir / "rows.jsonl").exists() or not (run_dir / "rows.jsonl").read_text():
                if writer.poll() is not None:
                    return f"the writer ended early: {writer.stderr.read()[-300:]}"
        before = sorted(path.name for path in run_dir.iterdir())
        code, err = report(run_dir, out=scratch("out"))
        if code or "partial" not in err or sorted(path.name for path in run_dir.iterdir()) != before:
            return f"report during the run: exit {code}, {first_line(err)}"
        second = resume_refusal(run_dir, "being written by")
        writer.wait(timeout=120)
        return (None if second.kind == CLEAR else f"second writer: {second.kind}: {second.detail}") \
            or each_prompt_once(run_dir)
    try:
        return holds(check)
    finally:
        writer.kill()
        writer.wait()


def without_root_privileges() -> tuple[str, ...] | None:
    """A command prefix under which permissions apply (root drops the capabilities that bypass them); None where
    that cannot be done here."""
    if os.geteuid() != 0:
        return ()
    setpriv = shutil.which("setpriv")
    return (setpriv, "--bounding-set=-dac_override,-dac_read_search") if setpriv else None


@probe(DURABILITY, CLEAR, before=CONFUSING, slow=True)
def read_only_run_directory() -> Outcome:
    """Resume into a run directory whose permissions are r-x (a real refusal, not an injected one)."""
    prefix = without_root_privileges()
    if prefix is None:
        return Outcome(NOT_RUN, "root without setpriv: permissions cannot apply")
    run_dir = partial_run("read_only")
    run_dir.chmod(0o555)
    try:
        return command_refusal(cli(f"hydra.run.dir={run_dir}", prefix=prefix), str(run_dir), "resume=")
    finally:
        run_dir.chmod(0o755)


@probe(DURABILITY, CLEAR, before=CONFUSING, slow=True)
def read_only_rows_file() -> Outcome:
    """Resume with prompts left into a writable directory whose rows.jsonl is r--."""
    prefix = without_root_privileges()
    if prefix is None:
        return Outcome(NOT_RUN, "root without setpriv: permissions cannot apply")
    run_dir = partial_run("read_only_rows")
    (run_dir / "rows.jsonl").chmod(0o444)
    done = cli(f"hydra.run.dir={run_dir}", prefix=prefix)
    outcome = command_refusal(done, "rows.jsonl", "Permission denied", "resume=")
    kept = len(rows_on_disk(run_dir))
    return outcome if kept == 2 else Outcome(SILENTLY_WRONG, f"{kept} rows left of 2")


# --- Durability: config.yaml and rows.jsonl as other tools leave them, and resume ------------------------------------

def unfinished_run_in(root: Path, keep: int = 2) -> Path:
    """A run of 4 prompts killed after ``keep`` rows, alone under ``root`` (so that resume=true searches only it)."""
    run_dir = root / "first"
    run_dir.mkdir()
    run_app(run_dir)
    lines = (run_dir / "rows.jsonl").read_text().splitlines()[:keep]
    (run_dir / "rows.jsonl").write_text("".join(line + "\n" for line in lines))
    (run_dir / "summary.json").unlink()
    return run_dir


def resumed_from_elsewhere(root: Path, run_dir: Path, *extra: str) -> str | None:
    """resume=true from a new directory beside ``run_dir``: what is wrong (None: ``run_dir`` was continued and holds
    every prompt once, and the new directory holds no row)."""
    other = root / "second"
    other.mkdir()
    run_app(other, "resume=true", *extra)
    if (other / "rows.jsonl").exists() and (other / "rows.jsonl").read_text():
        return f"a new run decoded {len((other / 'rows.jsonl').read_text().splitlines())} prompts again"
    return each_prompt_once(run_dir)


def config_edited(name: str, edit: Callable[[str], str]) -> Outcome:
    root = scratch(name)
    run_dir = unfinished_run_in(root)
    (run_dir / "config.yaml").write_bytes(edit((run_dir / "config.yaml").read_text()).encode("utf-8"))
    return holds(lambda: resumed_from_elsewhere(root, run_dir))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_a_byte_order_mark() -> Outcome:
    """config.yaml saved with a UTF-8 byte order mark."""
    return config_edited("bom", lambda text: "\ufeff" + text)


@probe(DURABILITY, CORRECT, issue=35)
def config_with_windows_line_endings() -> Outcome:
    """config.yaml with CRLF line endings."""
    return config_edited("crlf", lambda text: text.replace("\n", "\r\n"))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_comments_added() -> Outcome:
    """config.yaml with a comment line and end-of-line comments added by hand."""
    return config_edited("comments", lambda text: "# rerun of Tuesday\n" + text.replace("seed: 0", "seed: 0  # why"))


@probe(DURABILITY, CORRECT, issue=35)
def config_with_its_sections_reordered() -> Outcome:
    """config.yaml rewritten by another tool with its top-level settings in another order."""
    import yaml

    return config_edited("reordered", lambda text: yaml.safe_dump(dict(reversed(list(yaml.safe_load(text).items())))))


@probe(DURABILITY, CORRECT, issue=35)
def config_without_its_last_new_line() -> Outcome:
    """config.yaml whole but for its final new line (an editor stripped it)."""
    return config_edited("no_newline", lambda text: text.rstrip("\n"))


@probe(DURABILITY, CORRECT, issue=35)
def config_holding_a_list() -> Outcome:
    """config.yaml replaced by a YAML list: the rows' setting columns decide."""
    return config_edited("list", lambda text: "- not\n- a\n- mapping\n")


@probe(DURABILITY, CORRECT, issue=35)
def rows_with_windows_line_endings() -> Outcome:
    """rows.jsonl with CRLF line endings, resumed in place."""
    run_dir = partial_run("rows_crlf")
    (run_dir / "rows.jsonl").write_bytes((run_dir / "rows.jsonl").read_bytes().replace(b"\n", b"\r\n"))
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def rows_with_a_byte_order_mark() -> Outcome:
    """rows.jsonl starting with a UTF-8 byte order mark: the mark is set aside, both rows kept."""
    run_dir = partial_run("rows_bom")
    (run_dir / "rows.jsonl").write_bytes(b"\xef\xbb\xbf" + (run_dir / "rows.jsonl").read_bytes())
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def two_unfinished_runs_of_one_setting() -> Outcome:
    """Two killed runs of one setting under the search root: resume=true continues the newer; the older is left."""
    root = scratch("two_runs")
    older = unfinished_run_in(root, keep=1)
    older = older.rename(root / "older")
    time.sleep(0.05)
    newer = unfinished_run_in(root)

    def check():
        before = (older / "rows.jsonl").read_text()
        return resumed_from_elsewhere(root, newer) or (None if (older / "rows.jsonl").read_text() == before
                                                       else "the older run changed")
    return holds(check)


@probe(DURABILITY, CORRECT, issue=35)
def resume_of_a_finished_run_by_path() -> Outcome:
    """resume=<a finished run's directory>: nothing left to decode, its rows unchanged."""
    root = scratch("finished_resume")
    run_dir = root / "first"
    run_dir.mkdir()
    run_app(run_dir)
    before = (run_dir / "rows.jsonl").read_text()

    def check():
        other = root / "second"
        other.mkdir()
        run_app(other, f"resume={run_dir}")
        return each_prompt_once(run_dir) or (None if (run_dir / "rows.jsonl").read_text() == before else "rewritten")
    return holds(check)


@probe(DURABILITY, CLEAR, issue=35)
def resume_path_of_the_rows_file() -> Outcome:
    """resume=<run directory>/rows.jsonl (the file, not its directory)."""
    run_dir = partial_run("resume_file")
    return refusal(lambda: validated(f"resume={run_dir / 'rows.jsonl'}"), "resume=", "run directory")


@probe(DURABILITY, CORRECT, issue=35)
def lock_file_holding_garbage() -> Outcome:
    """run.lock holding bytes that are no JSON (left by another tool)."""
    run_dir = partial_run("lock_garbage")
    (run_dir / "run.lock").write_bytes(b"\x00\x01not json")
    return resumed(run_dir)


@probe(DURABILITY, CORRECT, issue=35)
def resume_under_another_group_name() -> Outcome:
    """Resume in place with group=renamed (a key free to change on resume)."""
    run_dir = partial_run("group_rename")
    return holds(lambda: decoded(run_dir, "group=renamed"))
