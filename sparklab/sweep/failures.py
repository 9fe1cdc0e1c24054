"""How a server's work fails on record: an unexpected fault contained (its traceback to the run's log, its
containers removed), a fatal engine line while cells ran, the floor watchdog's stop, and the one-line reason and
failure kind each is stored under. Split from sweep/serverrun.py, which runs the work; these only record its end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from sparklab.engines.logwatch import CAUSE_LINES, fatal_error
from sparklab.errors import NotReadyError, PreflightError, SparklabError
from sparklab.host import watchdog
from sparklab.recipes.plan import ServerConfig
from sparklab.runtimes import launch
from sparklab.runtimes.base import HostRuntime
from sparklab.sweep import rundir
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.watch import Watched


class Work(Protocol):
    """What a failure needs of a server's work (sweep.serverrun.ServerRun)."""

    @property
    def server(self) -> ServerConfig: ...
    @property
    def store(self) -> HostStore: ...
    @property
    def runtime(self) -> HostRuntime: ...
    @property
    def run_dir(self) -> Path: ...
    @property
    def say(self) -> Callable[[str], None]: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def watched(self) -> list[Watched]: ...
    @property
    def tripped(self) -> Watched | None: ...


def contain(run: Work, exc: Exception, not_reached: list[str]) -> None:
    """An unexpected fault in one server's work: its traceback goes to the run's log file (not the console),
    its servers are removed (waiting for a restarting Docker daemon), its unfinished cells fail with one line."""
    server, say, faults_at = run.server, run.say, run.run_dir / rundir.LOG_NAME
    reason = one_line(exc)
    rundir.faults.error("server %s (%s): %s", server.label, server.id, reason, exc_info=exc)
    run.store.fail_server_config(server.id, "error", f"{reason} (traceback in {faults_at})",
                                 max_attempts=run.max_attempts, cell_ids=not_reached)
    say(f"server {server.label}: failed (error): {reason}; its unfinished cells go back to the queue; "
        f"details in {faults_at}")
    try:
        for name in run.runtime.remove_run_containers(run.run_dir.name):
            say(f"removed {name} after the fault")
    except Exception as cleanup:  # the daemon stayed away: say so, the next run's gc removes it
        rundir.faults.error("cleanup after the fault failed: %s", one_line(cleanup), exc_info=cleanup)
        say(f"could not remove the server's container ({one_line(cleanup)}); `sparklab gc` removes it later")


def fail_fatal(run: Work, ready: launch.Ready, not_reached: list[str]) -> None:
    """The engine logged a fatal line while cells ran (its server was killed): the server fails as "fatal",
    and its cells, the one in flight too, go back to the queue."""
    assert ready.watch is not None
    error = fatal_error(ready.watch, ready.server.log_tail(CAUSE_LINES), "while cells ran")
    first = error.message.splitlines()[0]
    run.store.fail_server_config(run.server.id, "fatal", f"{first}\n{error.hint}", log_tail=error.log_tail,
                                 max_attempts=run.max_attempts, cell_ids=not_reached)
    run.say(f"server {run.server.label}: failed (fatal): {first}; its unfinished cells go back to the queue")


def fail_at_floor(run: Work, cell_ids: list[str] | None) -> None:
    """The floor watchdog stopped this server: a `memory-floor` failure with the samples; the sweep goes on."""
    hit = run.tripped
    assert hit is not None and hit.sampler is not None and hit.sampler.floor_gib is not None
    message, samples = watchdog.floor_failure(hit.sampler, hit.sampler.floor_gib)
    if len(run.watched) > 1:
        message = f"on {hit.name}: {message}"
    run.store.fail_server_config(run.server.id, "memory-floor", message, log_tail=samples,
                                 max_attempts=run.max_attempts, cell_ids=cell_ids)
    run.say(f"server {run.server.label}: failed (memory-floor): {message}")


def failure_kind(exc: SparklabError) -> str:
    if isinstance(exc, NotReadyError):
        if exc.kind:  # "fatal" (a fatal engine log line) or "stalled" (silent while loading)
            return exc.kind
        if exc.container_exit_code is None:
            return "not_ready"
        return exit_kind(exc.container_exit_code, exc.oom_killed)
    return "preflight" if isinstance(exc, PreflightError) else "container"


def exit_kind(code: int | None, oom_killed: bool | None) -> str:
    """oom only when Docker says the kernel's OOM killer did it; another SIGKILL (docker kill, earlyoom) is killed."""
    if oom_killed:
        return "oom"
    return "killed" if code == 137 else "exited"


def one_line(exc: BaseException) -> str:
    text = exc.message if isinstance(exc, SparklabError) else str(exc)
    first = (text.strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {first}"[:300] if not isinstance(exc, SparklabError) else first[:300]
