"""A host lost under a server across two hosts: the worker's Spark goes away (power, its ssh, its daemon) while the
head's stays. What the sweep records is the loss of that host, not a fault of the server: a `host_lost` row naming
the worker's host, the cell in flight back to pending with its attempt given back, and the head's host kept for the
rest of the run. Before, only the head's host was asked whether it went away: the worker's loss (the cluster watcher
kills the head when a node stops answering, sparklab/runtimes/cluster.py) was stored as a failed cell or a killed
server, its attempt spent, and the message blamed the kernel's OOM killer (exit code 137).

The hosts are fakes (tests/fakes.py); the start and the bench are stood in for (tests/unit/test_every_host_watched.py's
fixture), so what is tested is the sweep's own bookkeeping (sparklab/sweep/serverrun.py and fleet.py). The whole
path runs for real on the twin: tests/process/test_rehearse.py's `--fault host-lost` night over two hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sparklab.errors import ServerError
from sparklab.recipes.hosts import Host
from sparklab.sweep import fleet
from sparklab.sweep import serverrun as sweep_mod
from sparklab.sweep.store_rows import HOST_LOST
from tests.fakes import FakeRuntime
from tests.unit.test_every_host_watched import _plan, _server_run
from tests.unit.test_every_host_watched import started as started  # the fixture: the start and bench stood in for

HOSTS = [Host("spark-1", "ssh://me@spark-1", "spark-1", cluster_address="10.0.0.1", interface="eth1", ib_hca="roce1"),
         Host("spark-2", "ssh://me@spark-2", "spark-2", port_offset=100, cluster_address="10.0.0.2", interface="eth1",
              ib_hca="roce1")]


def _pair(tmp_path: Path) -> tuple[Any, Any, FakeRuntime, list[str]]:
    """(the store, the ServerRun of the pair on spark-1 with spark-2 as its partner, spark-2's runtime, what it says)"""
    plan = _plan(tmp_path, "gb10-pair")
    server = fleet.for_hosts(plan.servers[0], HOSTS)
    head, worker = FakeRuntime("spark-1", facts=None), FakeRuntime("spark-2", facts=None)
    store, run, said = _server_run(tmp_path, plan, server, HOSTS[0], head, sweep_mod.Options(time_scale=0.01),
                                   partners=[worker], partner_names=["spark-2"], lost=lambda: not head.up)
    return store, run, worker, said


def test_the_workers_host_lost_mid_cell_is_a_lost_host_not_a_failed_cell(tmp_path: Path,
                                                                          started: dict[str, Any]) -> None:
    store, run, worker, said = _pair(tmp_path)

    def worker_host_goes() -> None:  # the worker's Spark goes; the cluster watcher then kills the head
        worker.up = False
        started["server"].kill()

    started["during_cell"] = worker_host_goes
    _served_and_lost_spark_2(store, run)
    assert any("was running when the host was lost" in line for line in said), said


def _served_and_lost_spark_2(store: Any, run: Any) -> None:
    """serve() raises HostLost naming spark-2 only, whose loss is the one failure stored; no attempt is spent."""
    with store:
        with pytest.raises(fleet.HostLost) as raised:
            sweep_mod.serve(run)
        failures = store.failures()
        cells = store.cells()
    assert raised.value.hosts == ("spark-2",)
    assert [(f.kind, f.host) for f in failures] == [(HOST_LOST, "spark-2")], failures
    assert "spark-2" in failures[0].message and "out of memory" not in failures[0].message
    assert [(c.status, c.attempts) for c in cells] == [("pending", 0)]  # its attempt given back


def test_the_workers_host_lost_during_the_start_is_a_lost_host_not_a_killed_server(
        tmp_path: Path, started: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    store, run, worker, _ = _pair(tmp_path)

    def start(*args: object, **kwargs: object) -> None:  # what cluster.start raises when a node ends before ready
        worker.up = False
        raise ServerError("the server container exited with code 137 (SIGKILL with no Python traceback in the log: "
                          "most likely out of memory) before it was ready")

    monkeypatch.setattr(sweep_mod.cluster, "start", start)
    _served_and_lost_spark_2(store, run)


def test_a_fault_of_the_server_with_both_hosts_answering_is_still_the_servers(
        tmp_path: Path, started: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The other side: both hosts answer, so a start that fails is the server's failure, charged as before."""
    store, run, _, _ = _pair(tmp_path)

    def start(*args: object, **kwargs: object) -> None:
        raise ServerError("the server container exited with code 137 before it was ready")

    monkeypatch.setattr(sweep_mod.cluster, "start", start)
    with store:
        sweep_mod.serve(run)
        failures = store.failures()
    assert [(f.kind, f.host) for f in failures] == [("container", "spark-1")], failures


def test_a_pair_whose_worker_host_is_lost_leaves_the_head_host_serving(tmp_path: Path) -> None:
    """fleet.run: the loss names the worker's host only, so the head's host stays in the run and serves what needs
    one host, and the pair's cells wait (no two hosts left), said in one line."""
    from tests.unit.test_hosts import _linked, _pair_plan

    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    members = [_linked("spark-1", "10.0.0.1"), _linked("spark-2", "10.0.0.2")]
    said: list[str] = []

    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any, partners: list[fleet.Member] = ()) -> None:
        members[1].runtime.up = False  # type: ignore[attr-defined]
        hstore.host_lost(server.id, "spark-2", "spark-2 stopped answering")
        raise fleet.HostLost("spark-2 stopped answering", hosts=("spark-2",))

    with store:
        fleet.run(plan, store, members, serve, said.append, "r1")
        assert store.counts()["pending"] == len(plan.cells)
        assert [(f.kind, f.host) for f in store.failures()] == [(HOST_LOST, "spark-2")]  # no fault of the server's
    assert members[0].lost is None, said
    assert members[1].lost is not None
    assert any("host spark-2 lost: server" in s and "goes back to the queue" in s for s in said), said
    assert any("no host could take it" in s and "spark-1: the server needs 2 hosts" in s for s in said), said


def test_scoring_across_two_hosts_that_loses_the_workers_host_keeps_the_heads(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The lossless check's last start (the pair's `none`, only to score): its worker's host lost marks that host
    lost, not the head's."""
    from sparklab.sweep import runner
    from tests.unit.test_hosts import _linked, _pair_plan

    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    monkeypatch.setattr(runner.lossless, "engines_with_pending", lambda plan, store: ["vllm"])

    def serve(run: Any) -> None:
        raise fleet.HostLost("the Docker host of spark-2 stopped answering", hosts=("spark-2",))

    monkeypatch.setattr(runner, "serve", serve)
    members = [_linked("spark-1", "10.0.0.1"), _linked("spark-2", "10.0.0.2")]
    said: list[str] = []
    with store:
        runner._score_the_rest(plan, store, members, store.path.parent, runner.Options(), said.append, {}, None)
    assert members[0].lost is None and members[1].lost, said
    assert any(line.startswith("[spark-2] lost:") for line in said), said


def test_a_cell_that_kept_some_answers_when_the_workers_host_went_is_not_charged_as_partial(
        tmp_path: Path, started: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The head killed mid-cell after one of its requests had finished: 1 ok, 5 failed. Seen in CI (2026-12-05,
    tests/docker/test_pair.py's frozen worker): the cell was stored `partial`, its attempt spent, because only a
    cell whose every request failed asked whether a host had gone."""
    store, run, worker, _ = _pair(tmp_path)

    def some_answers(*args: object, **kwargs: object) -> dict[str, Any]:
        worker.up = False
        started["server"].kill()
        return {"measurement": {"window_started_at": 0.0},
                "summary": {"requests": {"ok": 1, "measured": 6, "failed": 5,
                                         "first_errors": ["3x ConnectionRefusedError"]}, "aggregate_tps": 1.0}}

    monkeypatch.setattr(sweep_mod.bench, "run", some_answers)
    monkeypatch.setattr(sweep_mod.bench, "add_log_acceptance", lambda *a, **k: None)
    _served_and_lost_spark_2(store, run)
