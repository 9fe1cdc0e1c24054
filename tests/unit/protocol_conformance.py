"""Type-checked, never run: every server and runtime, and the tests' fakes, passed where their Protocol is expected.
tests/unit/test_runtime_protocols.py runs mypy over it, strict (pyproject.toml): a structural mismatch fails it."""

from __future__ import annotations

from sparklab.runtimes import base, cluster, container_server, containers, local, processes
from tests.fakes import FakeRuntime, FakeServer


def _server(server: base.Server) -> None: ...


def _runtime(runtime: base.Runtime) -> None: ...


def _host(runtime: base.HostRuntime) -> None: ...


def servers(container: container_server.Server, process: processes.ProcessServer, across: cluster.ClusterServer,
            fake: FakeServer) -> None:
    for server in (container, process, across, fake):
        _server(server)


def runtimes(docker: containers.Docker, host_processes: processes.Processes, this_machine: local.Runtime,
             fake: FakeRuntime) -> None:
    _runtime(docker)
    _runtime(host_processes)
    _runtime(this_machine)
    _runtime(fake)
    _host(docker)
    _host(this_machine)
    _host(fake)
