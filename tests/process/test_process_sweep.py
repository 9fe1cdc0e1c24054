"""`sparklab sweep` and `report` with a host-process engine (the stand-in's Edge-LLM surface on the host), and a
sweep SIGKILLed mid-cell whose resumed run removes the orphaned process group and finishes."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from sparklab.sweep.store import Store
from tests.dockerkit import Lines, free_port
from tests.process.conftest import RECIPE, STANDIN, HostCli, processes_of


def _sweep(tmp_path: Path, *extra_set: str, port: int | None = None) -> Path:
    doc: dict[str, Any] = {
        "name": "process", "recipe": str(RECIPE), "methods": ["none", "dspark"], "num_speculative_tokens": [3],
        "concurrency": [1], "requests": 3, "warmup": 1, "workloads": ["speedbench-1k"],
        "sampling": {"max_tokens": 12, "temperature": 0, "top_p": None, "enable_thinking": True},
        "set": [f"standin_dir={STANDIN}", f"engines.edgellm.port={port or free_port()}", *extra_set],
        "headline": "decode",
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(host: HostCli, path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return host.run("sweep", str(path), "--runs-dir", str(path.parent / "runs"), "--no-download", *args, timeout=180,
                    cwd=path.parent)


def _store(path: Path) -> Store:
    (db,) = sorted((path.parent / "runs").glob("*/results.sqlite"))
    return Store.open(db)


def test_sweep_and_report_with_a_host_process_engine(host: HostCli, tmp_path: Path) -> None:
    path = _sweep(tmp_path)
    done = _run(host, path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("server edgellm/") == 2 * 2  # starting + ready, for none and dspark K=3
    with _store(path) as store:
        assert store.counts()["done"] == 2
        servers = store.server_configs()
        assert all(s.startup_facts["startup_complete"] for s in servers)
        assert all(Path(s.log_path).read_text().count("Loaded model=standin/nemotron-lightning") == 1 for s in servers)
        assert all(c.result["summary"]["requests"]["ok"] == 3 for c in store.cells("done"))
    (run,) = sorted((tmp_path / "runs").iterdir())
    report = host.run("report", run.name, "--runs-dir", str(tmp_path / "runs"), "--format", "md")
    assert report.returncode == 0, report.stderr
    lead = report.stdout.index("Generation speed (excluding TTFT) and TTFT median: edgellm, C=1")
    assert lead < report.stdout.index("How these numbers were measured")  # it leads, as in seed 004


def test_sigkill_of_a_sweep_then_resume_removes_the_orphan_and_finishes(host: HostCli, tmp_path: Path) -> None:
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.08', STANDIN_START_DELAY: '0.2'}",
                  port=port)
    proc = host.popen("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", cwd=tmp_path,
                      stderr=subprocess.STDOUT)
    try:
        Lines(proc).wait_for("ready in", timeout=60)
        time.sleep(1)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert processes_of(str(STANDIN / "bin"), f"--port {port}")  # the orphan serves on
    resumed = _run(host, path)
    assert resumed.returncode == 0, resumed.stderr
    assert "removed leftover host process" in resumed.stderr and "was in flight" in resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 2 and len(store.cells()) == 2
    assert not processes_of(str(STANDIN / "bin"), f"--port {port}")


def test_a_sweep_started_ignoring_ctrl_c_runs_through_it_and_stops_cleanly_on_sigterm(host: HostCli,
                                                                                       tmp_path: Path) -> None:
    """scripts/overnight.sh's sweep starts with SIGINT ignored (a background job of a script). Ctrl-C, even
    while a server starts, does not stop it; SIGTERM does, leaving no process and a run that resumes."""
    port = free_port()
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.08', STANDIN_START_DELAY: '1'}", port=port)
    proc = host.popen("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", cwd=tmp_path,
                      stderr=subprocess.STDOUT, ignoring_ctrl_c=True)
    try:
        lines = Lines(proc)
        lines.wait_for("starting", timeout=60)
        proc.send_signal(signal.SIGINT)  # while the server starts
        lines.wait_for("ready in", timeout=60)
        proc.send_signal(signal.SIGINT)  # while a cell runs
        time.sleep(0.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        lines.drain()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, "".join(lines.lines)
    assert not processes_of(str(STANDIN / "bin"), f"--port {port}")
    resumed = _run(host, path)
    assert resumed.returncode == 0, resumed.stderr
    with _store(path) as store:
        assert store.counts()["done"] == 2


def test_dry_run_plans_without_starting_anything(host: HostCli, tmp_path: Path) -> None:
    done = host.run("sweep", str(_sweep(tmp_path)), "--dry-run", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "edgellm" in done.stdout and "dspark" in done.stdout
    assert not (tmp_path / "runs").exists()


def test_clocks_are_sampled_under_load_and_a_throttled_cell_is_flagged(host: HostCli, tmp_path: Path) -> None:
    """Issue 23: the sweep's memory sampler reads nvidia-smi through every cell's window (here a fake on PATH
    that throttles every other reading, HW thermal slowdown); each cell stores what it saw and the report's
    check names the reason."""
    import os

    from tests.fake_smi import NORMAL, THERMAL, fake_nvidia_smi

    calls = fake_nvidia_smi(tmp_path / "bin", [NORMAL, THERMAL], cycle=True)
    env = host.env(PATH=f"{tmp_path / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
    path = _sweep(tmp_path, "engines.edgellm.env={STANDIN_TOKEN_DELAY: '0.1', STANDIN_START_DELAY: '0.2'}")
    done = host.run("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), "--no-download", timeout=180,
                    cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    assert "clocks_event_reasons.active" in calls.read_text()
    with _store(path) as store:
        cells = store.cells("done")
    assert len(cells) == 2
    for cell in cells:
        facts = cell.result["gpu_clocks"]
        assert facts["loaded_samples"] >= 2, facts  # ~1.2 s per request, 4 requests: sampled through the window
        assert facts["throttled"] == ["hw_thermal_slowdown"] and facts["fell_under_load"] is True
        assert facts["sm_clock_mhz"] == {"min": 1702.0, "max": 2405.0, "mean": facts["sm_clock_mhz"]["mean"]}
    (run,) = sorted((tmp_path / "runs").iterdir())
    report = host.run("report", run.name, "--runs-dir", str(tmp_path / "runs"), "--format", "md", env=env)
    assert report.returncode == 0, report.stderr
    header, findings = report.stdout[report.stdout.index("clocks under load:"):].split("\n\n")[:2]
    assert "2 warning(s)" in header
    lines = findings.splitlines()  # one bullet per cell, each naming the reason and the fall under load
    assert len(lines) == 2 and all("HW thermal slowdown in" in li and "2405 → 1702 MHz" in li for li in lines)
