"""Ctrl-C, SIGTERM and SIGHUP around the few steps that must not be cut in half.

`up` and `sweep` turn all three into KeyboardInterrupt (a hangup: the terminal or ssh session that started them
went away, and the engine must not be left holding the machine's memory). Two kinds of step need care: a start,
where the daemon (or the kernel) has made the engine but sparklab does not hold its handle yet, and a teardown,
which a second Ctrl-C must not cut short. Signal handlers can only be set from the main thread; elsewhere these
are no-ops (the main thread gets the signal anyway).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def _handled_by(handler: signal.Handlers | Callable[[int, FrameType | None], None]) -> Iterator[None]:
    """The signals go to `handler` inside the block; the previous handlers come back after it.

    A signal the process ignores stays ignored: a script's background job (an overnight sweep) starts with
    SIGINT ignored so that the terminal's Ctrl-C is not for it, and is stopped with SIGTERM instead; one started
    under `nohup` has SIGHUP ignored, so that a closing terminal is not for it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watched = [s for s in _SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    previous = [signal.signal(s, handler) for s in watched]
    try:
        yield
    finally:
        for s, old in zip(watched, previous, strict=True):
            signal.signal(s, old)


def shielded() -> AbstractContextManager[None]:
    """Ignore Ctrl-C, SIGTERM and SIGHUP inside the block: for a teardown that is itself the answer to one."""
    return _handled_by(signal.SIG_IGN)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block has ended, then raise KeyboardInterrupt once.

    For a start: the caller wraps the block so that, when this raises, it tears down what the block made.
    An error raised inside the block wins over a held signal (the caller cleans up either way)."""
    held: list[int] = []
    with _handled_by(lambda signum, frame: held.append(signum)):
        yield
    if held:
        raise KeyboardInterrupt
