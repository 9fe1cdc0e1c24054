"""Readiness: poll the engine's endpoint until it answers, failing at once when the container exits, when the
engine logs a fatal line in a container that runs on, or (if asked) when it goes silent while loading."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from sparklab.engines import api, engine
from sparklab.engines.logwatch import CAUSE_LINES, FATAL_GRACE_S, LogWatch, fatal_error, indent, stalled_error
from sparklab.engines.scrape import exit_code_meaning
from sparklab.errors import NotReadyError

LOG_TAIL_LINES = 50


class Probe(Protocol):
    """What the wait needs from a server: its state and its log tail (Server implements it)."""

    def state(self) -> tuple[bool, int | None]: ...

    def log_tail(self, lines: int = 50) -> str: ...


class _NotYet(Exception):
    """The endpoint does not answer yet; try again."""


def exited_error(probe: Probe, kind: str, code: int | None, subject: str, when: str) -> NotReadyError:
    """A server whose container exited: the code and what it means (Docker's OOMKilled where the probe can read
    it), the log tail, and the engine's known cause."""
    tail = probe.log_tail(LOG_TAIL_LINES)
    why = engine(kind).explain_failure(tail)
    oom = probe.oom_killed() if hasattr(probe, "oom_killed") else None  # read by Server; fakes may not
    return NotReadyError(
        f"{subject} exited with code {code}{exit_code_meaning(code, oom, tail)} {when}. Last {LOG_TAIL_LINES} log "
        f"lines:\n{indent(tail)}", f"Likely cause: {why}" if why else None, exit_code=code, log_tail=tail,
        oom_killed=oom)


def wait_ready(probe: Probe, url: str, *, kind: str, timeout_s: float, headers: dict[str, str] | None = None,
               max_interval_s: float = 1.0, on_try: Callable[[float], None] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
               watch: LogWatch | None = None, stall_s: float | None = None) -> float:
    """Poll `url` until it answers 200, within a monotonic deadline. Returns seconds waited.

    Every try first checks that the container still runs; if it exited, fail at once with its exit code
    and the last log lines. A 401/403 also fails at once: something answers, but not with our key.
    With a `watch` on the engine's log, a fatal line fails the wait (FATAL_GRACE_S later, so the tail holds
    the traceback) unless the container exits meanwhile, and with `stall_s` so does a log that stays silent
    that long while the engine is not ready, outside a phase its adapter says is silent by nature
    (Engine.quiet_phases: Edge-LLM's TensorRT build), which the deadline alone bounds.
    """
    started = clock()
    deadline = started + timeout_s
    pulse = [watch.output if watch else 0, started]  # (output seen, when it last grew)

    def attempt() -> None:
        running, code = probe.state()
        if running and watch is not None and watch.fatal is not None:
            sleep(FATAL_GRACE_S)  # the rest of its traceback comes meanwhile, or the container exits
            running, code = probe.state()
            if running:
                raise fatal_error(watch, probe.log_tail(CAUSE_LINES),
                                  f"{clock() - started:.0f} s after start, before it was ready")
        if not running:
            logged = f" after logging: {watch.fatal}" if watch and watch.fatal else ""
            raise exited_error(probe, kind, code, f"the server {getattr(probe, 'noun', 'container')}",
                               f"before it was ready ({clock() - started:.0f} s after start){logged}")
        if on_try is not None:
            on_try(clock() - started)
        try:
            status = api.probe(url, headers)
        except api.Unreachable as exc:
            check_stall()
            raise _NotYet(str(exc)) from None
        if status in (401, 403):
            raise NotReadyError(
                f"{url} answered {status}: the server rejects sparklab's API key",
                "Another server may own this port: check `sparklab ps` and `docker ps`.")
        if status != 200:
            check_stall()
            raise _NotYet(f"HTTP {status}")

    def check_stall() -> None:
        if watch is None:
            return
        now = clock()
        if watch.output != pulse[0]:
            pulse[:] = [watch.output, now]
        elif stall_s and now - pulse[1] >= stall_s and watch.quiet is None:  # a quiet phase: the deadline only
            raise stalled_error(stall_s, now - started, probe.log_tail(LOG_TAIL_LINES))

    def stop(state: RetryCallState) -> bool:
        return clock() >= deadline

    def give_up(state: RetryCallState) -> None:
        tail = probe.log_tail(LOG_TAIL_LINES)
        raise NotReadyError(
            f"not ready after {timeout_s:.0f} s: {url} never answered 200 while the container kept running. "
            f"Last {LOG_TAIL_LINES} log lines:\n{indent(tail)}",
            "Raise the deadline with --ready-timeout SECONDS (a cold GB10 load can take 15-30 min).",
            log_tail=tail)

    retrying = Retrying(
        retry=retry_if_exception_type(_NotYet),
        wait=wait_exponential(multiplier=0.25, min=0.25, max=max_interval_s),
        stop=stop,
        retry_error_callback=give_up,
        sleep=lambda seconds: sleep(max(0.0, min(seconds, deadline - clock()))),
        reraise=True,
    )
    retrying(attempt)
    return clock() - started
