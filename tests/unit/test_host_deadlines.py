"""Every check of another host is bounded and they run side by side (issue 27, item 1): a host that does not answer
is left out with one line in seconds while the others start, a liveness ping says "no" in seconds, and a health
check that hangs does not hold a cell. The hosts here are fakes whose Docker calls block until the test ends; the
real ssh cases (a silent listener, a closed port, a host frozen mid-sweep) are in tests/docker/test_dead_hosts.py."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest

from sparklab.bench import sse
from sparklab.cli import hosts as cli_hosts
from sparklab.errors import ContainerError, PreflightError
from sparklab.recipes.hosts import parse_hosts
from sparklab.runtimes import containers
from sparklab.sweep import fleet
from tests.fakes import FakeRuntime

T = TypeVar("T")


def _finishes(seconds: float, call: Callable[[], T]) -> tuple[T, float]:
    """(what call returned, the seconds it took); fails the test if it is still going after `seconds`."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(("ok", call()))
        except BaseException as exc:  # handed to the test's thread
            box.append(("raised", exc))

    began = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    if not box:
        pytest.fail(f"still waiting after {seconds:g} s")
    kind, value = box[0]
    if kind == "raised":
        raise value
    return value, time.monotonic() - began


@pytest.fixture
def silent_hosts(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, FakeRuntime]]:
    """Docker.connect answers for the URLs in the returned dict and blocks (until the test ends) for any other:
    a host whose ssh accepted the connection and never spoke."""
    answering: dict[str, FakeRuntime] = {}
    release = threading.Event()

    def connect(url: str, tls_dir: str | None = None, *args: Any, **kwargs: Any) -> FakeRuntime:
        if url in answering:
            return answering[url]
        release.wait()
        raise ContainerError(f"cannot reach the Docker host {url}: released by the test")

    monkeypatch.setattr(containers.Docker, "connect", staticmethod(connect))
    yield answering
    release.set()


def test_a_silent_host_is_left_out_in_seconds_while_the_others_start(silent_hosts: dict[str, FakeRuntime]) -> None:
    """Two silent hosts and one that answers: checked side by side, the two cost one bound, not two."""
    silent_hosts["ssh://r@spark-2"] = FakeRuntime("spark-2")
    hosts = parse_hosts(["local", "ssh://r@dead-1", "ssh://r@spark-2", "ssh://r@dead-2"], "--host")
    said: list[str] = []
    members, seconds = _finishes(30, lambda: fleet.connect(hosts, said.append, local=FakeRuntime(), check_s=1.0))
    assert [m.name for m in members] == ["local", "spark-2"]
    assert seconds < 1.9, f"{seconds:.2f} s: the hosts were not checked side by side"
    out = [line for line in said if "left out" in line]
    assert out == [f"host dead-{i}: left out of this run: no answer within 1 s; check `docker -H ssh://r@dead-{i} "
                   "info`" for i in (1, 2)]
    assert all("\n" not in line for line in said)


def test_no_host_answering_in_time_is_a_preflight_error_in_seconds(silent_hosts: dict[str, FakeRuntime]) -> None:
    hosts = parse_hosts(["ssh://r@dead-1", "ssh://r@dead-2"], "--host")
    said: list[str] = []
    with pytest.raises(PreflightError, match="no Docker host of this sweep can be reached"):
        _finishes(30, lambda: fleet.connect(hosts, said.append, check_s=0.5))
    assert len(said) == 2


def test_a_host_whose_facts_never_come_is_left_out_too(silent_hosts: dict[str, FakeRuntime]) -> None:
    """It answered the connect, then hung on `docker info`: the whole check is bounded, not the connect alone."""
    hanging = FakeRuntime("spark-3")
    never = threading.Event()
    hanging.facts = lambda: never.wait() or {}  # type: ignore[method-assign]
    silent_hosts["ssh://r@spark-3"] = hanging
    silent_hosts["ssh://r@spark-2"] = FakeRuntime("spark-2")
    hosts = parse_hosts(["ssh://r@spark-3", "ssh://r@spark-2"], "--host")
    said: list[str] = []
    try:
        members, _ = _finishes(30, lambda: fleet.connect(hosts, said.append, check_s=0.5))
    finally:
        never.set()
    assert [m.name for m in members] == ["spark-2"]
    assert any(line.startswith("host spark-3: left out of this run: no answer within 0.5 s") for line in said)


class _Console:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, *objects: Any, **kwargs: Any) -> None:
        self.lines.append(" ".join(str(o) for o in objects))


def test_ps_down_logs_and_gc_reach_their_hosts_side_by_side_and_name_a_silent_one(
        silent_hosts: dict[str, FakeRuntime]) -> None:
    silent_hosts["ssh://r@spark-2"] = FakeRuntime("spark-2")
    hosts = parse_hosts(["ssh://r@dead-1", "ssh://r@spark-2", "ssh://r@dead-2"], "--host")
    err = _Console()
    reached, seconds = _finishes(30, lambda: cli_hosts.reach(hosts, err, check_s=1.0))
    assert [host.name for host, _ in reached] == ["spark-2"]
    assert seconds < 1.9
    assert err.lines == [f"host dead-{i}: unreachable (no answer within 1 s; check `docker -H ssh://r@dead-{i} info`)"
                         for i in (1, 2)]


def test_up_across_hosts_names_a_silent_host_in_seconds_and_asks_them_side_by_side(
        silent_hosts: dict[str, FakeRuntime]) -> None:
    """`up --host A --host B` (a server across hosts needs each one): the hosts are asked at once, and one that never
    answers is an error naming it within the bound. Before: they were connected one after another with no bound."""
    silent_hosts["ssh://r@spark-2"] = FakeRuntime("spark-2")
    hosts = parse_hosts(["ssh://r@spark-2", "ssh://r@dead-1", "ssh://r@dead-2"], "--host")
    with pytest.raises(ContainerError) as caught:
        _finishes(30, lambda: cli_hosts.connect_every(hosts, check_s=0.5))
    assert caught.value.message == "host dead-1: no answer within 0.5 s; check `docker -H ssh://r@dead-1 info`"
    assert "needs every one" in (caught.value.hint or "")
    silent_hosts["ssh://r@dead-1"] = silent_hosts["ssh://r@dead-2"] = FakeRuntime("late")
    # every host answers: connected without waiting out the bound (5 s here, so a loaded machine's slower thread
    # starts cannot pass for the wait: this failed once at 0.5 s beside a sweep of the real engine)
    reached, seconds = _finishes(30, lambda: cli_hosts.connect_every(hosts, check_s=5.0))
    assert len(reached) == 3 and seconds < 2.5


class _HangingPing:
    """A docker-py client whose daemon never answers a ping (ssh up, dockerd hung)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def ping(self) -> bool:
        self.release.wait()
        return True


def test_a_liveness_ping_says_no_within_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from sparklab.runtimes import deadlines

    monkeypatch.setattr(deadlines, "ALIVE_S", 0.5)
    client = _HangingPing()
    try:
        answer, seconds = _finishes(30, containers.Docker(client).alive)  # type: ignore[arg-type]
    finally:
        client.release.set()
    assert answer is False and seconds < 1.5


def test_a_hung_health_check_does_not_hold_the_cell(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall detector asks `alive` in a thread and gives up after HEALTH_CHECK_TIMEOUT_S; before, the cell's
    event loop still waited for that thread when it closed (asyncio.run joins its executor), so a check stuck on
    a dead host held the cell as long as the check hung."""
    monkeypatch.setattr(sse, "HEALTH_CHECK_TIMEOUT_S", 0.3)
    release = threading.Event()

    def hung() -> bool:
        release.wait(20)
        return True

    async def ask() -> bool:
        return await sse.ask_alive(hung)

    try:
        answer, seconds = _finishes(30, lambda: asyncio.run(ask()))
    finally:
        release.set()
    assert answer is False and seconds < 2, f"{seconds:.1f} s"


@pytest.mark.parametrize("when", ["mid-cell", "between cells"])
def test_a_cell_whose_host_goes_away_runs_again_uncharged_and_no_teardown_waits_on_the_host(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    """The host froze mid-cell (its requests fail, and so does its daemon's ping), or before the next cell (the
    server's state check fails). Before: the cell was charged an attempt as a bench error, and the teardown then
    waited on the silent host (ssh had no timeout: for ever)."""
    from sparklab.sweep import serverrun as sweep_mod
    from sparklab.sweep.hoststore import HostStore
    from sparklab.sweep.store import Store
    from tests.fakes import one_server_sweep

    made = one_server_sweep(tmp_path, monkeypatch, [1, 2])
    plan, server, store, fake = made.plan, made.server, made.store, made.fake
    monkeypatch.setattr(sweep_mod.engine(server.spec.kind), "served_facts", lambda api: {})
    monkeypatch.setattr(sweep_mod.engine(server.spec.kind), "version", lambda api: None)
    host = parse_hosts(["ssh://r@spark-2"], "t")[0]
    gone = threading.Event()

    def bench_run(*args: object, **kwargs: object) -> None:
        gone.set()  # the host freezes now
        raise ConnectionError("timed out")

    def state() -> tuple[bool, int | None]:
        if gone.is_set():
            raise ConnectionError("Connection to 127.0.0.1 port 22 timed out")
        return True, None

    if when == "between cells":
        gone.set()
    fake.state = state  # type: ignore[method-assign]

    monkeypatch.setattr(sweep_mod.bench, "run", bench_run)
    said: list[str] = []
    with store, pytest.raises(fleet.HostLost):
        sweep_mod.serve(sweep_mod.ServerRun(plan, HostStore(store, host="spark-2"), FakeRuntime("spark-2"), tmp_path,
                                            sweep_mod.Options(), said.append, host, server, list(server.cells),
                                            lost=gone.is_set))
    with Store.open(tmp_path / "results.sqlite") as again:
        rows = {c.id: c for c in again.cells()}
        kinds = [f.kind for f in again.failures()]
    assert [rows[c.id].status for c in server.cells] == ["pending", "pending"]
    assert [rows[c.id].attempts for c in server.cells] == [0, 0]  # the host's fault, not the cell's
    assert kinds == ["host_lost"]
    assert not any(e.startswith("stop") for e in fake.events)  # no teardown waited on the silent host
    ran = any("was running when the host was lost; it runs again" in line for line in said)
    assert ran == (when == "mid-cell")
