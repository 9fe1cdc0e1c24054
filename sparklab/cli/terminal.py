"""The two consoles every command prints through: `out` (stdout) for results, `err` (stderr) for progress,
warnings and errors, so a command's result can be piped while its progress stays on the terminal.

Either may lose its reader while a command runs: a terminal that hangs up (an ssh connection dropping: every
write then fails with EIO), a pipe whose reader went away (`| tee` killed, a log shipper gone: EPIPE). Neither
may end the command, least of all a sweep in the middle of the night or the teardown that answers the hangup:
the console goes quiet instead (a sweep's events are in its run's log as well).
"""

from __future__ import annotations

import errno
import os
import sys
from typing import Any

from rich.console import Console

# A write that fails with one of these means the reader is gone for good (EBADF: the descriptor was closed).
_READER_GONE = (errno.EPIPE, errno.EIO, errno.EBADF, errno.ENXIO)


class Stream:
    """sys.stdout or sys.stderr, looked up at each write (a test's capture, rich's own redirection while a status
    line shows), that outlives its reader: once a write fails because the reader is gone, its descriptor is pointed
    at /dev/null (so what is still buffered, and Python's own flush at exit, go there) and the rest is dropped."""

    def __init__(self, name: str) -> None:
        self._name = name
        self.gone = False

    @property
    def _target(self) -> Any:
        stream = getattr(sys, self._name)
        return getattr(stream, "rich_proxied_file", stream)  # rich's redirection writes back to its console

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return int(self._target.write(text))
            except OSError as exc:
                self._lost(exc)
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._target.flush()
            except OSError as exc:
                self._lost(exc)

    def _lost(self, exc: OSError) -> None:
        if exc.errno not in _READER_GONE:
            raise exc
        self.gone = True
        try:
            fd = self._target.fileno()
            devnull = os.open(os.devnull, os.O_WRONLY)
        except (OSError, ValueError):  # not a real descriptor (a test's capture): dropping is enough
            return
        os.dup2(devnull, fd)
        os.close(devnull)

    def isatty(self) -> bool:
        return not self.gone and bool(self._target.isatty())

    def __getattr__(self, name: str) -> Any:  # encoding, fileno, …: the stream's own
        return getattr(self._target, name)


# Piped output keeps whole lines (rich would wrap tables at 80 columns) so it can be grepped.
PIPED_WIDTH = 200
_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else PIPED_WIDTH


def _console(name: str) -> Console:
    # a Stream is an IO[str] by duck typing (write, flush, isatty; the rest forwarded), which rich's hints cannot see
    return Console(file=Stream(name), highlight=False, soft_wrap=True, width=_WIDTH)  # type: ignore[arg-type]


out = _console("stdout")
err = _console("stderr")
