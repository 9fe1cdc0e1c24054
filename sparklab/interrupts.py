"""Ctrl-C and SIGTERM around the few steps that must not be cut in half.

`up` and `sweep` turn both signals into KeyboardInterrupt. Two kinds of step need care: a start, where the
daemon (or the kernel) has made the engine but sparklab does not hold its handle yet, and a teardown, which a
second Ctrl-C must not cut short. Signal handlers can only be set from the main thread; elsewhere these are
no-ops (the main thread gets the signal anyway).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextmanager
def shielded() -> Iterator[None]:
    """Ignore Ctrl-C and SIGTERM inside the block: for a teardown that is itself the answer to one."""
    if not _main_thread():
        yield
        return
    previous = [signal.signal(s, signal.SIG_IGN) for s in _SIGNALS]
    try:
        yield
    finally:
        for s, handler in zip(_SIGNALS, previous, strict=True):
            signal.signal(s, handler)


@contextmanager
def deferred() -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block has ended, then raise KeyboardInterrupt once.

    For a start: the caller wraps the block so that, when this raises, it tears down what the block made.
    An error raised inside the block wins over a held signal (the caller cleans up either way)."""
    if not _main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = [signal.signal(s, hold) for s in _SIGNALS]
    try:
        yield
    finally:
        for s, handler in zip(_SIGNALS, previous, strict=True):
            signal.signal(s, handler)
    if held:
        raise KeyboardInterrupt
