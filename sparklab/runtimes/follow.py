"""Watching a running sparklab server this command did not start (`sparklab bench --container`), as a sweep watches
the servers it starts: its log through its engine's fatal lines (engines.logwatch), and whether it still runs.

An engine can die while its API server runs on: vLLM's keeps answering /v1/models after its engine core failed,
and chat requests then hang (until a request's stall detector gives up, a minute each). The log says so at once.
A `ServerWatch` reads the server's whole log so far and then follows it in a thread; `problem()` is the error to
end with once its engine logged a fatal line (FATAL_GRACE_S later, so the tail holds the traceback) or it exited.
It never stops the server: that is its owner's to do.
"""

from __future__ import annotations

import logging
import threading

from sparklab.engines import engine
from sparklab.engines.logwatch import CAUSE_LINES, FATAL_GRACE_S, LogWatch, fatal_error
from sparklab.errors import ServerError, SparklabError
from sparklab.runtimes.base import Runtime, Target
from sparklab.runtimes.health import exited_error

log = logging.getLogger(__name__)


class _Probe:
    """What health.exited_error reads of a server, for one known by name only."""

    noun = "server"

    def __init__(self, runtime: Runtime, name: str) -> None:
        self.runtime, self.name = runtime, name

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(self.runtime.log_text(self.name).splitlines()[-lines:])

    def state(self) -> tuple[bool, int | None]:
        found = [s for s in self.runtime.containers() if s.name == self.name]
        if not found:
            return False, None
        return found[0].status in ("running", "restarting", "paused"), found[0].exit_code


class ServerWatch:
    """A running server's log and state, followed in a thread while `what` ("bench") works against it."""

    def __init__(self, runtime: Runtime, target: Target, what: str) -> None:
        self._probe = _Probe(runtime, target.name)
        self._what = what
        self._problem: SparklabError | None = None
        self._lock = threading.Lock()
        self.watch = LogWatch(engine(target.kind)) if target.kind else None  # older containers: state only
        if self.watch is not None:
            self.watch.on_fatal(self._fatal, FATAL_GRACE_S)
        self._thread = threading.Thread(target=self._follow, args=(runtime, target.name),
                                        name=f"watch-{target.name}", daemon=True)
        self._thread.start()

    def problem(self) -> SparklabError | None:
        """Why the work must end now (the engine died, the server exited), or None."""
        with self._lock:
            return self._problem

    def _set(self, problem: SparklabError) -> None:
        with self._lock:
            self._problem = self._problem or problem

    def _fatal(self) -> None:
        assert self.watch is not None
        try:
            tail = self._probe.log_tail(CAUSE_LINES)
        except SparklabError:
            tail = ""
        self._set(fatal_error(self.watch, tail, f"while {self._what} ran"))

    def _follow(self, runtime: Runtime, name: str) -> None:
        """Feed the log to the watch until the stream ends, which it does when the server does."""
        try:
            for chunk in runtime.logs(name, follow=True):
                if self.watch is not None:
                    self.watch.feed(chunk)
        except Exception as exc:  # the daemon or the log file went away: the state check below says what it means
            log.debug("following %s: %s", name, exc)
        try:
            running, code = self._probe.state()
        except Exception as exc:
            log.debug("state of %s: %s", name, exc)
            return
        if running or (self.watch is not None and self.watch.fatal is not None):  # a fatal line says more
            return
        if self.watch is None:
            self._set(ServerError(f"the server {name} exited with code {code} while {self._what} ran"))
        else:
            self._set(exited_error(self._probe, self.watch.adapter.kind, code, f"the server {name}",
                                   f"while {self._what} ran"))
