"""Run directories that survive anything (issue 28): one writer at a time, rows keyed by the prompt's content,
every damaged file set aside in one line, and writes the environment refuses ending the run in one line with the
rows already written intact. Each test drives the real runner on the tiny pair; the environment's refusals are
injected where run directories are written (``experiments.common.rundir.open_fd`` / ``write_all``), or made real with a
file-size limit."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from conftest import REPO, tiny_overrides
from test_experiments import Killed, compose_run, kill_after, main

from experiments.common import rundir, runner
from experiments.common.config_checks import ConfigError
from experiments.common.rundir import RunDirectoryError, RunLock
from specdec.prompts import load_prompts

OVERRIDES = dict(num_prompts=4, max_new_tokens=4, warmup=0)
REAL_WRITE_ALL = rundir.write_all


def rows_of(run_dir: Path) -> list[dict]:
    """Strictly: every line of rows.jsonl must be one JSON row."""
    return [json.loads(line) for line in (run_dir / "rows.jsonl").read_text().splitlines()]


def killed_run(tiny, run_dir: Path, after: int = 2, **extra) -> list[str]:
    """A run of 4 prompts killed after ``after`` rows; returns its overrides, to resume it with."""
    overrides = tiny_overrides(tiny, **{**OVERRIDES, **extra})
    with pytest.raises(Killed):
        runner.run(*compose_run(overrides, run_dir), after_row=kill_after(after))
    return overrides


def assert_each_prompt_once(run_dir: Path, prompt_ids: list[str]) -> dict:
    """Every prompt decoded exactly once, by one run; the summary counts them; returns the summary."""
    rows = rows_of(run_dir)
    assert Counter(row["prompt_id"] for row in rows) == Counter(prompt_ids)
    assert len({row["run_id"] for row in rows}) == 1
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["prompts"] == len(prompt_ids)
    # Every prompt in the pooled speedup; the per-prompt mean leaves out those too short to time, which are named.
    assert summary["pooled"]["speedup"]["prompts"] == len(prompt_ids)
    assert summary["metrics"]["speedup"]["n"] + summary["short_prompts"]["count"] == len(prompt_ids)
    return summary


def resume_line(err: str) -> str:
    [line] = [line for line in err.splitlines() if "row(s) kept" in line]
    return line


FOUR = ["p0", "p1", "p2", "p3"]

# One writer ----------------------------------------------------------------------------------------------------------

HOLD = ("import sys, time\nfrom pathlib import Path\nfrom experiments.common.rundir import RunLock\n"
        "with RunLock(Path(sys.argv[1])):\n    print('holding', flush=True)\n    time.sleep(600)\n")


@pytest.fixture
def holder():
    """Start a process that holds a run directory's lock until it is killed (a run in progress)."""
    started = []

    def start(run_dir: Path) -> subprocess.Popen:
        process = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir)], cwd=REPO, stdout=subprocess.PIPE,
                                   text=True)
        started.append(process)
        assert process.stdout.readline() == "holding\n"
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=60)


def test_a_second_writer_is_refused_in_one_line_naming_the_holder(tiny, tmp_path, monkeypatch, capsys, loads,
                                                                  holder):
    """Issue 28 item 2: two runs started together in one directory decoded every prompt twice."""
    run_dir = tmp_path / "run"
    process = holder(run_dir)
    with pytest.raises(SystemExit) as exit_info:
        main([*tiny_overrides(tiny, **OVERRIDES), f"hydra.run.dir={run_dir}"], monkeypatch)
    assert exit_info.value.code == 2 and loads["pair"] == 0 and not (run_dir / "rows.jsonl").exists()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert errors == [f"config error: run directory {run_dir} is being written by pid {process.pid} on host "
                      f"{socket.gethostname()} since {errors[0].split(' since ')[1].split(' ')[0]} (run.lock); one "
                      "run directory takes one writer: wait for that run to end, or give this one another "
                      "hydra.run.dir"]


def test_two_resume_true_runs_do_not_both_continue_one_directory(tiny, tmp_path, loads):
    first = tmp_path / "outputs" / "first"
    overrides = killed_run(tiny, first)
    with RunLock(first):  # the first resume=true holds it
        with pytest.raises(RunDirectoryError, match=f"run directory {first} is being written by pid {os.getpid()}"):
            runner.run(*compose_run([*overrides, "resume=true"], tmp_path / "outputs" / "second"))
    assert len(rows_of(first)) == 2 and loads["pair"] == 1  # the killed run's load only


def test_a_lock_left_by_a_killed_run_is_taken_over(tiny, tmp_path, holder, capsys):
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    process = holder(run_dir)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=60)
    assert json.loads((run_dir / "run.lock").read_text())["pid"] == process.pid  # left behind
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, FOUR)
    assert f"took over the run.lock left by pid {process.pid} on host {socket.gethostname()}" in capsys.readouterr().err
    assert not (run_dir / "run.lock").exists()  # removed when the run ended


def test_in_process_the_lock_is_exclusive_and_released(tmp_path):
    with RunLock(tmp_path / "run") as lock:
        assert json.loads((tmp_path / "run" / "run.lock").read_text())["pid"] == os.getpid()
        with pytest.raises(RunDirectoryError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path / "run").__enter__()
        assert lock.taken_over is None
    with RunLock(tmp_path / "run"):
        pass
    assert not (tmp_path / "run" / "run.lock").exists()


@pytest.mark.parametrize("holder_of_file, refused", [("dead pid here", False), ("live pid here", True),
                                                     ("pid elsewhere", True), ("garbage", False)])
def test_without_file_locks_the_pid_and_host_decide(tmp_path, monkeypatch, holder_of_file, refused):
    """A file system that refuses flock (ENOLCK): a lock file naming a live process, or one on another host, is
    respected; one naming a dead process on this host, or nothing readable, is taken over."""
    def no_locks(fd, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    content = {"dead pid here": {"pid": int(dead.stdout), "host": socket.gethostname()},
               "live pid here": {"pid": os.getppid(), "host": socket.gethostname()},
               "pid elsewhere": {"pid": 1, "host": "another-node"}}.get(holder_of_file)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.lock").write_text(json.dumps(content) if content else "\x00\x00garbage")
    if refused:
        with pytest.raises(RunDirectoryError, match=rf"being written by pid .* if it has ended, remove "
                                                     rf"{re.escape(str(run_dir))}"):
            RunLock(run_dir).__enter__()
    else:
        with RunLock(run_dir):
            assert json.loads((run_dir / "run.lock").read_text())["pid"] == os.getpid()


# Rows keyed by the prompt's content -----------------------------------------------------------------------------

def test_editing_a_txt_prompt_file_between_resumes_never_mixes_prompts(tiny, tmp_path, capsys):
    """Issue 28 item 4: ids were line positions, so a line inserted at the top meant one prompt was never decoded,
    another twice. Now a row belongs to its text: the inserted prompt and the edited one are decoded, the row of
    the old text is set aside, every other row is kept."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("the first time he said\nshe was not there\nthey will have one more\nwhat is it that you\n")
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir, **{"data.source": str(prompts), "num_prompts": None})
    prompts.write_text("in the new time we\nthe first time he said\nshe was not here\nthey will have one more\n"
                       "what is it that you\n")
    capsys.readouterr()
    runner.run(*compose_run(overrides, run_dir))
    expected = load_prompts(str(prompts))
    rows = rows_of(run_dir)
    assert sorted(row["prompt_hash"] for row in rows) == sorted(prompt.hash for prompt in expected)
    assert all(row["prompt_id"] == row["prompt_hash"] for row in rows)
    assert_each_prompt_once(run_dir, [prompt.id for prompt in expected])
    line = resume_line(capsys.readouterr().err)
    assert ": 1 row(s) kept, 1 set aside in rows.set-aside.jsonl (1 row(s) of prompts no longer in the prompt set)" \
           ", 4 prompt(s) left" in line
    [stale] = [json.loads(text) for text in (run_dir / "rows.set-aside.jsonl").read_text().splitlines()]
    assert stale["prompt_hash"] not in {prompt.hash for prompt in expected}


def test_duplicate_rows_are_set_aside_on_resume_and_counted_once(tiny, tmp_path, capsys):
    """Issue 28 item 3: a duplicated row was kept and counted (7 prompts for 6). Also a row of another run (what
    two writers left before the lock existed)."""
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    first, second = rows_of(run_dir)
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write(json.dumps(first) + "\n" + json.dumps({**second, "run_id": "another-run"}) + "\n")
    capsys.readouterr()
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, FOUR)
    assert "2 row(s) kept, 2 set aside in rows.set-aside.jsonl (1 row(s) of another run, 1 duplicate row(s))" in \
        resume_line(capsys.readouterr().err)
    assert len((run_dir / "rows.set-aside.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("legacy", [False, True], ids=["with hash", "without hash (older rows)"])
def test_a_hand_edited_numeric_prompt_id_still_matches(tiny, tmp_path, legacy):
    """Issue 28 item 7: prompt ids 0..3 in the file; a hand edit left "prompt_id": 0 (a number) in the rows, and
    that prompt was decoded again."""
    prompts = tmp_path / "numbered.jsonl"
    prompts.write_text("".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in
                               enumerate(["the first time", "she was not", "they will have", "what is it"])))
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir, **{"data.source": str(prompts)})
    edited = [{**row, "prompt_id": int(row["prompt_id"])} for row in rows_of(run_dir)]
    if legacy:
        edited = [{key: value for key, value in row.items() if key != "prompt_hash"} for row in edited]
    (run_dir / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in edited))
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, ["0", "1", "2", "3"])


# Damage, set aside in one line ------------------------------------------------------------------------------------

def non_utf8_line(run_dir: Path) -> None:
    with open(run_dir / "rows.jsonl", "ab") as rows_file:
        rows_file.write(b"\xff\xfe\x00 binary \x89PNG\n")


def empty_object_line(run_dir: Path) -> None:
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write("{}\n")


def first_row_without_run_id(run_dir: Path) -> None:
    first, second = rows_of(run_dir)
    del first["run_id"]
    (run_dir / "rows.jsonl").write_text(json.dumps(first) + "\n" + json.dumps(second) + "\n")


def set_aside_is_a_directory(run_dir: Path) -> None:
    (run_dir / "rows.set-aside.jsonl").mkdir()
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write('{"run_id": "torn\n')


def config(content: bytes):
    def damage(run_dir: Path) -> None:
        (run_dir / "config.yaml").write_bytes(content)
    return damage


def top_level_lines(run_dir: Path) -> tuple[list[str], int]:
    """config.yaml's lines, and the index of a top-level key half-way through them."""
    lines = (run_dir / "config.yaml").read_text().splitlines(keepends=True)
    keys = [index for index, line in enumerate(lines) if index and not line.startswith(" ")]
    return lines, keys[len(keys) // 2]


def config_cut_at_a_line(run_dir: Path) -> None:
    """Valid YAML holding the first half of the settings, each with its value."""
    lines, cut = top_level_lines(run_dir)
    (run_dir / "config.yaml").write_text("".join(lines[:cut]))


def config_cut_mid_line(run_dir: Path) -> None:
    """Cut two characters into a key: not YAML any more."""
    lines, cut = top_level_lines(run_dir)
    (run_dir / "config.yaml").write_text("".join(lines[:cut]) + lines[cut][:2])


def summary_is_corrupt(run_dir: Path) -> None:
    (run_dir / "summary.json").write_bytes(b'{"status": "compl')


DAMAGE = [
    (non_utf8_line, 2, "1 set aside in rows.set-aside.jsonl (1 unreadable line piece(s))"),
    (empty_object_line, 2, "1 set aside in rows.set-aside.jsonl (1 object(s) without run_id or prompt_id)"),
    (first_row_without_run_id, 1, "1 set aside in rows.set-aside.jsonl (1 object(s) without run_id or prompt_id)"),
    (set_aside_is_a_directory, 2, "moved aside: rows.set-aside.jsonl (not a file) -> rows.set-aside.jsonl.damaged"),
    (config(b""), 2, "moved aside: config.yaml (is empty (cut short while it was written)) -> config.yaml.damaged"),
    (config(b"\x00\xff\x89PNG\r\n"), 2, "moved aside: config.yaml (is not UTF-8 text (binary or damaged))"),
    (config_cut_mid_line, 2, "moved aside: config.yaml (is not valid YAML"),
    (config_cut_at_a_line, 2, "2 row(s) kept, 2 prompt(s) left"),
    (summary_is_corrupt, 2, "moved aside: summary.json (is not valid JSON"),
]


@pytest.mark.parametrize("damage, kept, said", DAMAGE, ids=[damage.__name__ if damage.__name__ != "damage" else
                                                             f"config {i}" for i, (damage, _, _) in
                                                             enumerate(DAMAGE)])
def test_resume_sets_damage_aside_in_one_line_and_decodes_each_prompt_once(tiny, tmp_path, capsys, damage, kept,
                                                                            said):
    """Issue 28 item 8: each of these made resume crash with a traceback."""
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    damage(run_dir)
    capsys.readouterr()
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, FOUR)
    line = resume_line(capsys.readouterr().err)
    assert line.startswith(f"continuing {run_dir}: {kept} row(s) kept") and said in line
    assert rundir.read_config(run_dir).value["draft_length"]["k"] == 4  # rewritten whole


def test_a_run_with_an_empty_config_is_found_by_resume_true(tiny, tmp_path, capsys):
    """Issue 28 item 6: a kill while an older version rewrote config.yaml left it empty, and resume=true then
    started a new run and decoded everything again."""
    first = tmp_path / "outputs" / "first"
    overrides = killed_run(tiny, first)
    (first / "config.yaml").write_bytes(b"")
    capsys.readouterr()
    runner.run(*compose_run([*overrides, "resume=true"], tmp_path / "outputs" / "second"))
    assert_each_prompt_once(first, FOUR)
    assert resume_line(capsys.readouterr().err).startswith(f"resuming {first}: 2 row(s) kept")
    assert (first / "config.yaml.damaged").read_bytes() == b""


def test_a_damaged_config_does_not_let_another_setting_in(tiny, tmp_path, loads):
    """With config.yaml unreadable, the rows' own setting columns are compared instead."""
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    (run_dir / "config.yaml").write_bytes(b"")
    with pytest.raises(ConfigError, match=r"holds a run with another config \(k: 4 -> 2\)"):
        runner.run(*compose_run([*overrides, "draft_length.k=2"], run_dir))
    assert loads["pair"] == 1 and len(rows_of(run_dir)) == 2


def test_config_is_replaced_atomically(tiny, tmp_path, monkeypatch):
    """A write of config.yaml that fails part-way leaves the old file whole and no staging file behind."""
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    before = (run_dir / "config.yaml").read_bytes()
    real_write_all = rundir.write_all

    def half_then_full_disk(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".config.yaml.tmp"):
            real_write_all(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write_all(fd, data)

    monkeypatch.setattr(rundir, "write_all", half_then_full_disk)
    with pytest.raises(RunDirectoryError, match=f"cannot write {run_dir / 'config.yaml'}: No space left on device"):
        runner.run(*compose_run(overrides, run_dir))
    assert (run_dir / "config.yaml").read_bytes() == before and not (run_dir / ".config.yaml.tmp").exists()
    assert len(rows_of(run_dir)) == 2


# The environment refuses a write ------------------------------------------------------------------------------------

REFUSALS = [(errno.ENOSPC, "free some space"), (errno.EFBIG, "raise the file-size limit (ulimit -f)"),
            (errno.EDQUOT, "within the disk quota"), (errno.EACCES, "make it writable"),
            (errno.EROFS, "remount the file system read-write"), (errno.EPERM, "chattr -i / chattr -a")]


def refusing(errno_code: int, name: str, after: int = 0, torn: bool = False):
    """A write_all that refuses writes to the file ``name`` after ``after`` of them succeeded, having written half
    of the refused one first when ``torn`` (a disk that fills mid-row)."""
    real_write_all = rundir.write_all
    count = {"writes": 0}

    def write_all(fd, data):
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{name}"):
            count["writes"] += 1
            if count["writes"] > after:
                if torn:
                    real_write_all(fd, data[: len(data) // 2])
                raise OSError(errno_code, os.strerror(errno_code))
        real_write_all(fd, data)

    return write_all


@pytest.mark.parametrize("code, remedy", REFUSALS, ids=[errno.errorcode[code] for code, _ in REFUSALS])
def test_a_refused_row_write_ends_the_run_in_one_line_and_keeps_every_row(tiny, tmp_path, monkeypatch, capsys,
                                                                          code, remedy):
    """Issue 28 item 9: a full disk, a file-size limit, permissions, a read-only file system and immutable files
    printed tracebacks. The third row's write fails half-way; the first two stay, the torn half is cut off, and
    resuming later decodes only what is left."""
    run_dir = tmp_path / "run"
    overrides = [*tiny_overrides(tiny, **OVERRIDES), f"hydra.run.dir={run_dir}"]
    monkeypatch.setattr(rundir, "write_all", refusing(code, "rows.jsonl", after=2, torn=True))
    with pytest.raises(SystemExit) as exit_info:
        main(overrides, monkeypatch)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "Traceback" not in err
    [line] = [line for line in err.splitlines() if line.startswith("config error")]
    assert line == (f"config error: cannot write {run_dir / 'rows.jsonl'}: {os.strerror(code)} "
                    f"({errno.errorcode[code]}); the rows already written are intact: {line.split('intact: ')[1]}")
    assert remedy in line and line.endswith(f", then continue with resume={run_dir}")
    assert [row["prompt_id"] for row in rows_of(run_dir)] == ["p0", "p1"]  # no torn third line
    monkeypatch.setattr(rundir, "write_all", REAL_WRITE_ALL)
    main(overrides, monkeypatch)
    assert_each_prompt_once(run_dir, FOUR)


@pytest.mark.parametrize("code", [errno.EPERM, errno.EROFS, errno.EACCES], ids=["immutable", "read-only", "denied"])
def test_a_rows_file_that_cannot_be_opened_ends_the_resume_in_one_line(tiny, tmp_path, monkeypatch, code):
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    real_open = rundir.open_fd

    def open_fd(path, flags):
        if Path(path).name == "rows.jsonl":
            raise OSError(code, os.strerror(code), str(path))
        return real_open(path, flags)

    monkeypatch.setattr(rundir, "open_fd", open_fd)
    with pytest.raises(RunDirectoryError, match=f"cannot write {run_dir / 'rows.jsonl'}: {os.strerror(code)}"):
        runner.run(*compose_run(overrides, run_dir))
    assert len(rows_of(run_dir)) == 2 and not (run_dir / "run.lock").exists()


def test_an_append_only_rows_file_that_cannot_be_rewritten_keeps_its_rows(tiny, tmp_path, monkeypatch):
    """chattr +a: appending works, replacing the file does not. The pieces reach the side file first."""
    run_dir = tmp_path / "run"
    overrides = killed_run(tiny, run_dir)
    with open(run_dir / "rows.jsonl", "a") as rows_file:
        rows_file.write('{"run_id": "torn\n')
    real_replace = os.replace

    def replace(source, target):
        if Path(target).name == "rows.jsonl":
            raise OSError(errno.EPERM, os.strerror(errno.EPERM))
        real_replace(source, target)

    monkeypatch.setattr(rundir.os, "replace", replace)
    with pytest.raises(RunDirectoryError, match="chattr -i / chattr -a"):
        runner.run(*compose_run(overrides, run_dir))
    monkeypatch.setattr(rundir.os, "replace", real_replace)
    assert (run_dir / "rows.set-aside.jsonl").read_text() == '{"run_id": "torn\n'
    runner.run(*compose_run(overrides, run_dir))
    assert_each_prompt_once(run_dir, FOUR)


@pytest.mark.slow
def test_a_real_file_size_limit_ends_the_run_in_one_line(tiny, tmp_path):
    """No injection: `ulimit -f` below what six rows need (a row is 1.3-1.7 kB; Hydra's own hydra.yaml about
    4.3 kB). The kernel cuts the first row that does not fit short, then refuses the rest of it."""
    run_dir = tmp_path / "run"
    command = [sys.executable, "-m", "experiments.run", *tiny_overrides(tiny, **{**OVERRIDES, "num_prompts": 6}),
               f"hydra.run.dir={run_dir}"]

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (6000, 6000))

    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600,
                          preexec_fn=limit_file_size)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = [line for line in done.stderr.splitlines() if line.startswith("config error")]
    assert f"cannot write {run_dir / 'rows.jsonl'}: File too large (EFBIG)" in line
    kept, written = rows_of(run_dir), (run_dir / "rows.jsonl").read_bytes()
    assert 1 <= len(kept) < 6 and written.count(b"\n") == len(kept) and written.endswith(b"\n")  # torn half cut off
    shortest = min(map(len, written.splitlines()))
    assert len(written) <= 6000 < len(written) + shortest + 1  # every row that fitted was kept
    again = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert_each_prompt_once(run_dir, [f"p{i}" for i in range(6)])


def test_a_failure_mark_that_cannot_be_written_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(rundir, "write_all", refusing(errno.ENOSPC, ".failure.json.tmp"))
    rundir.record_failure(tmp_path, 1, "RuntimeError: boom")
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith(f"could not record failure.json in {tmp_path}: cannot write") and "(ENOSPC)" in line
    assert not (tmp_path / "failure.json").exists()


def test_damaged_failure_marks_are_named_as_failures(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "0" / "failure.json").write_bytes(b"\x00\x00")
    (tmp_path / "1" / "failure.json").mkdir(parents=True)
    marks = rundir.failures(tmp_path)
    assert [mark["exit_code"] for mark in marks.values()] == [1, 1]
    assert "unreadable failure mark" in marks[tmp_path / "0"]["error"]
    rundir.clear_failure(tmp_path / "1")  # a job run again: the directory in its place is moved aside
    assert (tmp_path / "1" / "failure.json.damaged").is_dir() and not (tmp_path / "1" / "failure.json").exists()
