"""Host processes as an engine runtime beside Docker (containers.py), with the same guarantees and the same
contract (base.Runtime, base.Server).

A process engine (`runtime: process` in a recipe) runs its rendered argv (never a shell string) in a process group
of its own, led by keeper.py, which copies its output, secrets replaced, into the same log files a container's log
goes to (read back by process_logs.py). A run file per server (pid, the pid's start time from /proc/<pid>/stat, the
owner token, the labels a container would carry) lets `ps`, `down`, `gc` and a resumed sweep find and remove host
processes; a pid whose start time differs is another process and is never signalled. Teardown sends SIGTERM to the
group, waits a grace period, then SIGKILL, until no process of the group is left.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

from sparklab import interrupts
from sparklab.engines import ENGINES
from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ServerError
from sparklab.host.preflight import port_answers, port_in_use
from sparklab.runtimes import keeper
from sparklab.runtimes.base import (
    DETACHED,
    OWNER,
    USER_ID,
    USER_NAME,
    ImageInfo,
    Lifecycle,
    LogListener,
    PullCallback,
    ServerInfo,
    Target,
    only_running,
    user_name,
)
from sparklab.runtimes.owners import owner_alive, owner_token
from sparklab.runtimes.process_logs import follow_log, live_secrets, read_log
from sparklab.runtimes.runfiles import RunRecord, runs_dir, start_time, terminate
from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec, in_session, is_secret_name

log = logging.getLogger(__name__)

KEEPER = Path(keeper.__file__)


def _terminal_signals_ignored() -> None:
    """In a helper: the terminal's Ctrl-C and hangup are sparklab's to answer, with a teardown that needs it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def start_helper(argv: list[str], env: dict[str, str], stderr: IO[bytes]) -> subprocess.Popen[bytes]:
    """A program sparklab talks to through its stdin and stdout, not an engine: the ssh that carries another Docker
    host's API (docker_transport.py). It stays in the terminal's session (ssh may ask there, e.g. to accept a host key)
    but ignores its Ctrl-C and hangup, as docker-py's own shell-out ignores Ctrl-C."""
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                            preexec_fn=_terminal_signals_ignored)


def _text(data: bytes | str | None) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data or ""


_DIGESTS: dict[tuple[str, int, int, int], str] = {}


def program_digest(path: Path) -> str:
    """A host program's identity, as an image's digest is a container's: "sha256:" of the file it runs (for a
    launcher script, the script's own text). Computed once per file version (path, inode, size, mtime)."""
    real = path.resolve()
    st = real.stat()
    key = (str(real), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with real.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = f"sha256:{digest.hexdigest()}"
    return _DIGESTS[key]


# ---------------------------------------------------------------------------------------------------


class Processes:
    """The host-process runtime (a `base.Runtime`), for recipes with `runtime: process`."""

    def __init__(self, server_type: type[ProcessServer] | None = None) -> None:
        # what launch() returns: a ProcessServer, or a subclass (a twin's, sparklab/runtimes/twin.py)
        self.server_type = server_type or ProcessServer

    def for_spec(self, spec: LaunchSpec) -> Processes:
        return self

    def alive(self) -> bool:
        return True  # this machine: it answers as long as sparklab runs

    def host_arch(self) -> str:
        return platform.machine()

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        """A process engine has no image: its program must exist and be executable (a bare name: on PATH)."""
        path = Path(ref if "/" in ref else shutil.which(ref) or ref)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise ServerError(
                f"{ref} is not an executable program on this host",
                "Install the engine where the recipe says (e.g. `python3 -m venv --system-site-packages VENV && "
                "VENV/bin/pip install PACKAGE`), or fix the recipe's venv/entrypoint.")
        # The program's content stands for an image digest: a binary rebuilt between stop and resume is drift.
        return ImageInfo(ref=ref, id="", digest=program_digest(path), architecture=self.host_arch())

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        """Run a short check on this host (a process engine's own parser, sparklab.imagecheck; `image` is the
        engine's program, as ensure_image names it): at most timeout_s, killed after; the environment without
        secrets. Unlike a container's, the network is not cut off."""
        env = {k: v for k, v in os.environ.items() if not is_secret_name(k)} | dict(probe.env)
        started = time.monotonic()
        try:
            done = subprocess.run([probe.program, *probe.args], env=env, capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            return ProbeRun(None, _text(exc.stdout), _text(exc.stderr), time.monotonic() - started, timed_out=True)
        except OSError as exc:
            return ProbeRun(None, "", "", time.monotonic() - started, error=str(exc))
        return ProbeRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    # -- servers -----------------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> ProcessServer:
        """Start the engine in its own process group. On any failure the group is ended before raising."""
        self._clear_stale(spec.name)
        if port_in_use(spec.host, spec.port):
            raise ServerError(f"cannot start {spec.name}: port {spec.port} on {spec.host} is in use",
                                 f"Port {spec.port} is taken: stop what uses it or pass --port N.")
        env = {k: v for k, v in os.environ.items() if not is_secret_name(k)}  # secrets only when named
        env.update(spec.env)
        for name in spec.secret_env:
            value = secrets.get(name) or spec.secret_values.get(name) or os.environ.get(name)
            if value is not None:
                env[name] = value
        api_key = secrets.get("api_key") or None
        argv = [(api_key or "") if a == API_KEY_PLACEHOLDER else a for a in (*spec.entrypoint, *spec.argv)]
        hidden = [v for k, v in env.items() if k in spec.secret_env] + ([api_key] if api_key else [])
        hidden = [v for v in hidden if len(v) >= 4]
        log_path = log_path or runs_dir() / f"{spec.name}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        labels = {**spec.labels, OWNER: owner_token(), DETACHED: "1" if detach else "0",
                  USER_ID: str(os.getuid()), USER_NAME: user_name(), "sparklab.runtime": "process"}
        record = RunRecord(name=spec.name, pid=0, start_time=None, labels=labels,
                           argv=[*spec.entrypoint, *spec.argv], log_path=str(log_path), log_offset=offset,
                           created=datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z"))
        # No secret goes into the run file (HF_TOKEN, a secret -e value, the API key): the keeper gets them on its
        # stdin, and a later `bench` or `logs` reads them from the running engine itself (_live_secrets).
        runs_dir().mkdir(parents=True, exist_ok=True)
        record.forget()
        config = {"argv": argv, "env": env, "secrets": hidden, "log_path": str(log_path),
                  "exit_path": str(record.exit_path), "index_path": str(record.index_path)}
        proc: subprocess.Popen[bytes] | None = None
        server: ProcessServer | None = None
        try:
            with interrupts.deferred():  # a Ctrl-C between the start and the run file would leave it unowned
                with log_path.open("ab") as keeper_errors:  # the keeper's own failure lands in the log too
                    proc = subprocess.Popen([sys.executable, "-u", str(KEEPER)], stdin=subprocess.PIPE,
                                            stdout=subprocess.DEVNULL, stderr=keeper_errors,
                                            start_new_session=True, close_fds=True)
                record.pid, record.start_time = proc.pid, start_time(proc.pid)
                record.save()
                assert proc.stdin is not None
                proc.stdin.write(json.dumps(config).encode())
                proc.stdin.close()
                server = self.server_type(self, record, spec, log_path, proc, detach=detach, on_log=on_log)
        except BaseException as exc:
            if server is not None:
                server.stop(grace_s=2)
            elif proc is not None:
                terminate(record, grace_s=2, proc=proc)
            if isinstance(exc, OSError):
                raise ServerError(f"could not start {spec.name}: {exc}") from None
            raise
        return server

    def _clear_stale(self, name: str) -> None:
        record = self._record(name)
        if record is None:
            return
        if record.alive() and (record.labels.get(DETACHED) == "1" or owner_alive(record.labels.get(OWNER, ""))):
            raise ServerError(f"{name} is already running (pid {record.pid})",
                                 f"Stop it first: sparklab down {name}")
        terminate(record, grace_s=5)

    def _records(self) -> list[RunRecord]:
        folder = runs_dir()
        found = [RunRecord.load(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []
        return [r for r in found if r is not None]

    def _record(self, name: str) -> RunRecord | None:
        return next((r for r in self._records() if r.name == name), None)

    def has(self, name: str) -> bool:
        return self._record(name) is not None

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        infos = [r.info() for r in self._records()]
        return infos if include_stopped else [i for i in infos if i.status == "running"]

    def orphans(self) -> list[ServerInfo]:
        return [r.info() for r in self._orphan_records()]

    def _orphan_records(self) -> list[RunRecord]:
        return [r for r in self._records()
                if r.labels.get(DETACHED) != "1" and not owner_alive(r.labels.get(OWNER, "")) and in_session(r.labels)]

    def gc(self) -> list[ServerInfo]:
        removed = []
        for record in self._orphan_records():
            info = record.info()
            terminate(record, grace_s=5)
            removed.append(info)
        return removed

    def get(self, name: str) -> RunRecord:
        record = self._record(name)
        if record is None:
            raise ServerError(f"no server named {name}", "List them with `sparklab ps`.")
        return record

    def remove(self, name: str, grace_s: float = 10) -> None:
        terminate(self.get(name), grace_s)

    def kill(self, name: str) -> None:
        record = self._record(name)
        if record is not None:
            record.signal(signal.SIGKILL)

    def container_id(self, name: str) -> str | None:
        return None  # no container cgroup: memwatch reads the host's memory

    def mount_sources(self) -> set[str]:
        return set()

    def endpoint_of(self, name: str | None) -> Target:
        record = self.get(name if name is not None else only_running(self.containers(include_stopped=False)))
        if not record.alive():
            raise ServerError(f"{record.name} is not running (exited {record.exit_code()})",
                              "Start it again: sparklab up …")
        kind = record.labels.get("sparklab.kind")
        key = record.api_key or live_secrets(record, kind)[0]  # run files of older sparklab versions held it
        return Target(record.labels.get("sparklab.endpoint", ""), key, record.name,
                      kind if kind in ENGINES else None)

    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        removed = []
        for record in self._records():
            if record.labels.get("sparklab.run_id") == run_id:
                terminate(record, grace_s=5)
                removed.append(record.name)
        return removed

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        record = self.get(name)
        text = read_log(record, since)
        if tail != "all":
            text = b"".join(text.splitlines(keepends=True)[-int(tail):])
        yield text
        if follow:
            yield from follow_log(Path(record.log_path), record.log_offset + len(read_log(record, None)),
                                  record.alive)

    def log_text(self, name: str, since: float | None = None) -> str:
        return b"".join(self.logs(name, since=since)).decode("utf-8", "replace")


class ProcessServer(Lifecycle):
    """A started host-process server (a `base.Server`). As a context manager its group is ended on every path
    unless kept."""

    noun = "process"  # how messages name it ("the server process exited …")

    def __init__(self, runtime: Processes, record: RunRecord, spec: LaunchSpec, log_path: Path,
                 proc: subprocess.Popen[bytes] | None, detach: bool = False,
                 on_log: LogListener | None = None) -> None:
        super().__init__(detach, on_log)
        self.runtime = runtime
        self.record = record
        self.spec = spec
        self.log_path = log_path
        self.proc = proc
        self._stop = threading.Event()
        self._tail: threading.Thread | None = None
        if on_log is not None:
            self._tail = threading.Thread(target=self._pump, name=f"logs-{spec.name}", daemon=True)
            self._tail.start()

    @property
    def name(self) -> str:
        return self.record.name

    def _pump(self) -> None:
        try:
            for data in follow_log(self.log_path, self.record.log_offset, self.record.alive, 0.1, self._stop):
                self._tell(data)
        except OSError as exc:
            log.debug("log tail of %s ended: %s", self.name, exc)

    def state(self) -> tuple[bool, int | None]:
        """(running, exit code once it has exited): the engine's own code, 128 + n for signal n."""
        if self.proc is not None and self.proc.poll() is None:
            return True, None
        if self.proc is None and self.record.alive():
            return True, None
        code = self.record.exit_code()
        if code is None and self.proc is not None and self.proc.returncode is not None:
            rc = self.proc.returncode  # the keeper itself was killed
            code = rc if rc >= 0 else 128 - rc
        return False, code

    def oom_killed(self) -> bool | None:
        return None  # no cgroup of its own to ask; memwatch and the kernel log say more

    def full_log(self) -> str:
        return read_log(self.record).decode("utf-8", "replace")

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.full_log().splitlines()[-lines:])

    def log_since(self, since: float) -> str:
        return read_log(self.record, since).decode("utf-8", "replace")

    def port_open(self, address: str, port: int, timeout_s: int = 5) -> bool:
        """Whether address:port accepts a connection from this machine, whose network the process shares."""
        return port_answers(address, port, timeout_s)

    def kill(self) -> None:
        """SIGKILL the group now (a dead engine's in-flight requests then fail at once); the run is kept."""
        self.record.signal(signal.SIGKILL)

    def _teardown(self, grace_s: float) -> None:
        terminate(self.record, grace_s, self.proc)

    def _stopped(self) -> None:
        self._stop.set()
        if self._tail is not None:
            self._tail.join(timeout=2)
