"""One server across two Docker hosts (recipes/gb10-pair.yaml) with the stand-in on this machine's daemon (the
head) and the second daemon behind sshd (the worker): start order, readiness on the head, and teardown of both
nodes when the worker dies, on Ctrl-C and when the second host refuses its node.

The stand-in plays Ray (docker/standin/standin_cluster.py): `ray start --head` opens the cluster port and the
head's `vllm serve … --tensor-parallel-size 2 --distributed-executor-backend ray` is ready only once the worker's
`ray start --address=… --block` joined, so the head cannot answer unless both nodes run, in that order."""

from __future__ import annotations

import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.sweep.store import Store
from tests.docker.conftest import SCRIPT
from tests.docker.test_dead_hosts import _frozen, _keep
from tests.docker.test_hosts import _sweep_args
from tests.dockerkit import OURS, Cli, Lines, free_port, listed, sparklab_containers, ulimit_args

pytestmark = pytest.mark.docker


def _up_args(cli: Cli, second: str, port: int, cluster_port: int, second_extra: str = "") -> list[str]:
    link = "cluster_address=127.0.0.1,interface=lo,ib_hca=standin0"
    return ["up", "gb10-pair", "--image", cli.image, "--no-gpus", "--hf-cache", str(cli.hf_cache), "--no-download",
            "--port", str(port), "--set", "gpu_memory_utilization=0.01",
            "--set", f"engines.vllm.cluster_port={cluster_port}", "--set", "engines.vllm.engine_cache=false",
            *ulimit_args(), "--host", f"local,{link}", "--host", f"{second},{link}{second_extra}"]


def _ports() -> tuple[int, int]:
    port = free_port()
    other = free_port()
    while other == port:
        other = free_port()
    return port, other


def _pair(docker_client: Any, second_client: Any) -> tuple[list[Any], list[Any]]:
    def mine(client: Any) -> list[Any]:
        return [c for c in listed(client, OURS)
                if c.labels.get("sparklab.recipe") == "gb10-pair"]

    return mine(docker_client), mine(second_client)


def _started(up: subprocess.Popen[str]) -> tuple[Lines, str]:
    """Wait until `up` serves; its stdout lines and the API key it printed."""
    lines = Lines(up)
    key = lines.wait_for("api key", timeout=90).split()[2]
    lines.wait_for("serving from 2 hosts", timeout=30)
    return lines, key


def test_the_head_starts_first_the_worker_joins_it_and_ctrl_c_removes_both(
        cli: Cli, second_host: str, second_client: Any, docker_client: Any) -> None:
    port, cluster_port = _ports()
    up = cli.popen(*_up_args(cli, second_host, port, cluster_port))
    try:
        _, key = _started(up)
        (head,), (worker,) = _pair(docker_client, second_client)
        assert head.labels["sparklab.node_rank"] == "0" and worker.labels["sparklab.node_rank"] == "1"
        # order: the worker was started after the head, and only once the head's cluster port was open
        assert head.attrs["State"]["StartedAt"] < worker.attrs["State"]["StartedAt"]
        assert b"Ray runtime started" in head.logs() and b"ray_utils.py:470" in head.logs()
        assert f"joined 127.0.0.1:{cluster_port}".encode() in worker.logs()
        assert worker.attrs["Config"]["Cmd"][:2] == ["start", f"--address=127.0.0.1:{cluster_port}"]
        # readiness is the head's HTTP endpoint, with the key sparklab made
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/models",
                                         headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert answer.status == 200
        up.send_signal(signal.SIGINT)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 0, err
    assert "node 0 (head) on local: starting" in err and "is open" in err
    assert err.index("node 0 (head)") < err.index(f"cluster port 127.0.0.1:{cluster_port} is open") \
        < err.index("node 1 (worker)"), err
    assert "stopped and removed" in err and _pair(docker_client, second_client) == ([], [])


def test_a_worker_killed_mid_run_ends_the_server_on_both_hosts(
        cli: Cli, second_host: str, second_client: Any, docker_client: Any) -> None:
    port, cluster_port = _ports()
    up = cli.popen(*_up_args(cli, second_host, port, cluster_port))
    try:
        _started(up)
        (worker,) = _pair(docker_client, second_client)[1]
        killed = time.monotonic()
        worker.kill()
        _, err = up.communicate(timeout=60)
        ended_s = time.monotonic() - killed
    finally:
        if up.poll() is None:
            up.kill()
    assert up.returncode == 4, err  # NotReadyError: the server ended
    assert "node 1 (worker) on 127.0.0.1:" in err and "exited with code 137" in err, err
    assert ended_s < 15, ended_s  # the watcher polls every second; the teardown takes a few
    assert _pair(docker_client, second_client) == ([], [])


def test_a_node_refused_by_the_second_host_takes_the_head_down(
        cli: Cli, second_host: str, second_client: Any, docker_client: Any, tmp_path: Path) -> None:
    port, cluster_port = _ports()
    before = sparklab_containers(docker_client)
    # a mount the second daemon rejects ("invalid volume specification"): its node cannot be created there
    up = cli.run(*_up_args(cli, second_host, port, cluster_port, f",hf_cache={tmp_path}/bad:mount:spec"),
                 timeout=120)
    assert up.returncode == 4, up.stdout + up.stderr  # ContainerError
    assert "node 0 (head) on local: starting" in up.stderr, up.stderr
    assert "error: node 1 (worker) on 127.0.0.1:" in up.stderr and "docker could not start" in up.stderr
    assert "invalid volume specification" in up.stderr
    assert sparklab_containers(docker_client) == before and _pair(docker_client, second_client) == ([], [])


def test_a_sweep_runs_a_server_across_both_hosts_and_leaves_nothing(
        cli: Cli, tmp_path: Path, second_host: str, second_client: Any, docker_client: Any) -> None:
    port, cluster_port = _ports()
    link = {"cluster_address": "127.0.0.1", "interface": "lo", "ib_hca": "standin0"}
    doc = {
        "name": "pair", "recipe": "gb10-pair", "methods": ["none", "dspark"], "num_speculative_tokens": [3],
        "concurrency": [1, 2], "requests": 3, "warmup": 1,
        "sampling": {"max_tokens": 16, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={cli.image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
                "engines.vllm.engine_cache=false", "engines.vllm.ulimits={stack: 67108864}",
                f"engines.vllm.port={port}", f"engines.vllm.cluster_port={cluster_port}",
                "gpu_memory_utilization=0.01", "unified_memory=false"],
        # the second host's servers listen 100 ports up; its head (if it takes the server) serves there
        "hosts": [{"docker": "local", **link}, {"docker": second_host, "network": "host", **link}],
    }
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(doc))
    done = cli.run("sweep", str(path), "--runs-dir", str(tmp_path / "runs"), *ulimit_args(), timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    across = [line for line in (done.stdout + done.stderr).splitlines() if ": across " in line]
    assert len(across) == 2 and all("local" in line and "127.0.0.1:" in line for line in across), done.stderr
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    with Store.open(db) as store:
        assert store.counts()["done"] == 4 and not store.failures(), (store.counts(), store.failures())
    assert _pair(docker_client, second_client) == ([], [])


@pytest.mark.parametrize("how", ["daemon stopped", "frozen"])
def test_a_pair_whose_worker_host_is_lost_records_that_host_and_the_head_host_goes_on(
        cli: Cli, tmp_path: Path, second_host: str, second_client: Any, docker_client: Any, how: str) -> None:
    """The worker's Docker host goes away mid-sweep, its daemon stopped under the worker's node, or frozen as a
    Spark that lost power (tests/docker/test_dead_hosts.py's freeze: the node paused, the host's sshd and every
    session stopped): the loss is that host's (`host_lost`, named, the cell's attempt given back), not a killed
    server; the head's container comes down on this machine, which stays in the run; the worker's is left for
    `gc --host`. Before (2026-12-05), only the head's host was asked whether it went away: the worker's loss was
    stored as the server's own failure, its attempt spent. The same night rehearsed on the twin:
    tests/process/test_rehearse.py (`--fault host-lost`)."""
    name = second_host.split("@", 1)[1]
    port, cluster_port = _ports()
    link = {"cluster_address": "127.0.0.1", "interface": "lo", "ib_hca": "standin0"}
    doc = {
        "name": "pair-lost", "recipe": "gb10-pair", "methods": ["none", "dspark"], "num_speculative_tokens": [3],
        "concurrency": [1], "requests": 6, "warmup": 1,
        "sampling": {"max_tokens": 24, "temperature": 0, "top_p": None, "ignore_eos": True},
        "set": [f"engines.vllm.image={cli.image}", "engines.vllm.gpus=none", "engines.vllm.mount_hf_cache=false",
                "engines.vllm.engine_cache=false", "engines.vllm.ulimits={stack: 67108864}",
                f"engines.vllm.port={port}", f"engines.vllm.cluster_port={cluster_port}",
                "gpu_memory_utilization=0.01", "unified_memory=false",
                "engines.vllm.env={STANDIN_TOKEN_DELAY: '0.3'}"],  # each cell takes seconds: the loss lands in one
        "hosts": [{"docker": "local", **link}, {"docker": second_host, "network": "host", **link}],
    }
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump(doc))
    proc = subprocess.Popen(_sweep_args(path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=cli.env(), cwd=tmp_path)
    lines = Lines(proc)
    try:
        across = lines.wait_for(": across ", timeout=120)
        assert "[local] server" in across, across  # this machine's is the head: the worker's host is the one lost
        lines.wait_for("ready in", timeout=180)
        if how == "daemon stopped":
            stopped = subprocess.run(["bash", str(SCRIPT), "stop"], capture_output=True, text=True, timeout=60)
            assert stopped.returncode == 0, stopped.stderr
        else:
            with _frozen(second_client, "pair-lost"):
                began = time.monotonic()
                lines.wait_for(f"host {name} lost:", timeout=240)
                seconds = time.monotonic() - began
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    lines.drain()
    output = "".join(lines.lines)
    if how == "frozen":
        print(output)  # where the seconds went
        _keep("pair: the worker's host frozen mid-cell, freeze to lost (s)", seconds)
        assert seconds < 40, f"{seconds:.0f} s from the worker host's freeze to its loss:\n{output}"
    # 6: the run is not complete (its cells wait for two hosts; `sweep --resume` runs them once both are back)
    assert proc.returncode == 6 and "Traceback" not in output, output
    assert f"host {name} lost: server vllm/" in output and "goes back to the queue" in output, output
    assert "[local] lost" not in output and "out of memory" not in output, output
    (db,) = sorted((tmp_path / "runs").glob("*/results.sqlite"))
    with Store.open(db) as store:
        failures = store.failures()
        assert [(f.kind, f.host) for f in failures] == [("host_lost", name)], failures
        assert not store.cells("running") and store.counts()["failed"] == 0, store.counts()
        assert all(c.attempts == 0 for c in store.cells() if c.status == "pending")  # the loss charged none
    up = subprocess.run(["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180)
    assert up.returncode == 0, up.stderr
    head, worker = _pair(docker_client, second_client)
    assert head == [] and len(worker) == 1, (head, worker)  # the head's came down; the worker's host was gone
    gc = cli.run("gc", "--host", second_host, timeout=120)  # the worker's node, left on the host that went
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert _pair(docker_client, second_client) == ([], [])
