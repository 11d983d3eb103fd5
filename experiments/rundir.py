"""Writing a run directory (its files, its row record and their readers: ``specdec.results``; what it guarantees:
docs/run-directories.md).

One process writes a directory at a time (``RunLock``). Resume finds the directory (``results_dir``) and makes it
whole before rows are appended (``recover``). Rows are appended and fsynced as they are produced (``RowWriter``);
every other file is replaced atomically (``write_atomic``). A write the environment refuses (a full disk, a
file-size limit, permissions, a read-only file system, an immutable or append-only file) ends the run with one
``RunDirectoryError`` line naming the file and how to resume, and leaves the rows already written as they were.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from experiments.config_checks import ConfigError
from experiments.concurrency import host_name
from specdec.results import (
    CONFIG,
    DAMAGED_SUFFIX,
    FAILURE,
    FREE_KEYS,
    INCONSISTENT,
    LOCK,
    ROWS,
    SET_ASIDE,
    STALE,
    SUMMARY,
    Piece,
    config_difference,
    describe_pieces,
    dump,
    json_ready,
    read_config,
    read_failure,
    read_json_object,
    read_rows,
    read_rows_file,
    read_summary,
    round_of,
    without_keys,
)

HYDRA_OWN_FILES = {".hydra", "run.log"}  # what Hydra writes into a run directory before the job starts
# What to do about a write the environment refused, by errno.
REMEDIES = {
    errno.ENOSPC: "free some space",
    errno.EDQUOT: "free some space within the disk quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f) or move the run directory to a file system that allows "
                 "larger files",
    errno.EACCES: "make it writable",
    errno.EPERM: "make it writable (chattr -i / chattr -a if it is immutable or append-only)",
    errno.EROFS: "remount the file system read-write, or copy the run directory to a writable place",
    errno.EISDIR: "move the directory in its place away",
}
LOCK_ATTEMPTS = 100  # a holder removing its lock file between our open and our lock sends us round again


class RunDirectoryError(ConfigError):
    """The run directory cannot be written as it is: another process writes it, or the environment refused a
    write. One line naming the file and what to do; a ConfigError, so every entry point prints it as one line."""


def refused_write(path: Path, run_dir: Path, err: OSError) -> RunDirectoryError:
    code = errno.errorcode.get(err.errno, "error")
    remedy = REMEDIES.get(err.errno, "fix that")
    return RunDirectoryError(f"cannot write {path}: {err.strerror or err} ({code}); the rows already written are "
                             f"intact: {remedy}, then continue with resume={run_dir}")


@contextmanager
def writing(path: Path, run_dir: Path):
    """Turn an OSError while writing ``path`` into the one-line ``RunDirectoryError``."""
    try:
        yield
    except OSError as err:
        raise refused_write(path, run_dir, err) from None


def open_fd(path: Path, flags: int) -> int:
    """Every file this module writes is opened here (tests inject the environment's refusals here)."""
    return os.open(path, flags, 0o644)


def write_all(fd: int, data: bytes) -> None:
    """Every byte of ``data`` to ``fd``; every file this module writes is written here."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` by ``data`` so that a kill leaves the old file or the new one, never a part of either:
    write a hidden file beside it, fsync it, rename it over the path, fsync the directory."""
    staging = path.with_name(f".{path.name}.tmp")
    try:
        fd = open_fd(staging, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(staging, path)
    except OSError:
        staging.unlink(missing_ok=True)
        raise
    sync_directory(path.parent)


def sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable; file systems that cannot fsync a directory are left as they are."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.EBADF, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


# One writer ---------------------------------------------------------------------------------------------------------

class RunLock:
    """The one writer of a run directory, for as long as the ``with`` block runs.

    ``run.lock`` in the directory holds {"pid", "host", "since"} of its writer, which keeps an exclusive lock
    (flock) on it. The kernel drops that lock when the process ends, however it ends, so a lock file left by a
    killed run is taken over (``taken_over`` names the run that left it), while a live holder makes a second
    writer fail in one line naming it. Where the file system gives no locks, the file alone decides: taken over
    when its pid is dead on this host, refused otherwise. On leaving, the file is removed while still locked.
    """

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.path = run_dir / LOCK
        self.fd: int | None = None
        self.taken_over: dict | None = None

    def __enter__(self) -> RunLock:
        refuse_links(self.run_dir)
        with writing(self.path, self.run_dir):
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self.fd = self.acquire()
            try:
                self.taken_over = holder_in(self.fd)
                self.sign()
            except BaseException:
                self.__exit__()
                raise
        if self.taken_over is not None:
            print(f"{self.run_dir}: took over the {LOCK} left by {describe_holder(self.taken_over)}, which ended "
                  "without removing it", file=sys.stderr)
        return self

    def sign(self) -> None:
        """Write this process into the lock file, in place of whoever left it."""
        me = {"pid": os.getpid(), "host": host_name(), "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.ftruncate(self.fd, 0)
        write_all(self.fd, dump(me) + b"\n")
        os.fsync(self.fd)

    def __exit__(self, *exc) -> None:
        if self.fd is None:
            return
        if same_file(self.fd, self.path):
            self.path.unlink(missing_ok=True)  # while locked: a waiting opener of this file then retries
        os.close(self.fd)
        self.fd = None

    def acquire(self) -> int:
        """An open descriptor of run.lock, locked by this process."""
        for _ in range(LOCK_ATTEMPTS):
            fd = open_fd(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                os.close(fd)
                if err.errno in (errno.EAGAIN, errno.EACCES):
                    raise self.in_use(read_json_object(self.path).value, "") from None
                return self.acquire_without_locks()
            if same_file(fd, self.path):
                return fd
            os.close(fd)  # its holder removed it as we opened it: lock the file that is there now
        raise RunDirectoryError(f"{self.path}: could not be locked in {LOCK_ATTEMPTS} attempts; another process "
                                "keeps replacing it")

    def acquire_without_locks(self) -> int:
        """Where flock is refused: the pid and host in the file decide."""
        holder = read_json_object(self.path).value
        if holder is not None and not holder_has_ended(holder):
            raise self.in_use(holder, f"; if it has ended, remove {self.path}")
        return open_fd(self.path, os.O_RDWR | os.O_CREAT)

    def in_use(self, holder: dict | None, hint: str) -> RunDirectoryError:
        who = describe_holder(holder)
        return RunDirectoryError(f"run directory {self.run_dir} is being written by {who} ({LOCK}); one run "
                                 "directory takes one writer: wait for that run to end, or give this one another "
                                 f"hydra.run.dir{hint}")


def refuse_links(run_dir: Path) -> None:
    """The files a run appends to or locks must be its own: through a symbolic link, rows would be appended into
    another run's rows.jsonl (and counted by both) or into nothing, and the lock taken on another file. (Files
    replaced whole, config.yaml and summary.json, replace a link by a file.)"""
    for name in (LOCK, ROWS):
        path = run_dir / name
        if path.is_symlink():
            keep = " (or copy the file it points to in its place, to keep those rows)" if name == ROWS else ""
            raise RunDirectoryError(f"{path} is a symbolic link (to {os.readlink(path)}); a run directory's {name} "
                                    f"must be its own file: remove the link{keep}, then continue with "
                                    f"resume={run_dir}")


def holder_in(fd: int) -> dict | None:
    """Who wrote the lock file we now hold, if anyone did: a run that ended without removing it."""
    data = os.pread(fd, 4096, 0)
    if not data.strip():
        return None
    try:
        holder = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def describe_holder(holder: dict | None) -> str:
    if not holder or "pid" not in holder:
        return "another process (its run.lock names none)"
    return f"pid {holder['pid']} on host {holder.get('host', '?')} since {holder.get('since', '?')}"


def holder_has_ended(holder: dict) -> bool:
    """Whether the process a lock file names has ended: knowable only for one on this host."""
    pid = holder.get("pid")
    if holder.get("host") != host_name() or isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


# Resume -------------------------------------------------------------------------------------------------------------

def cut_short(old: dict, new: dict) -> bool:
    """Whether ``old`` holds only settings of ``new``, each with the same value, but not all of them: a config
    cut short at a line (or one written before the newer keys existed)."""
    def covered(a: dict, b: dict) -> bool:
        return all(key in b and (covered(value, b[key]) if isinstance(value, dict) and isinstance(b[key], dict)
                                 else value == b[key]) for key, value in a.items())

    return covered(old, new) and config_difference(old, new, free=()) is not None


def identity_difference(rows: list[dict], columns: dict) -> str | None:
    """The first setting column on which a row differs from ``columns`` (only columns the row carries) as
    'column: row's -> this run's', or None."""
    for row in rows:
        for name, value in columns.items():
            if name in row and row[name] != value:
                return f"{name}: {row[name]!r} -> {value!r}"
    return None


def stored_config(run_dir: Path) -> tuple[dict | None, str | None]:
    """The settings config.yaml holds and, where it is damaged, why. A file cut in the middle of a line (every
    config.yaml written ends with a new line) may parse with its last value cut ('dtype: fl', or 'logger:' without
    its keys): its whole lines are read, less the last setting they hold, which may have been cut."""
    config, problem = read_config(run_dir)
    data = (run_dir / CONFIG).read_bytes() if config is not None else b""
    if config is None or data.endswith(b"\n"):
        return config, problem
    whole_lines = data[: data.rfind(b"\n") + 1]
    try:
        kept = yaml.safe_load(whole_lines.decode("utf-8")) if whole_lines.strip() else None
    except (yaml.YAMLError, ValueError):
        kept = None
    return (without_last_setting(kept) if isinstance(kept, dict) else None), \
        f"{run_dir / CONFIG} is cut short in the middle of a line"


def without_last_setting(config: dict) -> dict:
    """``config`` less its last setting in file order (the last key of its last mapping; a mapping left empty
    goes too)."""
    if not config:
        return config
    *_, last = config
    value = config[last]
    kept = without_last_setting(value) if isinstance(value, dict) else {}
    return {**{key: config[key] for key in config if key != last}, **({last: kept} if kept else {})}


def stored_setting_difference(run_dir: Path, config: dict, columns: dict) -> str | None:
    """How the run already in ``run_dir`` differs from this one, or None: by its config.yaml, or, where that is
    damaged, absent or cut short, by what it still holds and its rows' setting columns."""
    old, _ = stored_config(run_dir)
    if old is not None and not cut_short(without_keys(old, FREE_KEYS), without_keys(config, FREE_KEYS)):
        return config_difference(old, config)
    return identity_difference(read_rows(run_dir), columns)


def check_same_setting(run_dir: Path, config: dict, columns: dict) -> None:
    """Rows of one run directory come from one setting."""
    difference = stored_setting_difference(run_dir, config, columns)
    if difference:
        raise ConfigError(f"run directory {run_dir} holds a run with another config ({difference}); use a new "
                          f"hydra.run.dir or resume with the same settings (a damaged {CONFIG} can be moved "
                          "away: the rows' own setting columns are then compared)")


def is_run_directory(path: Path) -> bool:
    return (path / CONFIG).exists() or (path / ROWS).exists()


def unfinished_runs(search_root: Path, exclude: Path) -> list[Path]:
    """Run directories under ``search_root`` (depth <= 2) without a readable summary.json, ``exclude`` left out."""
    if not search_root.is_dir():
        return []
    found = {path.parent for name in (CONFIG, ROWS) for pattern in (f"*/{name}", f"*/*/{name}")
             for path in search_root.glob(pattern)}
    return [run_dir for run_dir in found
            if run_dir.resolve() != exclude.resolve() and read_summary(run_dir).value is None]


def find_unfinished(search_root: Path, config: dict, columns: dict, exclude: Path) -> Path | None:
    """The newest unfinished run directory under ``search_root`` with this setting; one whose config.yaml is
    damaged counts when what it still holds and its rows match. None where there is none, and a ConfigError where
    there is none but an unfinished run whose config.yaml is damaged and which has no rows to tell its setting:
    it names that directory and how to resume it."""
    runs = unfinished_runs(search_root, exclude)
    candidates = [run_dir for run_dir in runs
                  if (stored_config(run_dir)[0] is not None or read_rows(run_dir))
                  and stored_setting_difference(run_dir, config, columns) is None]
    if candidates:
        return max(candidates, key=newest_change)
    unknown = [run_dir for run_dir in runs if stored_config(run_dir)[1] is not None and not read_rows(run_dir)
               and stored_setting_difference(run_dir, config, columns) is None]
    if unknown:
        run_dir = max(unknown, key=newest_change)
        raise ConfigError(f"resume=true: no unfinished run with this config under {search_root}, but {run_dir} is "
                          f"unfinished and its setting cannot be told ({stored_config(run_dir)[1]}, and no rows); "
                          f"to continue it: resume={run_dir}; to start a new run: resume=false")
    return None


def newest_change(run_dir: Path) -> float:
    return max((run_dir / name).stat().st_mtime for name in (CONFIG, ROWS) if (run_dir / name).exists())


def results_dir(resume: bool | str, run_dir: Path, search_root: Path, config: dict, columns: dict
                ) -> tuple[Path, str | None]:
    """Where this run's rows go, and a one-line note when it continues an earlier run.

    The run's own directory, unless ``resume`` is a directory path, or ``resume=true`` finds an unfinished run with
    the same setting under ``search_root``. A directory that already has rows is always continued, never
    overwritten. ``columns``: this run's setting columns known before the models load.
    """
    if isinstance(resume, str):
        target = Path(resume).expanduser()
        if not is_run_directory(target):
            raise ConfigError(f"resume={resume!r}: not a run directory (no {CONFIG} or {ROWS} in it)")
        check_same_setting(target, config, columns)
        return target, f"resuming {target}"
    check_same_setting(run_dir, config, columns)
    if resume and not read_rows(run_dir):
        found = find_unfinished(search_root, config, columns, exclude=run_dir)
        if found is not None:
            return found, f"resuming {found}"
        return run_dir, f"resume=true: no unfinished run with this config under {search_root}; starting a new run"
    return run_dir, None


@dataclass(frozen=True)
class Recovery:
    """What ``recover`` found: the rows kept (one per prompt of the set), the pieces it set aside, and the damaged
    files it moved aside, each as 'name (why) -> new name'."""

    rows: list[dict]
    set_aside: list[Piece]
    moved: list[str]

    def report(self, note: str, left: int) -> str:
        """One line: 'continuing <dir>: 2 row(s) kept, 3 set aside in rows.set-aside.jsonl (...), 2 prompt(s)
        left'."""
        parts = [f"{note}: {len(self.rows)} row(s) kept"]
        if self.set_aside:
            parts.append(f"{len(self.set_aside)} set aside in {SET_ASIDE} ({describe_pieces(self.set_aside)})")
        parts += [f"moved aside: {moved}" for moved in self.moved]
        return ", ".join([*parts, f"{left} prompt(s) left"])


def recover(run_dir: Path, prompts: list, columns: dict) -> Recovery:
    """Before rows are appended: keep one row per prompt of ``prompts``, move aside files that cannot be read,
    append every other piece of rows.jsonl to rows.set-aside.jsonl, then rewrite rows.jsonl as the rows kept, one
    per line. The pieces reach the side file before rows.jsonl is replaced (atomically), so a kill at any point
    leaves each row in one of the two. Kept rows of another setting (``columns``) end the run in one line, before
    anything is moved."""
    found = read_rows_file(run_dir)
    hashes, ids = {prompt.hash for prompt in prompts}, {str(prompt.id) for prompt in prompts}
    id_of_hash = {prompt.hash: str(prompt.id) for prompt in prompts}
    rows, stale, inconsistent = [], [], []
    for row in found.rows:
        if not decodes_one_of(row, hashes, ids):
            stale.append(row)
        else:
            (inconsistent if disagreement(row, id_of_hash) else rows).append(row)
    difference = identity_difference(rows, columns)
    if difference:
        raise ConfigError(f"run directory {run_dir} holds rows of another setting ({difference}); use a new "
                          "hydra.run.dir or resume with the same settings")
    moved = move_damaged_files(run_dir)
    pieces = (found.set_aside + [Piece(0, dump(row), STALE) for row in stale]
              + [Piece(0, dump(row), INCONSISTENT) for row in inconsistent])
    path = run_dir / ROWS
    if pieces:
        with writing(run_dir / SET_ASIDE, run_dir):
            append_pieces(run_dir / SET_ASIDE, pieces)
    clean = b"".join(dump(row) + b"\n" for row in rows)
    if path.exists() and path.read_bytes() != clean:
        with writing(path, run_dir):
            write_atomic(path, clean)
    return Recovery(rows, pieces, moved)


def disagreement(row: dict, id_of_hash: dict[str, str]) -> str | None:
    """What makes a row read back on resume disagree with itself or with its prompt (a hand edit, a tampered
    file), or None: its token lists against their counts and against ``identical_output``, and its ``prompt_id``
    against the id the prompt set gives its ``prompt_hash``. Columns a row lacks (older rows) are not compared."""
    for tokens, count in (("tokens", "emitted"), ("baseline_tokens", "baseline_emitted")):
        if tokens in row or count in row:
            listed = row.get(tokens)
            if not isinstance(listed, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                       for t in listed):
                return f"{tokens} is not a list of token ids"
            if row.get(count) != len(listed):
                return f"{count}={row.get(count)!r} but {tokens} holds {len(listed)}"
    identical = row.get("identical_output")
    if identical is not None and "tokens" in row and identical != (row["tokens"] == row.get("baseline_tokens")):
        return f"identical_output={identical!r} disagrees with tokens and baseline_tokens"
    if has_hash(row) and row["prompt_hash"] in id_of_hash and row["prompt_id"] != id_of_hash[row["prompt_hash"]]:
        return f"prompt_id={row['prompt_id']!r} but its prompt_hash is prompt {id_of_hash[row['prompt_hash']]!r}'s"
    return None


def has_hash(row: dict) -> bool:
    """Rows written before rows carried a prompt_hash are known by their prompt_id alone."""
    return isinstance(row.get("prompt_hash"), str) and bool(row["prompt_hash"])


def decodes_one_of(row: dict, hashes: set[str], ids: set[str]) -> bool:
    """Whether a row decoded a prompt with one of these hashes (a row without a hash: one of these ids)."""
    return row["prompt_hash"] in hashes if has_hash(row) else row["prompt_id"] in ids


def prompts_left(prompts: list, rows: list[dict], round_number: int = 0) -> list:
    """The prompts that no row of round ``round_number`` decoded yet, in their order (a row without a round is of
    round 0)."""
    rows = [row for row in rows if round_of(row) == round_number]
    hashes = {row["prompt_hash"] for row in rows if has_hash(row)}
    ids = {row["prompt_id"] for row in rows if not has_hash(row)}
    return [prompt for prompt in prompts if prompt.hash not in hashes and str(prompt.id) not in ids]


def append_pieces(path: Path, pieces: list[Piece]) -> None:
    fd = open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        write_all(fd, b"".join(piece.raw + b"\n" for piece in pieces))
        os.fsync(fd)
    finally:
        os.close(fd)


def move_damaged_files(run_dir: Path) -> list[str]:
    """Move aside, whole, each file of the directory that cannot be read as what it should be: a config.yaml,
    summary.json or failure.json that is empty, binary or not parseable, and a rows.jsonl or rows.set-aside.jsonl
    that is not a file. They are rewritten as the run goes on."""
    problems = {
        CONFIG: read_config(run_dir).problem,
        SUMMARY: read_summary(run_dir).problem,
        FAILURE: read_failure(run_dir).problem,
        ROWS: read_rows_file(run_dir).problem,
        SET_ASIDE: "not a file" if (run_dir / SET_ASIDE).exists() and not (run_dir / SET_ASIDE).is_file() else None,
    }
    moved = []
    for name, problem in problems.items():
        if problem is not None:
            with writing(run_dir / name, run_dir):
                target = move_aside(run_dir / name)
            moved.append(f"{name} ({problem.removeprefix(str(run_dir / name)).strip()}) -> {target.name}")
    return moved


def move_aside(path: Path) -> Path:
    """Rename ``path`` to ``<name>.damaged`` (``.damaged-2``, ... if taken); returns the new path."""
    target, number = path.with_name(path.name + DAMAGED_SUFFIX), 1
    while target.exists():
        number += 1
        target = path.with_name(f"{path.name}{DAMAGED_SUFFIX}-{number}")
    os.rename(path, target)
    return target


def remove_if_only_hydra_files(run_dir: Path) -> None:
    """Delete a run directory that holds nothing but what Hydra wrote before the job started."""
    if run_dir.is_dir() and {entry.name for entry in run_dir.iterdir()} <= HYDRA_OWN_FILES:
        shutil.rmtree(run_dir, ignore_errors=True)


# Writing ------------------------------------------------------------------------------------------------------------

def check_appendable(run_dir: Path) -> None:
    """Open rows.jsonl for appending, and close it: a file the environment refuses (permissions, a read-only file
    system) ends the run in one line now, not once the models have loaded and warmed up (``RowWriter`` opens it
    then)."""
    path = run_dir / ROWS
    with writing(path, run_dir):
        os.close(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT))


class RowWriter:
    """Appends rows to rows.jsonl, opened after ``recover`` (which leaves the file ending with a complete row).
    Each row reaches the file as one write of its line and newline, then is fsynced before the next prompt starts:
    a killed run loses at most the row being written. A write the environment refuses is undone (the file is cut
    back to its last complete row, where the file allows that) and ends the run in one line."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.path = run_dir, run_dir / ROWS
        with writing(self.path, run_dir):
            self.fd = open_fd(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def write(self, row: dict) -> None:
        line = (json.dumps(row, allow_nan=False) + "\n").encode("utf-8")
        end = os.fstat(self.fd).st_size
        try:
            write_all(self.fd, line)
            os.fsync(self.fd)
        except OSError as err:
            cut_back(self.fd, end)
            raise refused_write(self.path, self.run_dir, err) from None

    def close(self) -> None:
        os.close(self.fd)


def cut_back(fd: int, size: int) -> None:
    """Drop a torn row; an append-only file refuses, and then the next resume sets the piece aside."""
    try:
        os.ftruncate(fd, size)
    except OSError:
        pass


def write_config(run_dir: Path, config: dict) -> None:
    path = run_dir / CONFIG
    with writing(path, run_dir):
        write_atomic(path, OmegaConf.to_yaml(OmegaConf.create(config)).encode("utf-8"))


def write_json(path: Path, data: dict) -> None:
    """``data`` as indented JSON, atomically, NaN as null; a refused write ends the run in one line."""
    with writing(path, path.parent):
        write_atomic(path, (json.dumps(json_ready(data), indent=2) + "\n").encode("utf-8"))


def record_failure(run_dir: Path, exit_code: int, error: str) -> None:
    """Mark a sweep job that ended with an error, so that the sweep's report names it. Where even that write is
    refused, one line says so and the job's error stands as printed."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_json(run_dir / FAILURE, {"exit_code": exit_code, "error": error})
    except (OSError, RunDirectoryError) as err:
        print(f"could not record {FAILURE} in {run_dir}: {err}", file=sys.stderr)


def clear_failure(run_dir: Path) -> None:
    """A job run again starts without the mark of its last failure (one that is not a file is moved aside)."""
    path = run_dir / FAILURE
    try:
        if path.is_dir():
            move_aside(path)
        else:
            path.unlink(missing_ok=True)
    except OSError:
        pass  # an unwritable directory: the run says so, in one line, at its first write


def failures(sweep_dir: Path) -> dict[Path, dict]:
    """The failure marks of a sweep's jobs, by job directory (at any depth, as hydra.sweep.subdir may nest); an
    unreadable mark counts as a failure that says why it cannot be read."""
    marks = sorted(sweep_dir.rglob(FAILURE), key=lambda path: job_order(path.parent))
    return {path.parent: mark_of(path.parent) for path in marks}


def mark_of(job_dir: Path) -> dict:
    failure, problem = read_failure(job_dir)
    return failure if failure is not None else {"exit_code": 1, "error": f"unreadable failure mark: {problem}"}


def job_order(job_dir: Path) -> tuple:
    """Sweep jobs in their numbers' order (2 before 10), other directories after them by name."""
    return (0, int(job_dir.name), "") if job_dir.name.isdigit() else (1, 0, job_dir.name)
