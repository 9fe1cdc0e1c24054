"""`sparklab tune` against the stand-in: it runs end to end on the sweep machinery, loads fewer servers than the
grid, resumes after Ctrl-C without running a cell twice, and ends with the `sparklab up` command of each winner."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sparklab.sweep.store import Store
from tests.dockerkit import Cli, Lines, free_port, sparklab_containers, ulimit_args

pytestmark = pytest.mark.docker


def _space(tmp_path: Path, image: str) -> Path:
    doc = {
        "name": "standin", "recipe": "gb10", "methods": ["none", "mtp"], "num_speculative_tokens": [1, 2, 3, 4],
        "concurrency": [1, 2], "requests": {1: 3, 2: 4}, "warmup": 1, "repeats": 2,
        "sampling": {"max_tokens": 12, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
                "engines.vllm.ulimits={stack: 67108864}", f"engines.vllm.port={free_port()}",
                "gpu_memory_utilization=0.01",
                "engines.vllm.env={STANDIN_TOKEN_DELAY: '0.02'}"],
    }
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _tune(cli: Cli, path: Path) -> list[str]:
    return [sys.executable, "-m", "sparklab", "tune", str(path), "--runs-dir", str(path.parent / "runs"),
            "--max-repeats", "2", *ulimit_args()]


def test_tune_resumes_after_ctrl_c_and_loads_fewer_servers_than_the_grid(cli: Cli, tmp_path: Path,
                                                                          docker_client) -> None:
    path = _space(tmp_path, cli.image)
    before = sparklab_containers(docker_client)
    proc = subprocess.Popen(_tune(cli, path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli.env(), cwd=tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for("tune round 2", timeout=120)  # the probes are done; stop in the middle of the search
        proc.send_signal(signal.SIGINT)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()  # what it said after the Ctrl-C too (the failure of 2026-12-05 showed only the lines before it)
    assert code == 130, "".join(lines.lines)
    assert sparklab_containers(docker_client) == before
    done = subprocess.run(_tune(cli, path), capture_output=True, text=True, timeout=240, env=cli.env(),
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "continuing" in done.stderr
    (db,) = sorted((tmp_path / "runs").glob("tune-standin-*/results.sqlite"))
    with Store.open(db) as store:
        state = json.loads(store.meta()["tune"])
        cells = store.cells()
        assert store.counts()["running"] == 0
    assert len({c.id for c in cells}) == len(cells)
    assert {p["concurrency"] for p in state["picks"]} == {1, 2}
    loaded = {name for r in state["rounds"] for name in r["loads"]}
    # the baseline, mtp at its largest K (the probe) and at its smallest (the step cost's second point): the
    # two-point line puts K=2 and K=3 below the best measured, so neither is loaded
    assert loaded == {"vllm/none", "vllm/mtp K=4", "vllm/mtp K=1"}, loaded
    assert {(p["method"], p["k"]) for p in state["picks"]} <= {("none", None), ("mtp", 4), ("mtp", 1)}
    assert {(r["k"], r["measured"] is None) for r in state["predictions"] if r["concurrency"] == 1} == {
        (1, False), (2, True), (3, True)}  # every K below the probe predicted; K=1 also measured
    assert state["loads"] >= len(loaded)  # the interrupted round's server counts again when it reloads
    for pick in state["picks"]:
        assert f"C={pick['concurrency']}: sparklab up gb10:{pick['method']}" in done.stdout
    assert "predicted vs measured" in done.stdout or all(p["k"] is None for p in state["picks"])
    report = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db)], capture_output=True, text=True,
                            timeout=120, env=cli.env(), cwd=tmp_path)
    assert report.returncode == 0 and "sparklab tune" in report.stdout, report.stderr
