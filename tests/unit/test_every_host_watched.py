"""Every host of a sweep or a pair is watched (issue 23 §2): a server on another Docker host, and each node of a
server across two hosts, gets the memory wait, the page-cache drop, the floor from the room its fraction leaves
there, and a sampler of that host's readings that stops the server at the floor. Before, all of it ran for
`host.local` only: a second Spark had no sampling, no drop and no floor (these tests failed then: no eviction, no
floor line, the cell measured to its end).

The hosts are fakes (tests/fakes.py: FakeRuntime, FakeFacts); the start and the bench are stood in for, so what is
tested is the sweep's own watching (sparklab/sweep/serverrun.py and watch.py)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.engines.scrape import StartupFacts
from sparklab.recipes.hosts import Host
from sparklab.recipes.plan import build_plan
from sparklab.runtimes.base import ImageInfo
from sparklab.runtimes.launch import Ready
from sparklab.sweep import fleet, runner
from sparklab.sweep import serverrun as sweep_mod
from sparklab.sweep.hoststore import HostStore
from sparklab.sweep.store import Store
from tests.fakes import FakeFacts, FakeRuntime, FakeServer, NoEngineAPI


def _plan(tmp_path: Path, recipe: str) -> Any:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "recipe": recipe, "methods": ["none"], "concurrency": [1],
                                    "requests": 1, "set": ["gpu_memory_utilization=0.85"]}))
    return build_plan(path, run_id="t-1")


def _server_run(tmp_path: Path, plan: Any, server: Any, host: Host, runtime: FakeRuntime, options: Any = None,
                **kwargs: Any) -> tuple[Store, Any, list[str]]:
    """(the run's store, not yet entered; the ServerRun of `server` on `host`; what it says)."""
    store = Store.create(tmp_path / "results.sqlite", plan.sweep.model_dump(), "test")
    runner.register(plan, store)
    said: list[str] = []
    run = sweep_mod.ServerRun(plan, HostStore(store, host=host.name), runtime, tmp_path, options or sweep_mod.Options(),
                              said.append, host, server, list(server.cells), **kwargs)
    return store, run, said



@pytest.fixture
def started(monkeypatch) -> dict[str, Any]:
    """The start stood in for: a FakeServer the runtime's kill() ends; the bench waits until the server is killed
    (a cell whose requests fail when the watchdog stops it), after the test's `during_cell` ran."""
    box: dict[str, Any] = {"during_cell": lambda: None}

    def start(prepared: Any, runtime: Any, *args: Any, **kwargs: Any) -> Ready:
        server = FakeServer(prepared.spec)
        box["server"] = server
        return Ready(server, ImageInfo("img", "id", None, "amd64"), 1.0, None, StartupFacts())

    def bench_run(*args: object, **kwargs: object) -> None:
        box["during_cell"]()
        assert box["server"].killed.wait(10), "the watchdog never stopped the server"
        raise ConnectionError("Connection reset by peer")

    monkeypatch.setattr(sweep_mod, "_wait_port_free", lambda *a, **k: None)
    monkeypatch.setattr(sweep_mod.launch, "checked", lambda recipe, spec, **kwargs: type("P", (), {"spec": spec})())
    monkeypatch.setattr(sweep_mod.launch, "start", start)
    monkeypatch.setattr(sweep_mod.cluster, "start", lambda prepared, cluster, runtimes, **k: start(prepared, None))
    monkeypatch.setattr(sweep_mod, "EngineAPI", NoEngineAPI)
    monkeypatch.setattr(sweep_mod.bench, "run", bench_run)
    return box


def test_a_server_on_another_docker_host_is_watched_there(tmp_path: Path, started: dict[str, Any]) -> None:
    plan = _plan(tmp_path, "gb10")
    (server,) = plan.servers
    facts = FakeFacts("spark-2", free=100.0, available=110.0, cached=8.0)  # MemFree short of 0.85 x 121.7 = 103.4
    runtime = FakeRuntime("spark-2", facts=facts)
    runtime.kill = lambda name: started["server"].kill()  # type: ignore[method-assign]
    started["during_cell"] = lambda: facts.set(available=2.5)  # the engine climbs past the floor there
    host = Host("spark-2", "ssh://me@spark-2", "spark-2")
    store, run, said = _server_run(tmp_path, plan, server, host, runtime, sweep_mod.Options(time_scale=0.01))
    with store:
        sweep_mod.serve(run)
        (failure,) = store.failures()
    assert facts.evicted == [server.spec.name]  # the model's page cache was dropped on that host
    assert any(line.startswith("memory floor for vllm/none: 3.50 GiB") for line in said), said
    assert failure.kind == "memory-floor" and failure.host == "spark-2"
    assert "MemAvailable fell to 2.5 GiB, under the floor of 3.5 GiB" in failure.message
    assert runtime.facts_asked == [server.spec] and facts.closed


def test_every_node_of_a_pair_is_watched_and_either_stops_the_server(tmp_path: Path, started: dict[str, Any]) -> None:
    plan = _plan(tmp_path, "gb10-pair")
    (server,) = plan.servers
    hosts = [Host("local", "local", None, cluster_address="10.0.0.1", interface="eth1", ib_hca="roce1"),
             Host("spark-2", "ssh://me@spark-2", "spark-2", port_offset=100, cluster_address="10.0.0.2", interface="eth1", ib_hca="roce1")]
    server = fleet.for_hosts(server, hosts)
    head = FakeFacts("this machine", free=110.0, available=112.0, cached=0.0)
    worker = FakeFacts("spark-2", free=100.0, available=110.0, cached=8.0)
    local, remote = FakeRuntime("local", facts=head), FakeRuntime("spark-2", facts=worker)
    killed = threading.Event()
    local.kill = remote.kill = lambda name: (killed.set(), started["server"].kill())  # type: ignore[method-assign]
    started["during_cell"] = lambda: worker.set(available=1.0)  # the worker's Spark runs out, not the head's
    store, run, said = _server_run(tmp_path, plan, server, hosts[0], local, sweep_mod.Options(time_scale=0.01),
                                   partners=[remote], partner_names=["spark-2"])
    with store:
        sweep_mod.serve(run)
        (failure,) = store.failures()
    assert worker.evicted == [server.spec.name] and head.evicted == []  # MemFree was short only on spark-2
    assert any(line.startswith("memory floor for vllm/none on spark-2:") for line in said), said
    assert failure.kind == "memory-floor" and failure.message.startswith("on spark-2: MemAvailable fell to 1.0 GiB")
    assert killed.is_set() and head.closed and worker.closed


def test_a_host_that_cannot_be_read_runs_unwatched_and_says_so(tmp_path: Path, started: dict[str, Any]) -> None:
    plan = _plan(tmp_path, "gb10")
    (server,) = plan.servers
    runtime = FakeRuntime("spark-3", facts=None)
    started["during_cell"] = lambda: started["server"].kill()  # the cell ends without the watchdog
    store, run, said = _server_run(tmp_path, plan, server, Host("spark-3", "ssh://me@spark-3", "spark-3"), runtime)
    with store:
        sweep_mod.serve(run)
    assert "memory on spark-3: not watched (its memory cannot be read from here)" in said
    assert not any(line.startswith("memory floor") for line in said)


def test_a_lost_hosts_memory_reader_is_not_waited_for(tmp_path: Path, started: dict[str, Any], monkeypatch) -> None:
    """The host froze mid-cell: removing its memory reader would wait on it (an ssh connect, 10 s measured in
    tests/docker/test_dead_hosts.py). The server's work goes back to the queue at once; the removal is tried
    meanwhile, and what it cannot remove stays for `sparklab gc --host`. Before: serve() returned after the removal
    gave up."""
    plan = _plan(tmp_path, "gb10")
    (server,) = plan.servers
    release = threading.Event()

    class FrozenFacts(FakeFacts):
        def close(self) -> None:
            release.wait(10)
            super().close()

    facts = FrozenFacts("spark-2", free=110.0, available=112.0, cached=0.0)
    runtime = FakeRuntime("spark-2", facts=facts)

    def lost_mid_cell(*args: object, **kwargs: object) -> None:
        raise fleet.HostLost("the Docker host stopped answering during cell vllm/none")

    monkeypatch.setattr(sweep_mod.bench, "run", lost_mid_cell)
    store, run, said = _server_run(tmp_path, plan, server, Host("spark-2", "ssh://me@spark-2", "spark-2"),
                                   runtime, lost=lambda: True)
    with store:
        began = time.monotonic()
        with pytest.raises(fleet.HostLost):
            sweep_mod.serve(run)
        took = time.monotonic() - began
    release.set()
    assert took < 3, f"serve() returned {took:.1f} s after the loss, when the reader's removal gave up"
    assert any("was running when the host was lost" in line for line in said), said
    deadline = time.monotonic() + 5
    while not facts.closed and time.monotonic() < deadline:  # the removal, tried in the background, ends
        time.sleep(0.02)
    assert facts.closed
