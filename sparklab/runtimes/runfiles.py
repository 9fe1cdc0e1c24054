"""Host process groups and their run files: what the process runtime (processes.py) records about a server and
how it checks and ends one, never signalling a recycled pid.

A run file per server (pid, the pid's start time from /proc/<pid>/stat, the owner token, labels) is what a later
sparklab reads; a pid whose start time differs is another process. Linux reuses no pid that still names a process
group, so a recycled leader pid means the group is gone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from sparklab.errors import ServerError
from sparklab.runtimes.base import ServerInfo
from sparklab.runtimes.state import state_dir

log = logging.getLogger(__name__)


def runs_dir() -> Path:
    return state_dir() / "processes"


# ---------------------------------------------------------------------------------------------------
# /proc: start times and process groups


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command name (field 3, the state, is [0]); None if no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat: clock ticks after boot, which a recycled pid does not share."""
    fields = _stat(pid)
    return fields[19] if fields else None


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group pgid."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat(int(entry.name))
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


@dataclass
class RunRecord:
    """The run file of one host-process server: what a later sparklab needs to find, check and end it."""

    name: str
    pid: int  # the keeper's pid, which is also the process group's id
    start_time: str | None
    labels: dict[str, str]
    argv: list[str]  # as printed: the API key as its placeholder
    log_path: str
    log_offset: int  # where this server's lines begin in the log file
    created: str
    api_key: str | None = None  # the file is private to its user (0600), like a container's config
    secrets: list[str] | None = None  # what the log redaction replaces, for `sparklab logs` of a live keeper

    @property
    def path(self) -> Path:
        return runs_dir() / f"{self.name}.json"

    @property
    def exit_path(self) -> Path:
        return runs_dir() / f"{self.name}.exit"

    @property
    def index_path(self) -> Path:
        return runs_dir() / f"{self.name}.index"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        partial = self.path.with_suffix(".tmp")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(self.__dict__, out)
        os.replace(partial, self.path)

    @classmethod
    def load(cls, path: Path) -> RunRecord | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def forget(self) -> None:
        for path in (self.path, self.exit_path, self.index_path):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    # -- the group ---------------------------------------------------------------------------------------
    def recycled(self) -> bool:
        """The pid now belongs to another process (its start time differs): never signal it."""
        now = start_time(self.pid)
        return now is not None and now != self.start_time

    def members(self) -> list[int]:
        """The group's live processes; none when the pid was recycled (Linux reuses no pid that still names a
        process group, so a recycled pid means the group is gone)."""
        return [] if self.recycled() else group_members(self.pid)

    def alive(self) -> bool:
        return bool(self.members())

    def exit_code(self) -> int | None:
        try:
            return int(self.exit_path.read_text().strip())
        except (OSError, ValueError):
            return None

    def signal(self, sig: int) -> None:
        if self.members():  # checked just before: never a recycled pid
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, sig)

    def info(self) -> ServerInfo:
        running = self.alive()
        return ServerInfo(id=f"pid {self.pid}", name=self.name, status="running" if running else "exited",
                          exit_code=None if running else self.exit_code(), labels=dict(self.labels),
                          created=self.created, runtime="process")


def terminate(record: RunRecord, grace_s: float = 10, proc: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM to the group, a grace period, then SIGKILL, until none of it is left; then forget the run."""
    record.signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while record.members() and time.monotonic() < deadline:
        _reap(proc)
        time.sleep(0.05)
    if record.members():
        log.info("%s did not stop within %.0f s of SIGTERM: SIGKILL", record.name, grace_s)
        record.signal(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while record.members() and time.monotonic() < deadline:
            _reap(proc)
            time.sleep(0.05)
    if proc is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    left = record.members()
    if left:
        raise ServerError(f"could not end {record.name}: process(es) {left} survived SIGKILL",
                             f"End them by hand: kill -9 -- -{record.pid}")
    record.forget()


def _reap(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None:
        proc.poll()
