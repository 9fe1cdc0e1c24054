"""A sweep over two Docker hosts: this machine's daemon and a second one behind sshd on 127.0.0.1
(scripts/ci/second-host.sh), the second stopped in the middle of the sweep.

Only the second daemon is ever stopped (by its own pidfile, through the script), and it is started again at
the end whatever happens."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.sweep.store import Store
from tests.docker.conftest import SCRIPT
from tests.dockerkit import OURS, SESSION, Cli, Lines, free_port, listed, ulimit_args

pytestmark = pytest.mark.docker


def _sweep(tmp_path: Path, image: str, second: str, **changes: Any) -> Path:
    port = free_port()
    other = free_port()
    while other <= port:
        other = free_port()
    doc: dict[str, Any] = {
        "name": "two-hosts", "recipe": "gb10", "methods": ["none", "dspark"], "num_speculative_tokens": [2, 3],
        "concurrency": [1, 2], "requests": {1: 4, 2: 6}, "warmup": 1,
        "sampling": {"max_tokens": 24, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
                "engines.vllm.engine_cache=false", "engines.vllm.ulimits={stack: 67108864}",
                f"engines.vllm.port={port}", "gpu_memory_utilization=0.01", "unified_memory=false",
                "engines.vllm.env={STANDIN_TOKEN_DELAY: '0.05'}"],
        "hosts": ["local", {"docker": second, "network": "host", "port_offset": other - port}],
    }
    doc.update(changes)
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _sweep_args(path: Path) -> list[str]:
    return [sys.executable, "-m", "sparklab", "sweep", str(path), "--runs-dir", str(path.parent / "runs"),
            *ulimit_args()]


def test_a_sweep_over_two_hosts_survives_losing_one_and_the_report_says_where_each_cell_ran(
        cli: Cli, tmp_path: Path, second_host: str, second_client: Any) -> None:
    name = second_host.split("@", 1)[1]  # the host's name in results: 127.0.0.1:PORT
    path = _sweep(tmp_path, cli.image, second_host)
    proc = subprocess.Popen(_sweep_args(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli.env(), cwd=tmp_path)
    lines = Lines(proc)
    try:
        lines.wait_for(f"[{name}] cell ", timeout=180)  # the second host has finished (or failed) a cell
        stopped = subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=60)
        assert stopped.returncode == 0, stopped.stderr
        lines.wait_for(f"[{name}] lost:", timeout=180)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    output = "".join(lines.lines)
    assert proc.returncode == 0, output
    assert "goes back to the queue" in output, output
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    with Store.open(db) as store:
        cells = store.cells()
        assert len(cells) == 6 and store.counts()["done"] == 6, store.counts()
        hosts = {c.host for c in cells}
        assert hosts == {"local", name}, hosts  # both hosts finished cells; every cell says where
        lost = [f for f in store.failures() if f.kind == "host_lost"]
        assert lost and all(f.host == name for f in lost)
        facts = store.host_facts()["docker_hosts"]
        assert set(facts) == {"local", name} and facts[name]["address"] == "127.0.0.1"
    report = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db), "-f", "json"],
                            capture_output=True, text=True, env=cli.env(), timeout=120)
    assert report.returncode == 0, report.stderr
    rows = json.loads(report.stdout)
    assert {r["host"] for r in _cells_of(rows)} == {"local", name}
    md = subprocess.run([sys.executable, "-m", "sparklab", "report", str(db)], capture_output=True, text=True,
                        env=cli.env(), timeout=120)
    assert "Where each cell ran" in md.stdout and f"{name}: lost" in md.stdout
    # The second daemon is back: its stopped server container is a leftover of a finished run, which
    # `sparklab ps` shows with its host and `sparklab gc` removes there.
    back = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)
    assert back.returncode == 0, back.stderr
    ps = cli.run("ps", "--host", "local", "--host", second_host)
    assert ps.returncode == 0 and "HOST" in ps.stdout and name in ps.stdout, ps.stdout + ps.stderr
    mine = {"label": ["sparklab", "sparklab.run_id"]}
    left = [c for c in listed(second_client, mine)
            if c.labels["sparklab.run_id"].startswith("two-hosts")]
    assert {c.labels.get("sparklab.role", "server") for c in left} == {"server", "meminfo"}, left  # both stopped there
    gc = cli.run("gc", "--host", second_host)
    assert gc.returncode == 0 and f"on {name}" in gc.stdout, gc.stdout + gc.stderr
    assert f"{len(left)} leftover container(s) removed" in gc.stdout, gc.stdout  # the memory reader too (its label)
    assert not [c for c in listed(second_client, mine)
                if c.labels["sparklab.run_id"].startswith("two-hosts")]


def _cells_of(doc: Any) -> list[dict[str, Any]]:
    return list(doc["cells"])


def test_an_interrupted_two_host_sweep_leaves_nothing_on_either_host_and_resumes_there(
        cli: Cli, tmp_path: Path, second_host: str, second_client: Any, docker_client: Any) -> None:
    name = second_host.split("@", 1)[1]
    path = _sweep(tmp_path, cli.image, second_host, methods=["none", "dspark"], num_speculative_tokens=[3])
    proc = subprocess.Popen(_sweep_args(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli.env(), cwd=tmp_path)
    lines = Lines(proc)
    try:
        ready: set[str] = set()
        while ready != {"local", name}:  # both hosts serve now
            ready.add(lines.wait_for("ready in", timeout=120).split("[", 1)[1].split("]", 1)[0])
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    assert proc.returncode == 130, "".join(lines.lines)
    run = [r for r in listed(docker_client, OURS)
           if r.labels.get("sparklab.run_id", "").startswith("two-hosts")]
    there = listed(second_client, OURS)
    assert not run and not there, (run, there)  # both servers came down with the sweep
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    again = subprocess.run([*_sweep_args(path), "--resume", db.parent.name], capture_output=True, text=True,
                           env=cli.env(), cwd=tmp_path, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    with Store.open(db) as store:
        assert store.counts()["done"] == 4 and not store.cells("running")
        assert {f.kind for f in store.failures()} <= {"interrupted"}


def test_a_start_of_the_second_daemon_leaves_this_machines_default_bridge_working(
        second_host: str, second_client: Any, docker_client: Any, standin_image: str) -> None:
    """The second daemon shares this machine's network namespace. A dockerd whose default bridge is disabled
    (`--bridge=none`) deletes the interface named docker0 as it starts (moby 20.10, daemon/daemon_unix.go,
    removeDefaultBridgeInterface, called from initNetworkController when the bridge is disabled): every start of the
    second host took this machine's default bridge away, and from then on any container on it (a `docker run`
    without --network, a `docker build` RUN step) failed with "could not find bridge docker0" until dockerd
    restarted. Stopped and started again here, the second daemon leaves the interface, and a container still runs
    on this machine's default bridge."""
    bridge = docker_client.networks.get("bridge").attrs["Options"]["com.docker.network.bridge.name"]
    assert Path("/sys/class/net", bridge).exists(), (
        f"this machine's default bridge {bridge} is missing before the test (a daemon with --bridge=none deleted "
        "it?); bash scripts/ci/setup-host.sh restarts dockerd to make it again when no container runs")
    stopped = subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=60)
    assert stopped.returncode == 0, stopped.stderr
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    assert Path("/sys/class/net", bridge).exists(), f"starting the second daemon deleted {bridge}: {up.stderr}"
    out = docker_client.containers.run(standin_image, entrypoint=["/bin/cat", "/sys/class/net/eth0/address"],
                                       network_mode="bridge", remove=True, labels={"sparklab": "",
                                                                                   "sparklab.session": SESSION})
    assert out.strip(), "a container on this machine's default bridge has no eth0"
