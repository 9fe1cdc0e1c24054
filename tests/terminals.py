"""A terminal session for a CLI, as ssh gives one: the CLI leads a session of its own whose controlling terminal is a
pseudo-terminal, and the test holds the other side. Closing that side is the connection dropping: the kernel hangs
the terminal up (SIGHUP to the session's leader) and every later write to it fails (EIO).

The CLI starts with SIGHUP's default action and Ctrl-C raising, however the test run itself was started."""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import subprocess
import termios
import time
from pathlib import Path

from tests.signals import ctrl_c_raises, hangup_ends


def _take_the_terminal() -> None:
    """In the child, after setsid: the terminal on fd 0 becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Session:
    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None) -> None:
        self.master, slave = os.openpty()
        try:
            with hangup_ends(), ctrl_c_raises():
                self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd,
                                             start_new_session=True, preexec_fn=_take_the_terminal)
        finally:
            os.close(slave)
        self.text = ""
        self._open = True

    def wait_for(self, text: str, timeout: float = 60) -> None:
        """Read what the CLI printed until `text` appears (a spinner's redraws included)."""
        deadline = time.monotonic() + timeout
        while text not in self.text:
            left = deadline - time.monotonic()
            if left <= 0 or (self.proc.poll() is not None and not select.select([self.master], [], [], 0)[0]):
                raise AssertionError(f"never saw {text!r}; the terminal so far:\n{self.text[-4000:]}")
            if select.select([self.master], [], [], min(left, 0.2))[0]:
                try:
                    self.text += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the child closed its side
                    break
        if text not in self.text:
            raise AssertionError(f"never saw {text!r}; the terminal so far:\n{self.text[-4000:]}")

    def hang_up(self) -> None:
        """The connection drops: the terminal's other side closes."""
        if self._open:
            os.close(self.master)
            self._open = False

    def close(self) -> None:
        self.hang_up()
        if self.proc.poll() is None:
            self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
