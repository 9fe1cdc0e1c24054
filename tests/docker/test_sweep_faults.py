"""An overnight sweep against a failing world (issue 11): an engine that dies mid-warmup, a `docker kill` in
the middle of a cell, a Docker daemon restart, a disk that fills up, a second sweep on the same run. One fault
ends one cell or one server, never the sweep; no number from a half-failed cell is stored as done; nothing is
left running; the console never shows a traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparklab.sweep.store import Store
from tests.docker.test_sweep_standin import _run, _store, _sweep, ulimit_flags
from tests.dockerkit import Cli, Lines, listed
from tests.tmpfs import tmpfs

pytestmark = pytest.mark.docker


def _popen(cli: Cli, path: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir",
                             str(path.parent / "runs"), *ulimit_flags(), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=cli.env(), cwd=path.parent)


def _all_output(lines: Lines) -> str:
    """Everything the process printed (after it exited): what wait_for saw and the rest of the stream."""
    time.sleep(0.5)
    while not lines.queue.empty():
        lines.lines.append(lines.queue.get())
    return "".join(lines.lines)


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Fatal error" not in text, text[-3000:]


def _container_of(docker_client, run_dir_name: str) -> str:
    (container,) = listed(docker_client, stopped=False, filters={"label": f"sparklab.run_id={run_dir_name}"})
    return container.name


def test_an_engine_dying_during_warmup_fails_its_cell_and_the_sweep_goes_on(cli: Cli, tmp_path: Path) -> None:
    """The none server dies 5 s after ready, while its warmup requests (3.6 s each) stream: the warm-up of the
    measured window's connections is then refused. Before, that ConnectionRefusedError ended the sweep with a traceback and left the
    cell running; now the cell fails with one line (traceback in the run's log file) and dspark still runs.
    The engine dies without a word (STANDIN_DIE_QUIET): a fatal log line would fail the server as "fatal"
    before any request error (tests/docker/test_dead_engine.py)."""
    slow = {"match": {"method": "none"},
            "set": ["engines.vllm.env={STANDIN_DIE_AFTER: '5', STANDIN_DIE_QUIET: '1', STANDIN_TOKEN_DELAY: '0.3'}"]}
    path = _sweep(tmp_path, cli.image, num_speculative_tokens=[3], concurrency=[1], requests={1: 2},
                  warmup=3, max_attempts=1, overrides=[slow])
    done = _run(cli, path)
    assert done.returncode == 6, done.stderr
    _no_traceback(done.stderr + done.stdout)
    with _store(path) as store:
        counts = store.counts()
        assert counts["done"] == 1 and counts["failed"] == 1 and counts["running"] == 0
        (failure,) = [f for f in store.failures() if f.cell_id]
        log_file = store.path.parent / "sweep.log"
    assert failure.kind == "bench_error" and "Error" in failure.message and "\n" not in failure.message
    assert "Traceback" in log_file.read_text()  # the whole story is in the run's log file


def test_docker_kill_mid_cell_makes_it_partial_and_kind_killed_not_oom(cli: Cli, tmp_path: Path,
                                                                       docker_client) -> None:
    """`docker kill` during the first of two cells: before, the cell was stored as done from its few successful
    requests and the server failure was recorded as oom. Now the cell is partial (no done numbers), runs again
    on the next run, and the failure kind is 'killed' (Docker's OOMKilled is false)."""
    slow = ["engines.vllm.env={STANDIN_TOKEN_DELAY: '0.1'}"]  # 1.2 s requests: the resumed run pays it too
    path = _sweep(tmp_path, cli.image, methods=["none"], concurrency=[1], requests={1: 6}, warmup=0, repeats=2,
                  max_attempts=2, set=[*_sweep_set(tmp_path, cli), *slow])
    proc = _popen(cli, path)
    lines = Lines(proc)
    lines.wait_for("ready in", timeout=120)
    time.sleep(2)  # one or two of six 1.2 s requests done
    run_dir = next((path.parent / "runs").iterdir())
    subprocess.run(["docker", "kill", _container_of(docker_client, run_dir.name)], check=True, capture_output=True)
    assert proc.wait(timeout=120) == 6, _all_output(lines)
    _no_traceback(_all_output(lines))
    with Store.open(run_dir / "results.sqlite") as store:
        first, second = sorted(store.cells(), key=lambda c: c.repeat)
        kinds = [f.kind for f in store.failures()]
        partial = next(f for f in store.failures() if f.kind == "partial")
    assert first.status == "pending" and first.summary["requests"]["failed"] > 0  # not done: it runs again
    assert "of 6 requests failed" in partial.message
    assert "killed" in kinds and "oom" not in kinds
    assert second.status == "pending"
    again = _run(cli, path)
    assert again.returncode == 0, again.stderr
    with Store.open(run_dir / "results.sqlite") as store:
        assert store.counts()["done"] == 2
        assert all(c.summary["requests"]["failed"] == 0 for c in store.cells("done"))


def _sweep_set(tmp_path: Path, cli: Cli) -> list[str]:
    from tests.dockerkit import free_port

    return [f"engines.vllm.image={cli.image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
            "engines.vllm.ulimits={stack: 67108864}", f"engines.vllm.port={free_port()}",
            "gpu_memory_utilization=0.01"]


def test_a_second_sweep_on_the_same_run_is_refused(cli: Cli, tmp_path: Path) -> None:
    """`overnight.sh` started twice: the second process refuses at once and changes nothing of the first's run."""
    path = _sweep(tmp_path, cli.image, methods=["none"], concurrency=[1], requests={1: 3}, warmup=0,
                  set=[*_sweep_set(tmp_path, cli), "engines.vllm.env={STANDIN_TOKEN_DELAY: '0.2'}"])
    first = _popen(cli, path)
    lines = Lines(first)
    lines.wait_for("ready in", timeout=120)
    second = _run(cli, path)
    assert second.returncode == 1
    assert f"is in use by pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    assert first.wait(timeout=120) == 0, _all_output(lines)
    with _store(path) as store:
        assert store.counts()["done"] == 1 and store.failures() == []
        assert all(c.attempts == 1 for c in store.cells())


@pytest.fixture
def small_disk(tmp_path: Path):
    with tmpfs(tmp_path / "disk", "4m") as mount:
        yield mount


def test_a_disk_that_fills_up_stops_the_sweep_cleanly(cli: Cli, tmp_path: Path, small_disk: Path) -> None:
    """The runs directory on a 4 MiB tmpfs that fills during the sweep: before, a raw sqlite3 traceback and a
    cell recorded as 'interrupted'. Now: 'disk full', exit 7, what finished is kept, nothing left running."""
    path = _sweep(tmp_path, cli.image, num_speculative_tokens=[3], concurrency=[1], requests={1: 3}, repeats=12,
                  warmup=0, sampling={"max_tokens": 64, "temperature": 0, "top_p": None, "ignore_eos": True})
    runs = small_disk / "runs"
    filler = small_disk / "filler"
    # about 420 KiB left. Measured (schema 6): the new results file and its shared memory take ~116 KiB, the engine
    # logs ~24 KiB, and the write-ahead log grows ~56 KiB per finished cell (1.35 MiB for these 24 cells), so a few
    # cells finish and the disk fills well before the last
    filler.write_bytes(b"\0" * (4 * 2**20 - 420 * 1024))
    done = subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(runs),
                           *ulimit_flags(), "--min-free-mib", "0"], capture_output=True, text=True, timeout=600,
                          env=cli.env(), cwd=path.parent)
    assert done.returncode == 7, done.stderr
    _no_traceback(done.stderr + done.stdout)
    assert "is full" in done.stderr
    filler.unlink()
    (db,) = runs.glob("*/results.sqlite")
    with Store.open(db) as store:
        assert store.counts()["done"] >= 1
        assert all(c.summary and c.summary["requests"]["failed"] == 0 for c in store.cells("done"))
    # and a disk already too full when the sweep starts: refused before any server, no results file made
    filler.write_bytes(b"\0" * (4 * 2**20 - 600 * 1024))
    early = subprocess.run([sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(runs),
                            "--new", *ulimit_flags(), "--min-free-mib", "1"], capture_output=True, text=True,
                           timeout=120, env=cli.env(), cwd=path.parent)
    assert early.returncode == 7 and "MiB free" in early.stderr, early.stderr
    assert "starting" not in early.stderr and len(list(runs.glob("*/results.sqlite"))) == 1


def _restart_dockerd() -> None:
    """Stop the Docker daemon (its containers die with it) and start it again the way setup-host.sh does.

    The daemon is the one behind the default socket, found by its pidfile: `pgrep -o dockerd` would pick the
    second test host's daemon (scripts/ci/second-host.sh, its own --pidfile) once this one had been restarted."""
    pid = int(Path("/run/docker.pid").read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and subprocess.run(["kill", "-0", str(pid)], capture_output=True).returncode == 0:
        time.sleep(0.2)
    log = open("/tmp/sparklab-test-dockerd.log", "ab")  # noqa: SIM115 - the daemon keeps it
    subprocess.Popen(["dockerd"], stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 60
    while subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "dockerd did not come back"
        time.sleep(0.5)


def test_a_docker_daemon_restart_mid_sweep_fails_one_server_and_the_sweep_goes_on(cli: Cli, tmp_path: Path) -> None:
    """Before: requests.ConnectionError in teardown ended the sweep, an exited container stayed, and the cell was
    stored as done from 2 of 6 requests. Now the server's cells go back to the queue, the next server runs."""
    slow = {"match": {"method": "none"}, "set": ["engines.vllm.env={STANDIN_TOKEN_DELAY: '0.25'}"]}
    path = _sweep(tmp_path, cli.image, num_speculative_tokens=[3], concurrency=[1], requests={1: 6}, warmup=0,
                  overrides=[slow])
    proc = _popen(cli, path)
    lines = Lines(proc)
    lines.wait_for("ready in", timeout=120)
    time.sleep(4)
    _restart_dockerd()
    assert proc.wait(timeout=300) == 6, _all_output(lines)
    _no_traceback(_all_output(lines))
    with _store(path) as store:
        by_method = {s.id: s.method for s in store.server_configs()}
        cells = {by_method[c.server_config_id]: c for c in store.cells()}
    assert cells["none"].status == "pending"  # not done from a half-failed cell: it runs on the next run
    assert cells["dspark"].status == "done"
