"""The Ctrl-C state a test needs, set by the test itself rather than inherited from whoever started the run.

A background job of a script (`nohup bash scripts/test.sh &`, a CI runner's shell) starts with SIGINT ignored,
and Python keeps an ignored SIGINT ignored: a test that sends itself Ctrl-C would see nothing, and every CLI
it starts would inherit the ignored signal and shrug off the Ctrl-C the test sends it. tests/conftest.py puts
every test in `ctrl_c_raises()`; the CLI helpers (tests/dockerkit.py, tests/process/conftest.py) start their
processes inside it too, so a process started by a module- or session-scoped fixture gets the same state.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None


@contextmanager
def _handled(signum: signal.Signals, handler: Handler) -> Iterator[None]:
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _sigint(handler: Handler) -> AbstractContextManager[None]:
    return _handled(signal.SIGINT, handler)


def ctrl_c_raises() -> AbstractContextManager[None]:
    """Inside the block Ctrl-C raises KeyboardInterrupt, as in a terminal. A process started inside it gets
    SIGINT's default action: exec() resets a caught signal to SIG_DFL (POSIX execve), while an ignored one
    would stay ignored; a Python child then turns it into KeyboardInterrupt."""
    return _sigint(signal.default_int_handler)


def ctrl_c_ignored() -> AbstractContextManager[None]:
    """Inside the block SIGINT is ignored, and so it is in a process started there: how a script's background
    job starts (for a test of sparklab run that way)."""
    return _sigint(signal.SIG_IGN)


def hangup_ends() -> AbstractContextManager[None]:
    """Inside the block SIGHUP has its default action, as in a terminal session, however this run was started (under
    `nohup` it would be ignored, and so in every process started here)."""
    return _handled(signal.SIGHUP, signal.SIG_DFL)


def hangup_ignored() -> AbstractContextManager[None]:
    """Inside the block SIGHUP is ignored, and so it is in a process started there: how `nohup` starts one."""
    return _handled(signal.SIGHUP, signal.SIG_IGN)


def stop_as_in_a_terminal() -> None:
    """For the whole pytest run (tests/conftest.py's pytest_configure, in every xdist worker too): Ctrl-C raises
    KeyboardInterrupt wherever it lands, in a module fixture starting a server as in a test, however the run was
    started, and SIGTERM does the same, so a run stopped early (scripts/ci/lanes.sh's stop_tests, a CI runner
    cancelling) unwinds through every teardown instead of leaving its containers and processes behind. Each test
    still sets its own state (ctrl_c_raises, ctrl_c_ignored) on top."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by {signal.Signals(signum).name}")
