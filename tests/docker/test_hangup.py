"""A dropped terminal or ssh with the stand-in engine in a container (issue 27, item 5): SIGHUP tears a foreground
`up` down as SIGTERM does, and a sweep whose terminal goes away removes its container, leaves the cell in flight
pending and resumes. Before: sparklab died of the hangup (exit 129) and the container served on."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.docker.test_sweep_standin import _run, _store, _sweep, ulimit_flags
from tests.dockerkit import Cli, Lines, free_port, port_containers, run_containers
from tests.signals import hangup_ends
from tests.terminals import Session

pytestmark = pytest.mark.docker


def test_a_hangup_stops_a_foreground_up_and_removes_its_container(cli: Cli, docker_client) -> None:
    port = free_port()
    with hangup_ends():
        proc = cli.popen("up", "none", *cli.launch_args(port))
    lines = Lines(proc)
    try:
        lines.wait_for("serving in the foreground", timeout=90)
        assert len(port_containers(docker_client, port)) == 1
        began = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(timeout=15)
        seconds = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stderr.read() if proc.stderr else ""
    assert seconds < 15
    assert port_containers(docker_client, port) == []


def test_a_sweep_whose_terminal_closes_removes_its_container_and_resumes(cli: Cli, tmp_path: Path,
                                                                          docker_client) -> None:
    path = _sweep(tmp_path, cli.image, methods=["none"], concurrency=[1, 2])
    doc = yaml.safe_load(path.read_text())
    doc["set"].append("engines.vllm.env={STANDIN_TOKEN_DELAY: '0.08'}")  # the first cell takes a few seconds
    path.write_text(yaml.safe_dump(doc))
    session = Session([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(tmp_path / "runs"),
                       *ulimit_flags()], cli.env(), cwd=tmp_path)
    try:
        session.wait_for("ready in", timeout=120)
        session.hang_up()
        code = session.proc.wait(timeout=60)
    finally:
        session.close()
    assert code == 130
    left = run_containers(docker_client, tmp_path / "runs")
    assert not left, [c.name for c in left]
    with _store(path) as store:
        assert store.counts()["running"] == 0 and store.counts()["done"] < 2
    resumed = _run(cli, path)
    assert resumed.returncode == 0, resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 2
