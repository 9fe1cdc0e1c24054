"""This machine's runtime: Docker containers (containers.py) and host processes (processes.py) as one `base.Runtime`.

launch, health, sweep, tune and the CLI talk to a `Runtime`: a launch goes to the runtime its recipe names
(`for_spec`); listing, `down`, `gc`, logs and a sweep's cleanup see both. Docker is reached only when needed, so a
host-process engine runs on a machine without a Docker daemon (listings then say so in a warning and show the host
processes). As a sweep's host (`base.HostRuntime`) it is judged by its Docker engine.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ServerError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.runtimes import base, containers
from sparklab.runtimes.base import ImageInfo, LogListener, PullCallback, ServerInfo, Target
from sparklab.runtimes.containers import Docker
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
        except ServerError as exc:
            if not self._warned:
                log.warning("%s; only host-process servers are seen", exc.message)
                self._warned = True
            return None

    def _owner(self, name: str) -> Docker | Processes:
        return self.processes if self.processes.has(name) else self.docker

    # -- a launch goes to the runtime its recipe names; without a spec, Docker (a recipe's default runtime) ---------

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> base.Server:
        return self.for_spec(spec).launch(spec, secrets, log_path, detach=detach, on_log=on_log)

    def host_arch(self) -> str:
        return self.docker.host_arch()

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        return self.docker.ensure_image(ref, policy, on_event, platform)

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        """In a container of `image` (a parser check goes through `for_spec` first; without a spec, Docker)."""
        return self.docker.probe(image, probe, timeout_s)

    def alive(self) -> bool:
        """This machine answers; its Docker engine, once connected, must too."""
        return self._docker is None or self._docker.alive()

    # -- as one of a sweep's hosts (base.HostRuntime): its Docker engine ---------------------------------------------

    @property
    def url(self) -> str:
        return self.docker.url

    # Any: a JSON document, stored with the run as it is
    def facts(self) -> dict[str, Any]:
        return self.docker.facts()

    def image_info(self, ref: str) -> ImageInfo | None:
        return self.docker.image_info(ref)

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        return self.docker.image_problem(ref, policy)

    def host_facts(self, spec: LaunchSpec | None = None) -> HostFacts | None:
        return ThisMachine()  # its containers and host processes share this machine's memory

    # -- listing and cleanup, over both runtimes --------------------------------------------------------------------

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        docker = self._reachable_docker()
        found = docker.containers(include_stopped) if docker is not None else []
        return found + self.processes.containers(include_stopped)

    def orphans(self) -> list[ServerInfo]:
        docker = self._reachable_docker()
        return (docker.orphans() if docker is not None else []) + self.processes.orphans()

    def gc(self) -> list[ServerInfo]:
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
        name = name if name is not None else base.only_running(self.containers(include_stopped=False))
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
