"""Readiness: poll the engine's endpoint until it answers, failing at once when the container exits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential

from sparklab import engine_api
from sparklab.engines import engine
from sparklab.errors import NotReadyError
from sparklab.scrape import exit_code_meaning

LOG_TAIL_LINES = 50


class Probe(Protocol):
    """What the wait needs from a server: its state and its log tail (Server implements it)."""

    def state(self) -> tuple[bool, int | None]: ...

    def log_tail(self, lines: int = 50) -> str: ...


class _NotYet(Exception):
    """The endpoint does not answer yet; try again."""


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.rstrip().splitlines())


def wait_ready(probe: Probe, url: str, *, kind: str, timeout_s: float, headers: dict[str, str] | None = None,
               max_interval_s: float = 1.0, on_try: Callable[[float], None] | None = None,
               clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> float:
    """Poll `url` until it answers 200, within a monotonic deadline. Returns seconds waited.

    Every try first checks that the container still runs; if it exited, fail at once with its exit code
    and the last log lines. A 401/403 also fails at once: something answers, but not with our key.
    """
    started = clock()
    deadline = started + timeout_s

    def attempt() -> None:
        running, code = probe.state()
        if not running:
            tail = probe.log_tail(LOG_TAIL_LINES)
            why = engine(kind).explain_failure(tail)
            oom = probe.oom_killed() if hasattr(probe, "oom_killed") else None  # read by Server; fakes may not
            raise NotReadyError(
                f"the server container exited with code {code}{exit_code_meaning(code, oom, tail)} before it was ready "
                f"({clock() - started:.0f} s after start). Last {LOG_TAIL_LINES} log lines:\n{_indent(tail)}",
                f"Likely cause: {why}" if why else None, exit_code=code, log_tail=tail, oom_killed=oom)
        if on_try is not None:
            on_try(clock() - started)
        try:
            status = engine_api.probe(url, headers)
        except engine_api.Unreachable as exc:
            raise _NotYet(str(exc)) from None
        if status in (401, 403):
            raise NotReadyError(
                f"{url} answered {status}: the server rejects sparklab's API key",
                "Another server may own this port: check `sparklab ps` and `docker ps`.")
        if status != 200:
            raise _NotYet(f"HTTP {status}")

    def stop(state: RetryCallState) -> bool:
        return clock() >= deadline

    def give_up(state: RetryCallState) -> None:
        tail = probe.log_tail(LOG_TAIL_LINES)
        raise NotReadyError(
            f"not ready after {timeout_s:.0f} s: {url} never answered 200 while the container kept running. "
            f"Last {LOG_TAIL_LINES} log lines:\n{_indent(tail)}",
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
