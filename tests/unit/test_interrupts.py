"""Ctrl-C held over a start and ignored over a teardown (sparklab/interrupts.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest

from sparklab import interrupts
from tests.signals import hangup_ends, hangup_ignored


def test_a_ctrl_c_inside_a_deferred_block_is_raised_once_the_block_has_finished() -> None:
    steps: list[str] = []
    with pytest.raises(KeyboardInterrupt), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        steps.append("after the signal")  # the block is not cut in half
    assert steps == ["after the signal"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigterm_is_held_too_and_the_previous_handler_comes_back() -> None:
    def mine(signum: int, frame: object) -> None:
        raise AssertionError("must not run inside the block")

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_error_in_the_block_wins_over_a_held_signal() -> None:
    with pytest.raises(ValueError), interrupts.deferred():
        os.kill(os.getpid(), signal.SIGINT)
        raise ValueError("the start failed")


def test_no_signal_no_interrupt() -> None:
    with interrupts.deferred():
        pass


def test_a_shielded_block_drops_ctrl_c() -> None:
    with interrupts.shielded():
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_off_the_main_thread_both_do_nothing() -> None:
    seen: list[BaseException] = []

    def work() -> None:
        try:
            with interrupts.deferred(), interrupts.shielded():
                pass
        except BaseException as exc:
            seen.append(exc)

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == []


def test_a_ctrl_c_the_process_was_started_ignoring_stays_ignored_in_a_deferred_block() -> None:
    """An overnight script's background job starts with SIGINT ignored (the terminal's Ctrl-C is not for it):
    a start must not turn that SIGINT into an interrupt. SIGTERM, the way to stop such a run, is still held."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        try:
            with interrupts.deferred():
                os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pytest.fail("an ignored SIGINT interrupted the deferred block")
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        with pytest.raises(KeyboardInterrupt), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def _as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def test_a_hangup_is_held_over_a_start_and_dropped_over_a_teardown() -> None:
    """Issue 27, item 5: a dropped terminal or ssh (SIGHUP) gets what SIGTERM gets. Before: a hangup inside a start
    ended the process at once (SIGHUP's default action), with the engine made and no handle on it."""
    previous = signal.signal(signal.SIGHUP, _as_interrupt)  # as the command line sets it
    try:
        steps: list[str] = []
        with pytest.raises(KeyboardInterrupt), interrupts.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
            steps.append("after the hangup")
        assert steps == ["after the hangup"]
        with interrupts.shielded():
            os.kill(os.getpid(), signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) is _as_interrupt
    finally:
        signal.signal(signal.SIGHUP, previous)


def test_a_hangup_the_process_was_started_ignoring_stays_ignored() -> None:
    """`nohup sparklab sweep … &` starts with SIGHUP ignored: the closing terminal is not for it."""
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGHUP)
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)


@pytest.mark.parametrize("nohup", [False, True], ids=["terminal", "nohup"])
def test_the_command_line_takes_a_hangup_as_sigterm_unless_started_ignoring_it(nohup: bool, tmp_path: Any) -> None:
    """What `sparklab` sets before any command runs (sparklab.cli.main), checked in a fresh interpreter started with
    SIGHUP at its default or ignored."""
    code = ("import signal, sys\n"
            "from sparklab.cli import main\n"
            "sys.argv = ['sparklab', 'recipes']\n"
            "main.main(['recipes'])\n"
            "h = signal.getsignal(signal.SIGHUP)\n"
            "print('ignored' if h is signal.SIG_IGN else 'interrupt' if h is signal.getsignal(signal.SIGTERM) "
            "else repr(h))\n")
    with hangup_ignored() if nohup else hangup_ends():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == ("ignored" if nohup else "interrupt")
