"""A dropped terminal or ssh (issue 27, item 5), with the stand-in engine as a host process: SIGHUP tears a
foreground `up` or `sweep` down as SIGTERM does (the engine's process group ends, the cell in flight goes back
to pending), a run started under `nohup` keeps running through a hangup, a terminal that goes away mid-run
(its writes then fail) changes nothing about the teardown, and a sweep whose stderr pipe closes goes on,
its events in the run's log.

After each test no stand-in process and no run file may be left (the `host` fixture checks)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from sparklab.sweep.store import Store
from tests.dockerkit import Lines, free_port
from tests.process.conftest import RECIPE, STANDIN, HostCli, processes_of
from tests.process.test_process_sweep import _run, _store, _sweep
from tests.signals import hangup_ends, hangup_ignored
from tests.terminals import Session


def _ours(port: int) -> list[int]:
    return processes_of(str(STANDIN / "bin"), f"--port {port}")


def _popen(host: HostCli, *args: str, nohup: bool = False, cwd: Path | None = None) -> subprocess.Popen[str]:
    with hangup_ignored() if nohup else hangup_ends():
        return host.popen(*args, cwd=cwd, stderr=subprocess.STDOUT)


def test_a_hangup_stops_a_foreground_up_and_its_engine(host: HostCli) -> None:
    """Before: `kill -HUP` ended sparklab at once (exit 129) and the engine's process group served on."""
    port = free_port()
    proc = _popen(host, "up", f"{RECIPE}:none", *host.launch_args(port))
    lines = Lines(proc)
    try:
        lines.wait_for("serving in the foreground", timeout=30)
        assert len(_ours(port)) == 1
        began = time.monotonic()
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(timeout=15)
        seconds = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    assert code == 0, "".join(lines.lines)
    assert "stopped and removed" in "".join(lines.lines)
    assert seconds < 15 and _ours(port) == []


def test_a_hangup_while_the_engine_loads_ends_its_group(host: HostCli) -> None:
    """The ssh session drops while `up` waits for the engine to load. Before: sparklab died of the hangup (exit 129)
    and the loading engine's process group lived on, holding the memory it was taking."""
    port = free_port()
    proc = _popen(host, "up", f"{RECIPE}:none", *host.launch_args(port, "-e", "STANDIN_START_DELAY=60"))
    lines = Lines(proc)
    try:
        deadline = time.monotonic() + 30
        while not _ours(port) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _ours(port), "the engine never started"
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    assert code == 130, "".join(lines.lines)
    assert "interrupted" in "".join(lines.lines)
    assert _ours(port) == []


def test_a_closed_terminal_stops_a_foreground_up_and_its_engine(host: HostCli) -> None:
    """The terminal `up` runs in goes away (an ssh connection dropping): SIGHUP, and every later write fails.
    Before: sparklab died of the hangup and the engine served on."""
    port = free_port()
    with hangup_ends():
        session = Session([sys.executable, "-m", "sparklab", "up", f"{RECIPE}:none", *host.launch_args(port)],
                          host.env())
    try:
        session.wait_for("serving in the foreground", timeout=30)
        assert len(_ours(port)) == 1
        session.hang_up()
        code = session.proc.wait(timeout=15)
    finally:
        session.close()
    assert code == 0
    assert _ours(port) == []


def test_a_hangup_stops_a_sweep_and_its_run_resumes(host: HostCli, tmp_path: Path) -> None:
    """Before: the sweep died of the hangup, its engine served on and its cell stayed `running`."""
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.08', STANDIN_START_DELAY: '0.2'}",
                  port=port)
    proc = _popen(host, "sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", cwd=tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for("ready in", timeout=60)
        time.sleep(0.5)  # a cell is running
        proc.send_signal(signal.SIGHUP)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    assert code == 130, "".join(lines.lines)
    assert not _ours(port)
    with _store(path) as store:
        assert store.counts()["running"] == 0 and store.counts()["done"] < 2
    resumed = _run(host, path)
    assert resumed.returncode == 0, resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 2


def test_a_sweep_started_under_nohup_runs_through_a_hangup(host: HostCli, tmp_path: Path) -> None:
    """`nohup sparklab sweep … &` starts with SIGHUP ignored: the hangup is not for it; SIGTERM still stops it."""
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.08', STANDIN_START_DELAY: '1'}", port=port)
    proc = _popen(host, "sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", nohup=True,
                  cwd=tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for("starting", timeout=60)
        proc.send_signal(signal.SIGHUP)  # while the server starts
        lines.wait_for("ready in", timeout=60)
        proc.send_signal(signal.SIGHUP)  # while a cell runs
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    assert code == 130, "".join(lines.lines)
    assert not _ours(port)


def test_a_sweep_whose_terminal_closes_tears_down_and_its_run_resumes(host: HostCli, tmp_path: Path) -> None:
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.08', STANDIN_START_DELAY: '0.2'}",
                  port=port)
    session = Session([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(tmp_path / "runs"),
                       "--no-download"], host.env(), cwd=tmp_path)
    try:
        session.wait_for("ready in", timeout=60)
        session.hang_up()
        code = session.proc.wait(timeout=30)
    finally:
        session.close()
    logs = "".join(f"\n--- {log}:\n" + log.read_text()[-3000:] for log in (tmp_path / "runs").glob("*/sweep.log"))
    assert code == 130, session.text[-3000:] + logs  # the terminal's text stops at the hangup; the run's log goes on
    assert not _ours(port)
    with _store(path) as store:
        assert store.counts()["running"] == 0
    (run,) = sorted((tmp_path / "runs").iterdir())
    assert "interrupted" in (run / "sweep.log").read_text()  # the terminal was gone: the run's log says it


def test_a_sweep_whose_stderr_pipe_closes_goes_on_and_logs_its_events(host: HostCli, tmp_path: Path) -> None:
    """Whoever read sparklab's stderr went away (a `| tee` killed, a log shipper gone): writes fail with EPIPE.
    Before: the first failed write ended the sweep with a BrokenPipeError. Now it runs to the end, and its events
    are in the run's log."""
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.05'}", port=port)
    with hangup_ends():
        proc = host.popen("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", cwd=tmp_path)
    try:
        assert proc.stderr is not None
        while "ready in" not in proc.stderr.readline():
            assert proc.poll() is None
        proc.stderr.close()  # the reader goes away
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 0, proc.stdout.read() if proc.stdout else ""
    assert not _ours(port)
    with _store(path) as store:
        assert store.counts()["done"] == 2
    (run,) = sorted((tmp_path / "runs").iterdir())
    log = (run / "sweep.log").read_text()
    assert log.count("tok/s aggregate") == 2 and "server edgellm/dspark K=3: ready in" in log
    with Store.open(run / "results.sqlite") as store:
        assert not store.failures()
