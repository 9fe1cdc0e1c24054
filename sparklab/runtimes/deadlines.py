"""Bounded waits on other machines: every check of a Docker host ends in seconds, and several hosts are checked side
by side, so a host that does not answer (powered off, firewalled, its daemon hung) is left out with one line while
the others start, and a host that dies mid-sweep costs seconds, not the night.

Two layers bound them. The ssh binary that carries every request to an `ssh://` host gets options that end a
connection which does not come up (`ConnectTimeout`, which covers the banner exchange too: a port that accepts and
never speaks) or goes silent (`ServerAliveInterval` x `ServerAliveCountMax`); `BatchMode` makes a host that would
ask for a password fail at once, as it must in a sweep (every request is its own ssh connection, docker-py's
shell-out, so a prompt could never be answered). And each check runs in a thread of its own with a deadline, which
also bounds what ssh cannot see: a daemon that accepts the request and never answers.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K")

SSH_CONNECT_S = 10  # ssh's ConnectTimeout: the TCP connect and the server's banner (OpenSSH 9.2 ssh_config(5))
SSH_ALIVE_INTERVAL_S = 5  # a keepalive through the encrypted channel after this long without data…
SSH_ALIVE_COUNT = 3  # …and the connection ends after this many go unanswered: a silent peer costs 15 s
SSH_OPTIONS = ("-o", f"ConnectTimeout={SSH_CONNECT_S}", "-o", f"ServerAliveInterval={SSH_ALIVE_INTERVAL_S}",
               "-o", f"ServerAliveCountMax={SSH_ALIVE_COUNT}", "-o", "BatchMode=yes")

HOST_CHECK_S = 20.0  # reaching a host: ssh, the daemon's version and its facts (docker info), all together
ALIVE_S = 10.0  # one liveness ping of a host's daemon while a sweep runs


class NoAnswer(Exception):
    """The call did not end within its deadline (its thread is left to end by itself)."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer within {seconds:g} s")
        self.seconds = seconds


def no_answer(url: str, seconds: float) -> str:
    """The one line that says a host did not answer in time, and how to see why."""
    return f"no answer within {seconds:g} s; check `docker -H {url} info`"


class _Outcome(Generic[T]):
    """What a call in a thread came to: its value, the exception it raised, or nothing yet."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def result(self, seconds: float) -> T:
        if not self.done.is_set():
            raise NoAnswer(seconds)
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]  # set with done


def _start(call: Callable[[], T], name: str) -> _Outcome[T]:
    outcome: _Outcome[T] = _Outcome()

    def run() -> None:
        try:
            outcome.value = call()
        except BaseException as exc:  # handed to the caller's thread, which re-raises it
            outcome.error = exc
        finally:
            outcome.done.set()

    # A daemon thread: one stuck on a dead host must not keep the process alive at exit (an executor's would).
    threading.Thread(target=run, name=name, daemon=True).start()
    return outcome


def within(seconds: float, call: Callable[[], T], name: str = "bounded") -> T:
    """call()'s value, or its exception, if it ends within `seconds`; else NoAnswer."""
    outcome = _start(call, name)
    outcome.done.wait(seconds)
    return outcome.result(seconds)


def each_within(seconds: float, calls: Mapping[K, Callable[[], T]],
                clock: Callable[[], float] = time.monotonic) -> dict[K, T | BaseException]:
    """Every call at once, each in its own thread; `seconds` in all. Each key gets its call's value, the exception it
    raised, or NoAnswer (it had not ended by the deadline)."""
    deadline = clock() + seconds
    running = {key: _start(call, f"check-{key}") for key, call in calls.items()}
    found: dict[K, T | BaseException] = {}
    for key, outcome in running.items():
        outcome.done.wait(max(0.0, deadline - clock()))
        try:
            found[key] = outcome.result(seconds)
        except BaseException as exc:  # the call's own error, or NoAnswer: the caller says which host and why
            found[key] = exc
    return found
