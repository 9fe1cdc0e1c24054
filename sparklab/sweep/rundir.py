"""A run's id and directory and what keeps it safe: finding it, one sweep process at a time, its fault log,
and the free space under it. No imports beyond errors and the host's disk: the store asks it about disks."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from sparklab.errors import DiskFullError, SparklabError
from sparklab.host.disk import free_bytes
from sparklab.host.facts import HostFacts


def new_run_id() -> str:
    """A sortable, unique run id: the local start time and 6 random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def resolve(runs_dir: Path, name: str, resume: str | None, new: bool) -> tuple[Path, bool]:
    """(run directory, whether it exists): --resume RUN, else the newest run of this sweep, else a new one."""
    if resume:
        run = runs_dir / resume
        if not (run / "results.sqlite").exists():
            raise SparklabError(f"no run {resume!r} under {runs_dir} (no {run / 'results.sqlite'})",
                                f"List them with: ls {runs_dir}")
        return run, True
    earlier = sorted(runs_dir.glob(f"{name}-*/results.sqlite"))
    if earlier and not new:
        return earlier[-1].parent, True
    return runs_dir / f"{name}-{new_run_id()}", False


def check_free_space(run_dir: Path, min_free_mib: float, facts: HostFacts | None = None) -> None:
    """Stop before a server starts when the disk under the run has less than min_free_mib left (facts: the machine
    the run directory is on, read through host/facts.py; default this one)."""
    free = ((facts.free_bytes(run_dir) if facts is not None else free_bytes(run_dir)) or 0) / 2**20
    if free < min_free_mib:
        raise DiskFullError(f"only {free:.0f} MiB free under {run_dir} (the sweep wants {min_free_mib:.0f} MiB before "
                            "each server): sparklab stopped the sweep (finished cells are kept)",
                            f"Free space there (df -h {run_dir}), then run the same sweep again to continue.")


LOG_NAME = "sweep.log"
faults = logging.getLogger("sparklab.faults")  # tracebacks of contained faults: the run's log file, not the console
faults.propagate = False


@contextlib.contextmanager
def fault_log(run_dir: Path) -> Iterator[None]:
    """While a sweep runs, contained faults' tracebacks go to runs/<id>/sweep.log."""
    handler = logging.FileHandler(run_dir / LOG_NAME, encoding="utf-8", delay=True)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    faults.addHandler(handler)
    try:
        yield
    finally:
        faults.removeHandler(handler)
        handler.close()


class RunLock:
    """One sweep process per run: an exclusive flock on runs/<id>/lock, holding the holder's pid.

    The kernel drops a flock when its process dies (even by SIGKILL), so a lock left by a dead sweep is never
    stale: the next sweep simply takes it.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "lock"
        self._fd: int | None = None

    def __enter__(self) -> RunLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SparklabError(f"run {self.path.parent.name} is in use by pid {holder} (another `sparklab sweep` "
                                "is running it)", f"Wait for it to finish, or stop it: kill -TERM {holder}") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None
