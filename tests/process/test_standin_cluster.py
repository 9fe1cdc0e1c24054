"""The stand-in's Ray head waits for its placement group as vLLM does (docker/standin/standin_cluster.py): it says so
every 10 s, and a node that joins after the first of those lines is counted.

Seen 2026-12-05 in a CI run (tests/docker/test_pair.py, the worker's host loaded): the worker joined 12 s after the
head began to wait. The head read the membership service through a file object with a 10 s timeout; after the first
timeout that object can no longer read, so it never saw the join, printed its waiting line 3.6 million times in nine
minutes and held the test (and the disk) until killed. Run here as the stand-in runs it: its own module in a host
process, the service on a port of 127.0.0.1, the node joining after the first waiting line."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

from tests.process.conftest import STANDIN

WAITING = "Waiting for creating a placement group (standin, test)"
HEAD = f"""
import sys
sys.path.insert(0, {str(STANDIN)!r})
import standin_cluster
service = standin_cluster.Membership(0, "127.0.0.1")
service.serve()
print("port", service.sock.getsockname()[1], flush=True)
standin_cluster.wait_for_nodes(f"127.0.0.1:{{service.sock.getsockname()[1]}}", 2, 60, {WAITING!r})
print("ready", flush=True)
"""


def test_a_node_that_joins_after_the_first_waiting_line_is_counted() -> None:
    head = subprocess.Popen([sys.executable, "-c", HEAD], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    node = None
    try:
        assert head.stdout is not None
        port = int(head.stdout.readline().split()[1])
        lines: list[str] = []
        while WAITING not in lines:  # the first waiting line, 10 s into the wait
            lines.append(head.stdout.readline().strip())
            assert lines[-1] or head.poll() is None, lines
        node = socket.create_connection(("127.0.0.1", port), timeout=5)
        node.sendall(b"join node-2\n")
        joined = time.monotonic()
        out, _ = head.communicate(timeout=30)
        took = time.monotonic() - joined
        said = lines + out.splitlines()
        assert head.returncode == 0 and said[-1] == "ready", said[-5:]
        assert said.count(WAITING) == 1 and took < 5, (said.count(WAITING), took)
    finally:
        if node is not None:
            node.close()
        if head.poll() is None:
            head.kill()
            head.wait()
