"""Ctrl-C held over a start and ignored over a teardown (sparklab/interrupts.py)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from sparklab import interrupts


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
