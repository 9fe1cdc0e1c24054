"""Where servers run: Docker containers (containers.py) and host processes (processes.py) behind one interface.

launch, health, sweep and the CLI talk to a `Runtime`: a launch goes to the runtime its recipe names; listing,
`down`, `gc`, logs and a sweep's cleanup see both. Docker is reached only when needed, so a host-process engine
runs on a machine without a Docker daemon (listings then say so in a warning and show the host processes).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from sparklab.errors import ContainerError
from sparklab.runtimes import containers
from sparklab.runtimes.containers import ContainerInfo, Docker, Target
from sparklab.runtimes.processes import Processes
from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)


class Runtime:
    """Containers and host processes; Docker is connected on first use."""

    def __init__(self, docker: Docker | None = None, processes: Processes | None = None) -> None:
        self._docker = docker
        self.processes = processes or Processes()
        self._warned = False

    @property
    def docker(self) -> Docker:
        if self._docker is None:
            self._docker = containers.Docker()  # looked up now: tests may replace it
        return self._docker

    def for_spec(self, spec: LaunchSpec) -> Docker | Processes:
        return self.processes if spec.runtime == "process" else self.docker

    def _reachable_docker(self) -> Docker | None:
        """Docker for a listing or cleanup: when it cannot be reached, say so once and see host processes only
        (a host-process engine runs without a Docker daemon)."""
        try:
            return self.docker
        except ContainerError as exc:
            if not self._warned:
                log.warning("%s; only host-process servers are seen", exc.message)
                self._warned = True
            return None

    def _owner(self, name: str) -> Docker | Processes:
        return self.processes if self.processes.has(name) else self.docker

    # -- the calls of containers.Docker, over both runtimes --------------------------------------------------

    def containers(self, include_stopped: bool = True) -> list[ContainerInfo]:
        docker = self._reachable_docker()
        found = docker.containers(include_stopped) if docker is not None else []
        return found + self.processes.containers(include_stopped)

    def orphans(self) -> list[ContainerInfo]:
        docker = self._reachable_docker()
        return (docker.orphans() if docker is not None else []) + self.processes.orphans()

    def gc(self) -> list[ContainerInfo]:
        removed = self.processes.gc()
        docker = self._reachable_docker()
        return (docker.gc() if docker is not None else []) + removed

    def remove(self, name: str, grace_s: float = 10) -> None:
        self._owner(name).remove(name, grace_s)

    def kill(self, name: str) -> None:
        self._owner(name).kill(name)

    def container_id(self, name: str) -> str | None:
        return None if self.processes.has(name) else self.docker.container_id(name)

    def mount_sources(self) -> set[str]:
        docker = self._reachable_docker()
        return docker.mount_sources() if docker is not None else set()

    def endpoint_of(self, name: str | None) -> Target:
        name = name if name is not None else containers.only_running(self.containers(include_stopped=False))
        return self._owner(name).endpoint_of(name)

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        return self._owner(name).logs(name, follow=follow, tail=tail, since=since)

    def log_text(self, name: str, since: float | None = None) -> str:
        return self._owner(name).log_text(name, since=since)

    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        removed = self.processes.remove_run_containers(run_id)
        if self._docker is None:  # no container was started or listed by this sparklab: Docker is not needed
            return removed
        return removed + self.docker.remove_run_containers(run_id, wait_s)


def pick(runtime: Any, spec: LaunchSpec) -> Any:
    """The runtime that runs `spec`: a Runtime chooses by the recipe; a single runtime (or a test's fake) is it."""
    return runtime.for_spec(spec) if isinstance(runtime, Runtime) else runtime
