"""A blocking call awaited from the bench's event loop without asyncio.run waiting for it at the end."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def in_own_thread(call: Callable[[], T], name: str = "bench-call") -> asyncio.Future[T]:
    """call() in a daemon thread of its own, not the loop's executor (asyncio.to_thread): asyncio.run joins the
    executor's threads when it ends, so a call that hangs there (a host that stopped answering) would hold the cell
    after its answer, or after it was cut short, until the call's own timeout. Awaited and cancelled, the call runs
    on to its own end and its answer is dropped."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def deliver(settle: Callable[[], object]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits for the answer
            loop.call_soon_threadsafe(lambda: None if future.done() else settle())  # done: the wait gave up on it

    def run() -> None:
        try:
            value = call()
        except Exception as exc:  # raised where it is awaited
            error = exc
            deliver(lambda: future.set_exception(error))
        else:
            deliver(lambda: future.set_result(value))

    threading.Thread(target=run, name=name, daemon=True).start()
    return future
