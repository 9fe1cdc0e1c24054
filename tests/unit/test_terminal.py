"""The consoles outlive their readers (issue 27, item 5): a closed pipe (EPIPE) or a hung-up terminal (EIO) under
stdout or stderr makes the console quiet, never ends the command."""

from __future__ import annotations

import contextlib
import os
import pty
import stat
import sys
from typing import Any

import pytest
from rich.console import Console

from sparklab.cli import terminal


def _is_devnull(fd: int) -> bool:
    here, null = os.fstat(fd), os.stat(os.devnull)
    return stat.S_ISCHR(here.st_mode) and here.st_rdev == null.st_rdev


@pytest.fixture
def stderr_to(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point sys.stderr at a writable descriptor the test made (opened here, closed after)."""
    opened: list[Any] = []

    def point(fd: int) -> Any:
        stream = open(fd, "w", buffering=1, closefd=True)  # noqa: SIM115 - closed after the test
        opened.append(stream)
        monkeypatch.setattr(sys, "stderr", stream)
        return stream

    yield point
    for console in (terminal.out, terminal.err):  # the consoles are the command line's: whole again for others
        if isinstance(console.file, terminal.Stream):
            console.file.gone = False
    for stream in opened:
        with contextlib.suppress(OSError):
            stream.close()


def test_a_closed_pipe_makes_the_console_quiet_and_the_command_goes_on(stderr_to: Any) -> None:
    """Before: rich turned the BrokenPipeError into SystemExit(1) (Console.on_broken_pipe), ending a sweep at its
    next line."""
    read, write = os.pipe()
    stderr_to(write)
    terminal.err.print("seen")
    assert os.read(read, 100) == b"seen\n"
    os.close(read)  # the reader goes away
    for i in range(3):
        terminal.err.print(f"line {i} after the reader left")  # no BrokenPipeError, no SystemExit
    assert _is_devnull(write)  # what is still buffered, and Python's own flush at exit, go to /dev/null


def test_a_hung_up_terminal_makes_the_console_quiet(stderr_to: Any) -> None:
    """A terminal whose other side closed (the ssh connection dropped) fails every write with EIO."""
    master, slave = pty.openpty()
    stderr_to(slave)
    terminal.err.print("seen")
    os.close(master)
    terminal.err.print("after the hangup")
    terminal.err.print("and again")
    assert _is_devnull(slave)


def test_another_write_error_is_not_hidden(stderr_to: Any) -> None:
    """Only a reader that went away makes it quiet: any other failure (here ENOSPC, /dev/full) is an error as
    before."""
    stderr_to(os.open("/dev/full", os.O_WRONLY))
    console = Console(file=terminal.Stream("stderr"))  # type: ignore[arg-type]  # a console of its own: rich keeps
    with pytest.raises(OSError):  # what it failed to write, which the command line's consoles must not print later
        console.print("x")


def test_the_consoles_write_where_sys_stdout_and_stderr_point_now(capsys: pytest.CaptureFixture[str]) -> None:
    terminal.out.print("to stdout")
    terminal.err.print("to stderr")
    captured = capsys.readouterr()
    assert captured.out == "to stdout\n" and captured.err == "to stderr\n"
