"""Docker hosts: how a sweep file and --host name them, what fits where, and the scheduler over several hosts
(a fake runtime per host: one server per host at a time, a lost host gives its cells back)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparklab.errors import PreflightError, RecipeError
from sparklab.recipes.hosts import LOCAL, HostEntry, parse_hosts, redact_url
from sparklab.recipes.plan import build_plan
from sparklab.recipes.sweep_file import load_sweep
from sparklab.sweep import fleet
from sparklab.sweep.store import Store
from sparklab.sweep.store_rows import PlannedCell
from tests.fakes import FakeRuntime


def test_hosts_are_named_addressed_and_given_their_own_port_ranges() -> None:
    hosts = parse_hosts(["local", "ssh://root@127.0.0.1:22022", "ssh://me@spark-2",
                         HostEntry(docker="tcp://spark-3:2376", tls_dir="~/certs", name="three"), "spark-4"], "f.yaml")
    assert [h.name for h in hosts] == ["local", "127.0.0.1:22022", "spark-2", "three", "spark-4"]
    assert [h.address for h in hosts] == [None, "127.0.0.1", "spark-2", "spark-3", None]
    # 127.0.0.1:22022 shares this machine's address: its servers get ports 100 up; other machines keep theirs
    assert [h.port_offset for h in hosts] == [0, 100, 0, 0, 0]
    assert hosts[0].local and not hosts[1].local and not hosts[1].remote_address and hosts[2].remote_address


@pytest.mark.parametrize(("entries", "says"), [
    (["http://spark-2"], "hosts[0]: 'http://spark-2' is not a Docker host"),
    (["ssh://"], "hosts[0]: 'ssh://' names no host"),
    (["ssh://a@spark-2", "ssh://b@spark-2"], "hosts[1]: a second host named 'spark-2'"),
    ([HostEntry(docker="local"), HostEntry(docker="ssh://r@127.0.0.1:2", port_offset=0)], "both use port_offset 0"),
    (["not a context"], "is not a Docker host"),
])
def test_bad_hosts_are_errors_naming_the_file_and_the_entry(entries: list[Any], says: str) -> None:
    with pytest.raises(RecipeError) as caught:
        parse_hosts(entries, "sweeps/two.yaml")
    assert caught.value.message.startswith("sweeps/two.yaml: hosts") and says in caught.value.message
    assert caught.value.hint


def test_a_sweep_file_rejects_unknown_host_keys_with_the_path(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "recipe": "gb10", "methods": ["none"], "concurrency": [1],
                                    "hosts": [{"docker": "ssh://r@spark-2", "adress": "10.0.0.2"}]}))
    with pytest.raises(RecipeError) as caught:
        load_sweep(path)
    assert str(path) in caught.value.message and "hosts" in caught.value.message and "adress" in caught.value.message


def test_a_url_password_never_reaches_results() -> None:
    assert redact_url("ssh://me:hunter22@spark-2:22") == "ssh://me:***@spark-2:22"
    assert redact_url("ssh://me@spark-2") == "ssh://me@spark-2" and redact_url("spark-ctx") == "spark-ctx"


# -- the planner and scheduler, with a fake runtime per host ----------------------------------------------------


def _member(name: str, arch: str = "x86_64", mem: float = 64.0, images: dict[str, str] | None = None,
            offset: int = 0) -> fleet.Member:
    host = LOCAL if name == "local" else parse_hosts([f"ssh://r@{name}"], "t")[0]
    host = type(host)(host.name, host.docker, host.address, offset, "host")
    return fleet.Member(host, FakeRuntime(name, arch=arch, images=images), {"architecture": arch, "mem_total_gib": mem})


@pytest.fixture
def plan(tmp_path: Path) -> Any:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({
        "name": "t", "recipe": "gb10", "methods": ["none", "dspark"], "num_speculative_tokens": [2, 3],
        "concurrency": [1, 2], "requests": 2, "set": ["engines.vllm.image=example/standin:1", "unified_memory=false"]}))
    return build_plan(path, run_id="r1")


@pytest.fixture
def store(tmp_path: Path, plan: Any) -> Any:
    s = Store.create(tmp_path / "r" / "results.sqlite", {}, "test")
    for server in plan.servers:
        s.add_server_config(server.id, engine=server.engine, method=server.method, k=server.num_speculative_tokens,
                            config={}, argv=[], image=server.spec.image)
    s.add_cells(PlannedCell(c.id, server.id, c.concurrency, c.workload, c.repeat, {})
                for server in plan.servers for c in server.cells)
    yield s
    s.close()


def test_a_host_gets_only_configs_its_platform_and_memory_meet(plan: Any) -> None:
    server = plan.servers[0]
    assert fleet.unfit(server, _member("spark-2", "aarch64", images={server.spec.image: "arm64"})) is None
    assert "is for arm64, the host is amd64" in (fleet.unfit(server, _member("pc", images={server.spec.image: "arm64"}))
                                                 or "")
    big = server.recipe.model_copy(update={"min_available_gib": 100.0})
    assert "needs 100 GiB, the host has 64 GiB" in (fleet.unfit(type(server)(**{**server.__dict__, "recipe": big}),
                                                                _member("spark-2")) or "")


def test_a_host_whose_port_offset_pushes_a_port_past_65535_gets_no_config(plan: Any) -> None:
    server = plan.servers[0]  # seen in CI: a second host's offset took a server to port 67307, found at its start
    far = 65536 - server.spec.port
    assert f"port {server.spec.port} + port_offset {far} = 65536 is not a TCP port" in (
        fleet.unfit(server, _member("spark-2", images={server.spec.image: "amd64"}, offset=far)) or "")
    assert fleet.unfit(server, _member("spark-2", images={server.spec.image: "amd64"}, offset=far - 1)) is None


def test_a_host_gets_no_config_whose_image_it_cannot_have(plan: Any) -> None:
    server = plan.servers[0]
    gone = type(server)(**{**server.__dict__, "spec": type(server.spec)(**{**server.spec.__dict__,
                                                                            "image": "gone/engine:1",
                                                                            "image_alternatives": ()})})
    assert "gone/engine:1 cannot be pulled there" in (fleet.unfit(gone, _member("spark-2")) or "")
    never = _member("spark-2")
    never.pull_policy = "never"
    assert fleet.unfit(server, never) is not None
    assert fleet.unfit(server, _member("spark-2", images={server.spec.image: "amd64"})) is None


def test_another_host_serves_on_its_port_range_at_its_address(plan: Any) -> None:
    server = plan.servers[0]
    moved = fleet.for_host(server, _member("spark-2", offset=100).host)
    assert moved.id == server.id and moved.cells == server.cells  # same config, same cells: resume works
    assert moved.spec.port == server.spec.port + 100 and moved.spec.endpoint == f"http://spark-2:{server.spec.port + 100}"
    assert moved.spec.host == "0.0.0.0" and moved.spec.labels["sparklab.endpoint"] == moved.spec.endpoint
    assert str(server.spec.port + 100) in moved.spec.argv
    assert fleet.for_host(server, LOCAL) is server


def test_configs_spread_over_hosts_one_server_per_host_at_a_time(plan: Any, store: Any) -> None:
    members = [_member("local"), _member("spark-2")]
    active: dict[str, int] = {}
    ran: list[tuple[str, str]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(2, timeout=5)

    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any) -> None:
        with lock:
            active[member.name] = active.get(member.name, 0) + 1
            assert active[member.name] == 1  # never two servers on one host
            ran.append((member.name, server.id))
        if len(ran) <= 2:
            barrier.wait()  # both hosts busy at once
        for cell in server.cells:
            hstore.start_cell(cell.id)
            hstore.finish_cell(cell.id, {}, {})
        with lock:
            active[member.name] -= 1

    fleet.run(plan, store, members, serve, lambda m: None, "r1")
    assert sorted(s for _, s in ran) == sorted(s.id for s in plan.servers)  # each config once
    assert {h for h, _ in ran} == {"local", "spark-2"}
    assert store.counts()["done"] == len(plan.cells)
    by_server = {s: h for h, s in ran}
    assert all(c.host == by_server[c.server_config_id] for c in store.cells())


def test_a_lost_host_gives_its_configs_back_to_the_others(plan: Any, store: Any) -> None:
    local, remote = _member("local"), _member("spark-2")
    said: list[str] = []
    started = threading.Event()

    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any) -> None:
        if member is remote:
            first = server.cells[0]
            hstore.start_cell(first.id)
            hstore.finish_cell(first.id, {}, {})  # finished before the loss: kept
            hstore.start_cell(server.cells[1].id)
            remote.runtime.up = False  # type: ignore[attr-defined]
            hstore.host_lost(server.id, hstore.host, "daemon gone")
            started.set()
            raise fleet.HostLost("daemon gone")
        started.wait(5)
        for cell in server.cells:
            if hstore.cell(cell.id).status == "pending":
                hstore.start_cell(cell.id)
                hstore.finish_cell(cell.id, {}, {})

    fleet.run(plan, store, [local, remote], serve, said.append, "r1")
    assert store.counts()["done"] == len(plan.cells) and store.counts()["pending"] == 0
    assert remote.lost == "daemon gone" and any("goes back to the queue" in s for s in said)
    hosts = [c.host for c in store.cells()]
    assert hosts.count("spark-2") == 1 and hosts.count("local") == len(hosts) - 1
    assert [f.kind for f in store.failures()] == ["host_lost"]


def test_a_config_no_host_can_take_stays_pending_and_says_why(plan: Any, store: Any) -> None:
    said: list[str] = []
    arm = _member("spark-2", "aarch64", images={plan.servers[0].spec.image: "amd64"})
    fleet.run(plan, store, [arm], lambda *a: pytest.fail("nothing fits"), said.append, "r1")
    assert store.counts()["pending"] == len(plan.cells)
    assert len([s for s in said if "no host could take it" in s and "is for amd64" in s]) == len(plan.servers)


def test_no_reachable_host_is_a_preflight_error() -> None:
    said: list[str] = []
    with pytest.raises(PreflightError):
        fleet.connect(parse_hosts(["ssh://nobody@127.0.0.1:1"], "t"), said.append)
    assert said and "left out of this run" in said[0]


def test_the_command_line_names_a_bad_host_in_one_paragraph(tmp_path: Path, capsys: Any) -> None:
    from sparklab.cli.main import main

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "s", "recipe": "gb10", "methods": ["none"], "concurrency": [1],
                                    "hosts": ["local", "ssh://me@spark-2"]}))
    assert main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "local = local, spark-2 = ssh://me@spark-2" in out and "on one host" in out
    assert main(["sweep", str(path), "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--host", "http://x"]) == 2
    err = capsys.readouterr().err
    assert "--host: hosts[0]: 'http://x' is not a Docker host" in err and "Traceback" not in err


def test_a_fault_outside_the_server_fails_that_config_only(plan: Any, store: Any) -> None:
    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any) -> None:
        if server.id == plan.servers[0].id:
            raise RecipeError("port 70000 is not a TCP port")
        for cell in server.cells:
            hstore.start_cell(cell.id)
            hstore.finish_cell(cell.id, {}, {})

    said: list[str] = []
    fleet.run(plan, store, [_member("local"), _member("spark-2")], serve, said.append, "r1")
    first = {c.id for c in plan.servers[0].cells}
    assert all(c.status == ("pending" if c.id in first else "done") for c in store.cells())
    assert any("failed (error): port 70000" in s for s in said)
    assert [(f.kind, f.server_config_id) for f in store.failures()] == [("error", plan.servers[0].id)]


def test_a_full_disk_on_the_controller_stops_every_host(plan: Any, store: Any) -> None:
    from sparklab.errors import DiskFullError

    members = [_member("local"), _member("spark-2")]

    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any) -> None:
        raise DiskFullError("the disk holding results.sqlite is full")

    with pytest.raises(DiskFullError):
        fleet.run(plan, store, members, serve, lambda m: None, "r1")
    assert all(m.runtime.removed_runs == ["r1"] for m in members)  # type: ignore[attr-defined]  # both came down


# -- a server across two hosts (recipes/gb10-pair.yaml) -----------------------------------------------------------


def _linked(name: str, address: str) -> fleet.Member:
    text = "local" if name == "local" else f"ssh://r@{name}"
    (host,) = parse_hosts([f"{text},cluster_address={address},interface=eth1,ib_hca=hca1"], "t")
    return fleet.Member(host, FakeRuntime(name), {"architecture": "x86_64", "mem_total_gib": 64.0})


def _pair_plan(tmp_path: Path, store_path: Path) -> tuple[Any, Store]:
    path = tmp_path / "pair.yaml"
    path.write_text(yaml.safe_dump({
        "name": "p", "recipe": "gb10-pair", "engines": ["vllm", "sglang"], "methods": ["none", "dspark"],
        "num_speculative_tokens": [3], "concurrency": [1], "requests": 2,
        "set": ["engines.vllm.image=example/standin:2", "engines.sglang.image=example/standin:2",
                "unified_memory=false"]}))
    plan = build_plan(path, run_id="r1")
    store = Store.create(store_path, {}, "test")
    for server in plan.servers:
        store.add_server_config(server.id, engine=server.engine, method=server.method,
                                k=server.num_speculative_tokens, config={}, argv=[], image=server.spec.image)
    store.add_cells(PlannedCell(c.id, server.id, c.concurrency, c.workload, c.repeat, {})
                    for server in plan.servers for c in server.cells)
    return plan, store


def test_a_server_across_two_hosts_gets_two_idle_hosts_and_they_serve_nothing_else_meanwhile(tmp_path: Path) -> None:
    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    members = [_linked("local", "10.0.0.1"), _linked("spark-2", "10.0.0.2"), _linked("spark-3", "10.0.0.3")]
    serving: dict[str, str] = {}  # host -> server id it serves now (as head or worker)
    runs: list[tuple[str, ...]] = []
    lock = threading.Lock()

    def serve(member: fleet.Member, server: Any, hstore: Any, say: Any, partners: list[fleet.Member] = ()) -> None:
        hosts = [member.name, *(p.name for p in partners)]
        with lock:
            assert not set(hosts) & set(serving), (hosts, serving)  # no host serves two at once
            serving.update(dict.fromkeys(hosts, server.id))
            runs.append(tuple(hosts))
        assert server.cluster is not None and [h.name for h in server.cluster.hosts] == hosts
        assert server.cluster.head_address == member.host.cluster_address and server.spec is server.cluster.head
        for cell in server.cells:
            hstore.start_cell(cell.id)
            hstore.finish_cell(cell.id, {}, {})
        with lock:
            for host in hosts:
                del serving[host]

    with store:
        fleet.run(plan, store, members, serve, lambda m: None, "r1")
        assert store.counts()["done"] == len(plan.cells) == 4
    assert len(runs) == len(plan.servers) == 4 and all(len(hosts) == 2 for hosts in runs)


def test_a_server_across_two_hosts_waits_when_only_one_host_can_hold_it(tmp_path: Path) -> None:
    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    said: list[str] = []

    def serve(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("no pair of hosts: nothing may start")

    with store:
        fleet.run(plan, store, [_linked("local", "10.0.0.1")], serve, said.append, "r1")
        assert store.counts()["pending"] == 4
    assert sum("needs 2 hosts that can hold it" in s and "stay pending" in s for s in said) == 4



def _scoring(monkeypatch: pytest.MonkeyPatch, engines: list[str]) -> list[Any]:
    """The lossless check's last starts (sparklab.sweep.runner._score_the_rest), each as the ServerRun it serves."""
    from sparklab.sweep import runner

    served: list[Any] = []
    monkeypatch.setattr(runner.lossless, "engines_with_pending", lambda plan, store: engines)
    monkeypatch.setattr(runner, "serve", served.append)
    return served


def _score(plan: Any, store: Any, members: list[fleet.Member], said: list[str] | None = None) -> None:
    from sparklab.sweep import runner

    runner._score_the_rest(plan, store, members, store.path.parent, runner.Options(),
                           (said if said is not None else []).append, {}, None)


def test_the_none_server_that_only_scores_runs_on_the_hosts_ports(plan: Any, store: Any,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The lossless check's last start (`none` again, no cells, only to score the drafting configs' answers) is
    rendered for its host like every other start: a local host's port_offset moves its port. Seen in CI: a tune
    rehearsal's scoring server bound the recipe's own 8000, which another rehearsal had claimed, and each night's
    servers answered the other's requests with a 401."""
    served = _scoring(monkeypatch, ["vllm"])
    local = fleet.this_machine(FakeRuntime(), host=parse_hosts([HostEntry(docker="local", port_offset=107)],
                                                               "f.yaml")[0])
    _score(plan, store, [local])
    none = next(s for s in plan.servers if s.method == "none")
    assert [r.server.id for r in served] == [none.id] and served[0].cells == []
    assert served[0].server.spec.port == none.spec.port + 107


def test_scoring_prefers_this_machine_and_runs_on_another_host_when_the_sweep_has_no_local_one(
        plan: Any, store: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before, a sweep whose hosts were all other machines never scored: its drafting answers stayed unscored and
    the report said `the scoring server did not run`, which the next run would not change."""
    served = _scoring(monkeypatch, ["vllm"])
    _score(plan, store, [_linked("spark-2", "10.0.0.2"), _linked("local", "10.0.0.1")])
    assert [r.host.name for r in served] == ["local"]
    served.clear()
    _score(plan, store, [_linked("spark-2", "10.0.0.2"), _linked("spark-3", "10.0.0.3")])
    assert [r.host.name for r in served] == ["spark-2"] and served[0].server.spec.address == "spark-2"


def test_scoring_a_server_across_two_hosts_runs_it_across_two(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A pair's `none` (tensor parallel over two Sparks) scores as it serves: head and worker on two hosts. Before,
    it was started on this machine alone (or, with no `local` host, not at all)."""
    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    served = _scoring(monkeypatch, ["vllm"])
    with store:
        _score(plan, store, [_linked("spark-1", "10.0.0.1"), _linked("spark-2", "10.0.0.2")])
    (run,) = served
    assert run.server.method == "none" and run.server.engine == "vllm" and run.cells == []
    assert run.host.name == "spark-1" and run.partner_names == ["spark-2"] and len(run.partners) == 1
    assert run.server.cluster is not None and [h.name for h in run.server.cluster.hosts] == ["spark-1", "spark-2"]


def test_scoring_that_needs_more_hosts_than_are_left_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan, store = _pair_plan(tmp_path, tmp_path / "r" / "results.sqlite")
    served = _scoring(monkeypatch, ["vllm"])
    gone = _linked("spark-2", "10.0.0.2")
    gone.lost = "the Docker host stopped answering"
    said: list[str] = []
    with store:
        _score(plan, store, [_linked("spark-1", "10.0.0.1"), gone], said)
    assert not served
    assert any("vllm/none" in line and "needs 2 hosts" in line and "not scored" in line for line in said), said
