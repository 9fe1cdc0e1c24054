"""The runtime contract (sparklab/runtimes/base.py): every server and every runtime, and the tests' one fake of each
(tests/fakes.py), hold to the Protocols they are used as.

Modelled on testcontainers-python's tests/core/test_protocol_compliance.py (c958e40), which checks that each
container kind has the Protocol's members and can be passed where the Protocol is expected. Here each member's
signature is compared with the Protocol's too (names, kinds and defaults: a renamed or reordered parameter fails),
the implementations are checked as instances (members set in __init__ count), and mypy checks the same
assignments structurally, types included."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sparklab.recipes.hosts import parse_hosts
from sparklab.recipes.multinode import render_cluster
from sparklab.recipes.render import LaunchOptions
from sparklab.recipes.schema import load_recipe, recipes_dir
from sparklab.runtimes import base, cluster, container_server, containers, local, processes
from sparklab.runtimes.runfiles import RunRecord
from tests.fakes import FakeRuntime, FakeServer, spec_named

REPO = Path(__file__).resolve().parents[2]


def _docker() -> containers.Docker:
    return containers.Docker(SimpleNamespace(sparklab_url="local"))  # a client is given: nothing is reached


def _container_server() -> container_server.Server:
    container = SimpleNamespace(name="c", id="abc", attrs={"Config": {}})
    return container_server.Server(_docker(), container, spec_named("c"), None)


def _process_server(tmp_path: Path) -> processes.ProcessServer:
    record = RunRecord("p", 0, None, {}, [], str(tmp_path / "p.log"), 0, "")
    return processes.ProcessServer(processes.Processes(), record, spec_named("p"), tmp_path / "p.log", None)


def _cluster_server() -> cluster.ClusterServer:
    hosts = parse_hosts([f"{h},cluster_address=10.0.0.{i},interface=eth1,ib_hca=hca1"
                         for i, h in enumerate(("local", "ssh://me@spark-2"), start=1)], "t")
    spec = render_cluster(load_recipe(recipes_dir() / "gb10-pair.yaml"), "vllm", "none", LaunchOptions(), hosts)
    server = cluster.ClusterServer(spec)
    server.add(FakeServer("head"))
    return server


SERVERS = {
    "container_server.Server": lambda tmp: _container_server(),
    "processes.ProcessServer": _process_server,
    "cluster.ClusterServer": lambda tmp: _cluster_server(),
    "tests.fakes.FakeServer": lambda tmp: FakeServer("fake"),
}
RUNTIMES = {
    "containers.Docker": _docker,
    "processes.Processes": processes.Processes,
    "local.Runtime": lambda: local.Runtime(docker=_docker()),
    "tests.fakes.FakeRuntime": FakeRuntime,
}
HOST_RUNTIMES = ("containers.Docker", "local.Runtime", "tests.fakes.FakeRuntime")


def _members(protocol: type) -> dict[str, Any]:
    """The Protocol's own members (with its bases'): methods, properties and __enter__/__exit__."""
    found: dict[str, Any] = {}
    for klass in reversed(protocol.__mro__):
        if klass in (object,) or not getattr(klass, "_is_protocol", False) or klass.__module__ == "typing":
            continue
        for name, value in vars(klass).items():
            if (not name.startswith("_") or name in ("__enter__", "__exit__")) and (
                    inspect.isfunction(value) or isinstance(value, property)):
                found[name] = value
    return found


def _params(function: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()][1:]  # no self


def violations(protocol: type, instance: object) -> list[str]:
    """How an instance falls short of a Protocol: a missing member, a method where a value is asked for (or the
    reverse), a parameter missing, renamed, reordered or with another default, or an extra one without default."""
    wrong = []
    for name, member in _members(protocol).items():
        if not hasattr(instance, name):
            wrong.append(f"{name}: missing")
            continue
        if isinstance(member, property):
            if inspect.ismethod(getattr(instance, name)):
                wrong.append(f"{name}: a method, the Protocol asks for a value")
            continue
        method = getattr(type(instance), name, None)
        if not callable(method):
            wrong.append(f"{name}: not a method")
            continue
        asked, given = _params(member), _params(method)
        if given[:len(asked)] != asked:
            wrong.append(f"{name}: parameters {given} where the Protocol has {asked}")
        extra = [p for p in inspect.signature(method).parameters.values()][1 + len(asked):]
        if any(p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
               for p in extra):
            wrong.append(f"{name}: extra parameters without defaults {[p.name for p in extra]}")
    return wrong


@pytest.mark.parametrize("name", list(SERVERS))
def test_every_server_implements_the_server_protocol(name: str, tmp_path: Path) -> None:
    server = SERVERS[name](tmp_path)
    assert violations(base.Server, server) == []
    assert isinstance(server, base.Server)
    assert isinstance(server, base.Lifecycle)  # the one lifecycle: keep, the shielded stop, the context tail


@pytest.mark.parametrize("name", list(RUNTIMES))
def test_every_runtime_implements_the_runtime_protocol(name: str) -> None:
    runtime = RUNTIMES[name]()
    assert violations(base.Runtime, runtime) == []
    assert isinstance(runtime, base.Runtime)
    if name in HOST_RUNTIMES:  # what a sweep over several hosts asks of each
        assert violations(base.HostRuntime, runtime) == []
        assert isinstance(runtime, base.HostRuntime)


def test_the_check_catches_what_breaks_the_contract() -> None:
    class Drifted(FakeRuntime):
        def remove(self, name: str, grace: float = 10) -> None:  # type: ignore[override]  # renamed parameter
            pass

        def kill(self, name: str, now: bool) -> None:  # type: ignore[override]  # a parameter callers never give
            pass

    class Missing:
        def state(self) -> tuple[bool, int | None]:
            return True, None

    drifted = violations(base.Runtime, Drifted())
    assert [v.split(":")[0] for v in drifted] == ["remove", "kill"]
    assert "log_tail: missing" in violations(base.Server, Missing()) and not isinstance(Missing(), base.Server)


def test_every_server_stops_through_the_one_lifecycle() -> None:
    """keep, the context-manager tail and the timed stop are the base's: a kept server survives its context, any
    other is torn down once, and a listener's bug never reaches the log's reader."""
    events: list[str] = []
    kept, dropped = FakeServer("kept", events), FakeServer("dropped", events)
    with kept:
        kept.keep()
    with dropped:
        pass
    assert events == ["stop dropped"] and kept.kept and isinstance(dropped.stop(), float)

    def broken(data: bytes) -> None:
        raise ValueError("listener bug")

    FakeServer("told", on_log=broken)._tell(b"line\n")  # no exception: the guard logs it


def test_mypy_checks_the_same_structurally() -> None:
    """What the checks above compare by name, mypy compares by type: each implementation is passed where its
    Protocol is expected (tests/unit/protocol_conformance.py), with no type: ignore."""
    try:
        import mypy  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("CI must run the type checks, but mypy is not installed (pip install -e '.[test]')")
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    checked = REPO / "tests" / "unit" / "protocol_conformance.py"
    # pyproject.toml's [tool.mypy], strict on this file (its overrides): the options scripts/test.sh's mypy phase
    # checks the package with, so its cache (.mypy_cache, ignored by git) is this run's and only the files below are
    # checked anew (about a second, where other options re-check the whole package: 8-17 s)
    done = subprocess.run([sys.executable, "-m", "mypy", str(checked)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "type: ignore" not in checked.read_text()
