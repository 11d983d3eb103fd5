"""How many jobs of one sweep are running on this machine, so that rows whose timings were shared say so.

Each running job holds an exclusive lock on a file of its own in ``<sweep_dir>/.running/<host>/`` and counts the
files there whose lock is held. A lock rather than a process id or a heartbeat: the kernel releases it when its
process ends, however it ends (kill -9, out of memory, a preempted SLURM job), so a dead job is never counted,
and process ids need not mean the same thing in two containers. The sweep directory rather than /tmp, because a
cluster may give each job a private /tmp.
"""

from __future__ import annotations

import errno
import fcntl
import os
import socket
import uuid
import warnings
from pathlib import Path

RUNNING = ".running"  # under the sweep directory, one folder per host


class ConcurrencyWarning(UserWarning):
    """Concurrent jobs cannot be counted here (the file system refuses locks); rows say null."""


def host_name() -> str:
    return socket.gethostname()


def live_jobs_dir(sweep_dir: Path) -> Path:
    """Where the jobs of a sweep running on this host hold their locks."""
    return sweep_dir / RUNNING / host_name()


class LiveJobs:
    """This job's entry among the live jobs of its sweep on this host, for as long as the ``with`` block runs.

    ``count()`` is the number of live jobs, this one included: 1 for a single run (``directory`` None), None
    where the file system gives no locks.
    """

    def __init__(self, directory: Path | None):
        self.directory = directory
        self.file = None
        self.path: Path | None = None
        self.unknown = False

    def __enter__(self) -> LiveJobs:
        if self.directory is not None:
            self.register()
        return self

    def __exit__(self, *exc) -> None:
        if self.file is not None:
            self.path.unlink(missing_ok=True)
            self.file.close()
            self.file = None

    def register(self) -> None:
        """Lock a file under a hidden name, then rename it into place: every visible entry is locked from its
        first moment, so another job never takes a new entry for a dead one."""
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        staging = self.directory / f".{name}"
        self.file = open(staging, "w")
        try:
            fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            self.file.close()
            self.file = None
            staging.unlink(missing_ok=True)
            self.unknown = True
            warnings.warn(f"{self.directory}: the file system gives no locks ({os.strerror(err.errno)}), so jobs "
                          f"running beside this one are not counted; rows say concurrent_jobs=null",
                          ConcurrencyWarning, stacklevel=3)
            return
        self.path = self.directory / name
        os.replace(staging, self.path)

    def count(self) -> int | None:
        if self.unknown:
            return None
        if self.directory is None:
            return 1
        # Its own entry is never probed: where locks are POSIX record locks (flock on NFS), a process's second lock
        # on its own file succeeds, and closing the probe would release the lock it holds.
        return sum(entry == self.path or is_held(entry) for entry in self.directory.iterdir()
                   if not entry.name.startswith("."))


def is_held(entry: Path) -> bool:
    """Whether a live process holds the lock on ``entry``; an entry left by a dead job is removed."""
    try:
        descriptor = os.open(entry, os.O_WRONLY)  # write access: NFS grants exclusive locks only to writers
    except FileNotFoundError:  # its job ended between the listing and now
        return False
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        if err.errno in (errno.EAGAIN, errno.EACCES):
            return True
        raise
    else:
        entry.unlink(missing_ok=True)
        return False
    finally:
        os.close(descriptor)
