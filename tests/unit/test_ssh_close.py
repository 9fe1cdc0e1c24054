"""Closing a connection to a Docker host whose ssh already ended (its daemon stopped: `docker system dial-stdio`
exits, and ssh with it). docker-py 7.2.0's SSHSocket.close (docker/transport/sshconn.py:90-95) writes two newlines
to ssh's stdin and flushes them: BrokenPipeError. urllib3 closes its pools' connections from a weakref finalizer
at interpreter exit, so every `sparklab sweep` that lost an ssh host printed that traceback on the console after its
closing lines (seen 2026-12-05 in tests/docker/test_pair.py's lost worker host, twice, once per connection)."""

from __future__ import annotations

import subprocess
import sys

from sparklab.runtimes.docker_transport import _SSHSocket


def _ended_ssh() -> _SSHSocket:
    sock = _SSHSocket("nobody@127.0.0.1:1")  # as docker-py hands it the host
    sock.proc = subprocess.Popen([sys.executable, "-c", "pass"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    sock.proc.wait()  # the ssh is gone; its stdin's reader with it
    return sock


def test_closing_a_connection_whose_ssh_ended_raises_nothing() -> None:
    sock = _ended_ssh()
    sock.close()
    assert sock.proc is not None and sock.proc.stdin is not None and sock.proc.stdin.closed
    sock.close()  # again: nothing to do


def test_no_traceback_at_exit_when_a_pools_finalizer_closes_it() -> None:
    program = ("import weakref\n"
               "from tests.unit.test_ssh_close import _ended_ssh\n"
               "sock = _ended_ssh()\n"
               "keeper = type('Pool', (), {})()\n"
               "weakref.finalize(keeper, sock.close)  # urllib3's pool: its connections closed at exit\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
