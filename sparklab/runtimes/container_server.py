"""A started server container and the end of one: a container's secrets kept out of its logs, its log streamed to
a file, its state, and its teardown (stop with a grace period, then remove). Part of the Docker runtime
(runtimes/containers.py, the one door to Docker, makes these: no other module of the package imports this one).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Protocol

import docker
import docker.errors
import requests
from docker.models.containers import Container

from sparklab.errors import ContainerError
from sparklab.redaction import redact, redacted_lines
from sparklab.runtimes.base import Lifecycle, LogListener
from sparklab.spec import LaunchSpec, is_secret_name

log = logging.getLogger(__name__)

# Secrets never leave a container's logs: engines echo their args (SGLang prints server_args with api_key).


def container_secrets(container: Container) -> list[bytes]:
    """Secret values a container was given: secret-named env values and the value after --api-key."""
    config = container.attrs.get("Config", {})
    found: list[str] = []
    for item in config.get("Env") or []:
        name, _, value = item.partition("=")
        if is_secret_name(name) and value:
            found.append(value)
    command = list(config.get("Cmd") or [])
    found += [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == "--api-key"]
    return [v.encode() for v in found if len(v) >= 4]


class DockerRuntime(Protocol):
    """What a server needs of the runtime that started it (containers.Docker): its client, for the log stream."""

    @property
    def client(self) -> docker.DockerClient: ...


def teardown(container: Container, grace_s: float = 10) -> None:
    """Stop with a grace period (SIGTERM, then SIGKILL), then remove. Tolerates a vanished container."""
    try:
        container.reload()
        if container.status in ("running", "restarting", "paused"):
            try:
                container.stop(timeout=int(grace_s))
            except (docker.errors.APIError, requests.RequestException):
                container.kill()
        container.remove(force=True)
    except docker.errors.NotFound:
        return
    except docker.errors.APIError as exc:
        if exc.status_code == 409:  # removal already in progress
            return
        raise ContainerError(f"could not remove {container.name}: {exc.explanation}",
                             f"Remove it by hand: docker rm -f {container.name}") from None


class Server(Lifecycle):
    """A started server container (a `base.Server`). As a context manager it is torn down on every path unless kept."""

    def __init__(self, docker_: DockerRuntime, container: Container, spec: LaunchSpec, log_path: Path | None,
                 detach: bool = False, on_log: LogListener | None = None) -> None:
        super().__init__(detach, on_log)
        self.docker = docker_
        self.container = container
        self.spec = spec
        self.log_path = log_path
        self._log_thread: threading.Thread | None = None
        self._secrets = container_secrets(container)
        if log_path is not None:
            self._start_log_stream(log_path)

    @property
    def name(self) -> str:
        return str(self.container.name)

    def _start_log_stream(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        container_id = str(self.container.id)

        def pump() -> None:
            try:
                stream = self.docker.client.api.logs(container_id, stream=True, follow=True)
                with path.open("ab") as out:
                    for line in redacted_lines(stream, self._secrets):
                        out.write(line)
                        out.flush()
                        self._tell(line)
            except (docker.errors.APIError, requests.RequestException, OSError) as exc:
                log.debug("log stream of %s ended: %s", self.container.name, exc)

        self._log_thread = threading.Thread(target=pump, name=f"logs-{self.name}", daemon=True)
        self._log_thread.start()

    def state(self) -> tuple[bool, int | None]:
        """(running, exit code if it has exited)."""
        try:
            self.container.reload()
        except docker.errors.NotFound:
            return False, None
        state = self.container.attrs.get("State", {})
        if self.container.status in ("exited", "dead"):
            return False, state.get("ExitCode")
        return True, None

    def oom_killed(self) -> bool | None:
        """Whether the kernel's OOM killer ended it (Docker's State.OOMKilled), not only an exit code of 137;
        None when Docker cannot say (the container is gone, the daemon does not answer)."""
        try:
            self.container.reload()
        except (docker.errors.DockerException, requests.RequestException):
            return None
        state = self.container.attrs.get("State", {})
        return bool(state["OOMKilled"]) if "OOMKilled" in state else None

    def log_tail(self, lines: int = 50) -> str:
        try:
            return redact(self.container.logs(tail=lines), self._secrets).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.RequestException):
            if self.log_path and self.log_path.exists():
                return "\n".join(self.log_path.read_text("utf-8", "replace").splitlines()[-lines:])
            return ""

    def log_since(self, since: float) -> str:
        """The log from a wall-clock time (epoch seconds) on, redacted; empty when Docker cannot give it."""
        try:
            return redact(self.container.logs(since=since), self._secrets).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.RequestException):
            return ""

    def full_log(self) -> str:
        try:
            return redact(self.container.logs(), self._secrets).decode("utf-8", "replace")
        except (docker.errors.APIError, requests.RequestException):
            return self.log_path.read_text("utf-8", "replace") if self.log_path and self.log_path.exists() else ""

    def port_open(self, address: str, port: int, timeout_s: int = 5) -> bool:
        """Whether address:port accepts a connection as seen from inside this container (its host's network):
        the head of a multi-host server checks its own cluster port where the other nodes will reach it, which
        the controller may not (the Sparks' link is often theirs alone). Needs bash and timeout in the image."""
        try:
            result = self.container.exec_run(["timeout", str(timeout_s), "bash", "-c", 'exec 3<>"/dev/tcp/$0/$1"',
                                              address, str(port)])
        except (docker.errors.APIError, requests.RequestException) as exc:
            log.debug("port check in %s: %s", self.name, exc)
            return False
        return result.exit_code == 0

    def kill(self) -> None:
        """SIGKILL now, keeping the container (and its log) for the teardown: a dead engine's in-flight
        requests then fail at once instead of hanging. Tolerates a container that is gone or stopped."""
        try:
            self.container.kill()
        except (docker.errors.APIError, requests.RequestException) as exc:  # NotFound, 409 not running
            log.debug("kill of %s: %s", self.name, exc)

    def _teardown(self, grace_s: float) -> None:
        teardown(self.container, grace_s)
