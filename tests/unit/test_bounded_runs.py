"""tests.dockerkit.run_bounded: a CLI that outlives its test's timeout is stopped the way a user stops it (SIGTERM:
sparklab takes its servers down) before it is killed, so a timed-out engine test leaves no container behind."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from tests import dockerkit

# A stand-in for the CLI: it prints that it started, and on SIGTERM prints that it stopped its servers and exits.
POLITE = """
import signal, sys, time
def stop(*_):
    print("servers taken down", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("started", flush=True)
time.sleep(60)
"""
STUBBORN = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('started', flush=True); time.sleep(60)"


def test_a_command_past_its_timeout_is_asked_to_stop_before_it_is_killed() -> None:
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        dockerkit.run_bounded([sys.executable, "-c", POLITE], timeout=1.0)
    assert "started" in caught.value.stdout and "servers taken down" in caught.value.stdout, caught.value.stdout
    assert time.monotonic() - started < 10


def test_one_that_ignores_sigterm_is_killed_after_the_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dockerkit, "STOP_GRACE_S", 0.5)
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        dockerkit.run_bounded([sys.executable, "-c", STUBBORN], timeout=1.0)
    assert "started" in caught.value.stdout
    assert time.monotonic() - started < 10


def test_a_command_within_its_timeout_is_as_subprocess_run_gives_it() -> None:
    done = dockerkit.run_bounded([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); "
                                  "sys.exit(3)"], timeout=30)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
