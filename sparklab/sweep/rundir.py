"""A run's id and directory and what keeps it safe: finding it, one sweep process at a time (per run and per
sweep), its fault log, and the free space under it. It imports only errors, the host's disk and facts (the store
asks it about disks) and the state directory (where the sweep locks live)."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
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


RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{6}")  # new_run_id's shape


def runs_of(runs_dir: Path, name: str) -> list[Path]:
    """The run directories of the sweep `name` (those named exactly `<name>-<run id>` that hold a results file),
    oldest first. `name` is taken literally: never a glob pattern, and `pq` never matches `pq-long-<id>`."""
    try:
        entries = list(runs_dir.iterdir())
    except OSError:  # no runs directory yet, or not a directory
        return []
    prefix = f"{name}-"
    return sorted(entry for entry in entries
                  if entry.name.startswith(prefix) and RUN_ID.fullmatch(entry.name[len(prefix):])
                  and (entry / "results.sqlite").is_file())


def resolve(runs_dir: Path, name: str, resume: str | None, new: bool) -> tuple[Path, bool]:
    """(run directory, whether it exists): --resume RUN, else the newest run of this sweep, else a new one."""
    if resume:
        run = runs_dir / resume
        if not (run / "results.sqlite").exists():
            raise SparklabError(f"no run {resume!r} under {runs_dir} (no {run / 'results.sqlite'})",
                                f"List them with: ls {runs_dir}")
        return run, True
    earlier = runs_of(runs_dir, name)  # the exact name: sweep `pq` never continues `pq-long-<id>`
    if earlier and not new:
        return earlier[-1], True
    return runs_dir / f"{name}-{new_run_id()}", False


def make(run_dir: Path) -> None:
    """Create the run's directory; a runs directory sparklab cannot write is an error naming it, not a traceback."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise unwritable(run_dir, exc) from None


def unwritable(path: Path, exc: OSError) -> SparklabError:
    why = {errno.EROFS: "is on a read-only file system", errno.EACCES: "is not writable by you",
           errno.EPERM: "is not writable by you", errno.ENOTDIR: "has a file where a directory should be",
           errno.ENAMETOOLONG: "makes a path too long"}.get(exc.errno or 0, f"cannot be written ({exc.strerror})")
    return SparklabError(f"{path}: sparklab cannot create the run there: {path.parent} {why}",
                         "Give --runs-dir a directory you can write to (default ./runs).")


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


class _Flock:
    """An exclusive flock on a file holding the holder's pid.

    The kernel drops a flock when its process dies (even by SIGKILL), so a lock left by a dead sweep is never
    stale: the next sweep simply takes it.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def _busy(self, holder: str) -> SparklabError:
        raise NotImplementedError

    def __enter__(self) -> _Flock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # a run on read-only media can be reported, never continued
            raise unwritable(self.path, exc) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise self._busy(holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            os.close(self._fd)  # releases the flock
            self._fd = None


class RunLock(_Flock):
    """One sweep process per run: runs/<id>/lock."""

    def __init__(self, run_dir: Path) -> None:
        super().__init__(run_dir / "lock")

    def _busy(self, holder: str) -> SparklabError:
        return SparklabError(f"run {self.path.parent.name} is in use by pid {holder} (another `sparklab sweep` is "
                             "running it)", f"Wait for it to finish, or stop it: kill -TERM {holder}")


class SweepLock(_Flock):
    """One sweep process per sweep name and runs directory, taken before a run is chosen or made: two sweeps of
    one name started together would otherwise each make a run and fight over the recipe's port. The lock file
    lives in sparklab's state directory (locks/<name>-<hash of the runs directory>.lock), so runs/ holds runs only.
    """

    def __init__(self, runs_dir: Path, name: str) -> None:
        from sparklab.runtimes.state import state_dir  # here: `report` reads runs_of offline, never the runtimes

        where = hashlib.sha256(str(runs_dir.resolve()).encode()).hexdigest()[:12]
        super().__init__(state_dir() / "locks" / f"{name}-{where}.lock")
        self.name, self.runs_dir = name, runs_dir

    def _busy(self, holder: str) -> SparklabError:
        return SparklabError(f"sweep {self.name} is in use by pid {holder} (another `sparklab sweep` of it is running "
                             f"under {self.runs_dir}); a second would make its own run and fight the first over "
                             "its servers' ports",
                             f"Wait for it to finish, or stop it: kill -TERM {holder}. To run both, give the "
                             "second its own sweep name or --runs-dir.")
