"""Docker, through docker-py: pull with progress, run, logs, stop, remove, and cleanup by label.

This is the one door to Docker: only it and its parts import docker, and only it imports its parts: how a Docker
host is reached (`docker_transport`), a host's images (`docker_images`) and a started server container with its
teardown (`container_server`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import docker
import docker.errors
import requests
from docker.models.containers import Container
from docker.types import DeviceRequest, Ulimit

from sparklab import interrupts
from sparklab.engines import ENGINES, candidates
from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ContainerError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.recipes.hosts import redact_url
from sparklab.redaction import redact, redacted_lines
from sparklab.runtimes import deadlines, docker_images, docker_sandbox, docker_transport
from sparklab.runtimes.base import (
    DETACHED,
    LABEL,
    OWNER,
    USER_ID,
    USER_NAME,
    ImageInfo,
    LogListener,
    PullCallback,
    ServerInfo,
    Target,
    only_running,
    user_name,
)
from sparklab.runtimes.container_server import Server, container_secrets, teardown
from sparklab.runtimes.docker_sandbox import Confined, Confinement
from sparklab.runtimes.owners import owner_alive, owner_token
from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec, in_session, session_labels


class Docker:
    """A thin, typed wrapper over docker-py for what sparklab needs: a `base.HostRuntime`."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        if client is None:
            try:
                client = docker.from_env(timeout=120)
                client.ping()
            except (docker.errors.DockerException, requests.RequestException) as exc:
                raise ContainerError(
                    f"cannot reach the Docker engine: {exc}",
                    "Start it (e.g. `systemctl start docker` or `dockerd &`) and check DOCKER_HOST.") from None
        self.client = client

    @classmethod
    def connect(cls, url: str, tls_dir: str | None = None, timeout: int = 120,
                answer_s: float = deadlines.HOST_CHECK_S) -> Docker:
        """Another Docker host (`ssh://`, `tcp://` with TLS, `unix://` or a Docker context name: how each is reached is
        runtimes/docker_transport.py) that answers within answer_s, or an error; "local" is this machine's daemon."""
        if url == "local":
            return cls()
        return cls(docker_transport.connect(url, tls_dir, timeout, answer_s))

    def for_spec(self, spec: LaunchSpec) -> Docker:
        return self

    @property
    def url(self) -> str:
        """The Docker endpoint this client talks to (a context's, once read)."""
        return str(getattr(self.client, "sparklab_url", "local"))

    def alive(self) -> bool:
        """Whether the daemon answers within deadlines.ALIVE_S (a lost host: daemon stopped or hung, ssh or network
        gone)."""
        try:
            return bool(deadlines.within(deadlines.ALIVE_S, self.client.ping, "ping"))
        except (deadlines.NoAnswer, docker.errors.DockerException, requests.RequestException, OSError):
            return False

    # Any: a JSON document, stored with the run as it is
    def facts(self) -> dict[str, Any]:
        """What the planner and the report need to know about this Docker host."""
        info = self.client.info()
        return {"name": info.get("Name"), "architecture": info.get("Architecture"),
                "mem_total_gib": round(int(info.get("MemTotal") or 0) / 2**30, 1), "cpus": info.get("NCPU"),
                "docker_version": info.get("ServerVersion"), "os": info.get("OperatingSystem"),
                "kernel": info.get("KernelVersion")}

    def host_facts(self, spec: LaunchSpec | None = None) -> HostFacts | None:
        """This machine's daemon shares its memory: read directly. Another host's memory is read by a helper
        container there (runtimes/hostwatch.py), from the launch's image, which that host needs anyway."""
        if self.url == "local" or self.url.startswith("unix://"):
            return ThisMachine()
        from sparklab.runtimes.hostwatch import HelperFacts

        images = (spec.image, *spec.image_alternatives) if spec is not None else ()
        return HelperFacts(self, images, where=redact_url(self.url), run_id=spec.labels.get("sparklab.run_id", "")
                           if spec is not None else "")

    # -- images ------------------------------------------------------------------------------------

    def host_arch(self) -> str:
        return str(self.client.info().get("Architecture", "unknown"))

    def image_info(self, ref: str) -> ImageInfo | None:
        return docker_images.image_info(self.client, ref)

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        return docker_images.image_problem(self.client, ref, policy)

    def pull(self, ref: str, on_event: PullCallback | None = None, platform: str | None = None) -> ImageInfo:
        return docker_images.pull(self.client, ref, on_event, platform)

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        return docker_images.ensure_image(self.client, ref, policy, on_event, platform)

    def image_labels(self, ref: str) -> dict[str, str]:
        return docker_images.image_labels(self.client, ref)

    def registry_platforms(self, ref: str) -> list[str] | None:
        return docker_images.registry_platforms(self.client, ref)

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        """Run a short check in a throwaway container of `image` (the engine's own parser, sparklab.imagecheck):
        no network, no GPU, no mounts, at most timeout_s, always removed. It carries sparklab's labels and owner, so
        one a crash leaves behind is removed by the next start or `sparklab gc`."""
        labels = {LABEL: "1", "sparklab.mode": "probe", OWNER: owner_token(), DETACHED: "0",
                  USER_ID: str(os.getuid()), USER_NAME: user_name(),
                  **session_labels()}  # a session's gc takes its own
        started = time.monotonic()
        container: Container | None = None
        try:
            with interrupts.deferred():
                container = self.client.containers.create(
                    image, entrypoint=[probe.program], command=list(probe.args), environment=dict(probe.env),
                    labels=labels, name=f"sparklab-probe-{os.getpid()}-{time.monotonic_ns()}", network_mode="none",
                    detach=True)
                container.start()
            try:
                code: int | None = int(container.wait(timeout=timeout_s).get("StatusCode", -1))
                timed_out = False
            except requests.RequestException:  # the wait's read timed out: the check hangs
                container.kill()
                code, timed_out = None, True
            out = container.logs(stdout=True, stderr=False).decode("utf-8", "replace")
            err = container.logs(stdout=False, stderr=True).decode("utf-8", "replace")
            return ProbeRun(code, out, err, time.monotonic() - started, timed_out)
        except docker.errors.APIError as exc:  # no such program in the image, exec format error, no image
            return ProbeRun(None, "", "", time.monotonic() - started,
                            error=str(exc.explanation or exc).strip().splitlines()[-1][:400])
        except requests.RequestException as exc:
            return ProbeRun(None, "", "", time.monotonic() - started, error=f"Docker did not answer: {exc}")
        finally:
            if container is not None:
                with interrupts.shielded():
                    self._force_remove(container)

    # -- containers --------------------------------------------------------------------------------

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> Server:
        """Create and start the container. On any failure the container is removed before raising.

        on_log: called (from the log thread) with each piece of the log as it arrives, redacted; needs log_path."""
        env = dict(spec.env)
        for name in spec.secret_env:
            value = secrets.get(name) or spec.secret_values.get(name) or os.environ.get(name)
            if value is not None:
                env[name] = value
        api_key = secrets.get("api_key", "")
        command = [api_key if a == API_KEY_PLACEHOLDER else a for a in (*spec.entrypoint[1:], *spec.argv)]
        labels = {**spec.labels, OWNER: owner_token(), DETACHED: "1" if detach else "0",
                  USER_ID: str(os.getuid()), USER_NAME: user_name()}
        kwargs: dict[str, Any] = {
            "name": spec.name, "entrypoint": [spec.entrypoint[0]], "command": command, "environment": env,
            "labels": labels, "init": True, "detach": True,
            "ulimits": [Ulimit(name=k, soft=s, hard=h) for k, (s, h) in spec.ulimits.items()],
            "volumes": {m.source: {"bind": m.target, "mode": m.mode} for m in spec.mounts},
        }
        if spec.gpus:
            kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
        if spec.ipc == "host":
            kwargs["ipc_mode"] = "host"
        if spec.shm_size:
            kwargs["shm_size"] = spec.shm_size
        if spec.network in ("host", "none"):  # none: a helper that needs no network (runtimes/hostwatch.py)
            kwargs["network_mode"] = spec.network
        else:
            kwargs["ports"] = {f"{spec.port}/tcp": (None if spec.public else "127.0.0.1", spec.port)}
        self._remove_stale_name(spec.name)
        container: Container | None = None
        server: Server | None = None
        try:
            with interrupts.deferred():  # a Ctrl-C between the daemon's answer and our handle would orphan it
                container = self.client.containers.create(spec.image, **kwargs)
                container.start()
                server = Server(self, container, spec, log_path, detach=detach, on_log=on_log)
        except docker.errors.APIError as exc:
            if container is not None:
                self._force_remove(container)
            text = str(exc.explanation or exc)
            hint = None
            if "address already in use" in text or "port is already allocated" in text:
                hint = f"Port {spec.port} is taken: stop what uses it or pass --port N."
            elif "error setting rlimit" in text:
                hint = ("This host does not allow a container ulimit the recipe asks for (often memlock=-1 in a "
                        "restricted sandbox): lower it, e.g. --ulimit memlock=8388608.")
            elif "could not find bridge" in text:  # dockerd 20.10: its bridge's interface was deleted under it
                hint = ("This Docker daemon's bridge interface is gone, deleted by something else on this host (a "
                        "dockerd started with --bridge=none deletes docker0 as it starts): restart the Docker daemon "
                        "(e.g. systemctl restart docker), which makes it again, or serve on the host network "
                        "(network: host, the recipes' default).")
            elif "could not select device driver" in text:
                hint = "No GPU runtime on this Docker host: for CPU images use a recipe with gpus: none or --no-gpus."
            raise ContainerError(f"docker could not start {spec.name}: {text}", hint) from None
        except BaseException:
            if server is not None:
                server.stop()
            elif container is not None:
                self._force_remove(container)
            raise
        return server

    def _remove_stale_name(self, name: str) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            old = self.client.containers.get(name)
            if old.labels.get(LABEL) != "1":
                raise ContainerError(f"a container named {name} exists and is not sparklab's",
                                     "Remove or rename it.")
            if old.status == "running" and (old.labels.get(DETACHED) == "1"
                                            or owner_alive(old.labels.get(OWNER, ""))):
                raise ContainerError(f"{name} is already running",
                                     f"Stop it first: sparklab down {name}")
            self._force_remove(old)

    def _force_remove(self, container: Container) -> None:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        found = self.client.containers.list(all=include_stopped, filters={"label": LABEL},
                                            sparse=False, ignore_removed=True)
        return [self._info(c) for c in found]

    @staticmethod
    def _info(c: Container) -> ServerInfo:
        state = c.attrs.get("State", {})
        return ServerInfo(
            id=c.short_id, name=str(c.name), status=c.status,
            exit_code=state.get("ExitCode") if c.status in ("exited", "dead") else None,
            labels=dict(c.labels), created=str(c.attrs.get("Created", "")))

    def get(self, name: str) -> Container:
        try:
            container = self.client.containers.get(name)
        except docker.errors.NotFound:
            raise ContainerError(f"no container named {name}", "List them with `sparklab ps`.") from None
        if container.labels.get(LABEL) != "1":
            raise ContainerError(f"{name} is not a sparklab container", "sparklab only manages its own.")
        return container

    def container_id(self, name: str) -> str | None:
        """The full id of a sparklab container by name (None while it does not exist): where its cgroup is."""
        try:
            container = self.client.containers.get(name)
        except (docker.errors.DockerException, requests.RequestException):
            return None
        return str(container.id) if container.labels.get(LABEL) == "1" else None

    def kill(self, name: str) -> None:
        """SIGKILL a sparklab container now (the memory floor: no grace period while the host runs out)."""
        with contextlib.suppress(docker.errors.DockerException, requests.RequestException):
            container = self.client.containers.get(name)
            if container.labels.get(LABEL) == "1":
                container.kill()

    def remove(self, name: str, grace_s: float = 10) -> None:
        teardown(self.get(name), grace_s)

    def endpoint_of(self, name: str | None) -> Target:
        """Where a running sparklab server answers and with which key: the named one, or the only one."""
        container = self.get(name if name is not None else only_running(self.containers(include_stopped=False)))
        if container.status != "running":
            raise ContainerError(f"{container.name} is not running ({container.status})",
                                 "Start it again: sparklab up …")
        config = container.attrs.get("Config", {})
        env = dict(item.partition("=")[::2] for item in config.get("Env") or [])
        command = list(config.get("Cmd") or [])
        kind = container.labels.get("sparklab.kind")
        adapters = candidates(kind if kind in ENGINES else None)  # containers from before the kind label: ask all
        key = next((k for a in adapters if (k := a.api_key_from(env, command))), None)
        return Target(container.labels.get("sparklab.endpoint", ""), key, str(container.name),
                      kind if kind in ENGINES else None)

    def mount_sources(self) -> set[str]:
        """Host paths bind-mounted by any container, running or stopped (one may be started again)."""
        found: set[str] = set()
        for container in self.client.containers.list(all=True, sparse=False, ignore_removed=True):
            found.update(m["Source"] for m in container.attrs.get("Mounts") or [] if m.get("Source"))
        return found

    def orphans(self) -> list[ServerInfo]:
        """Containers left behind by a sparklab process that no longer runs (never detached ones)."""
        return [c for c in self.containers()
                if not c.detached and not owner_alive(c.labels.get(OWNER, "")) and in_session(c.labels)]

    def gc(self) -> list[ServerInfo]:
        removed = []
        for info in self.orphans():
            with contextlib.suppress(docker.errors.NotFound):
                teardown(self.client.containers.get(info.id), grace_s=5)
                removed.append(info)
        return removed

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        container = self.get(name)
        secrets = container_secrets(container)
        lines: int | Literal["all"] = tail if isinstance(tail, int) else "all"  # as docker-py reads any other string
        if follow:
            yield from redacted_lines(container.logs(stream=True, follow=True, tail=lines, since=since), secrets,
                                      starts_mid_log=tail != "all" or since is not None)
        else:
            yield redact(container.logs(tail=lines, since=since), secrets)


    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        """Remove every container of one sweep run, waiting (with backoff) for a daemon that is restarting.

        What a sweep calls after an unexpected fault, when its own handle on the server may be stale."""
        from tenacity import Retrying, retry_if_exception_type, stop_after_delay, wait_exponential

        retrying = Retrying(retry=retry_if_exception_type((docker.errors.DockerException, requests.RequestException)),
                            wait=wait_exponential(multiplier=0.5, max=10), stop=stop_after_delay(wait_s), reraise=True)
        removed: list[str] = []
        for attempt in retrying:
            with attempt:
                self.client.ping()
                for container in self.client.containers.list(all=True, filters={"label": f"sparklab.run_id={run_id}"}):
                    teardown(container, grace_s=5)
                    removed.append(str(container.name))
        return removed

    def log_text(self, name: str, since: float | None = None) -> str:
        """A container's log (since a wall-clock time), redacted, as text."""
        return b"".join(self.logs(name, since=since)).decode("utf-8", "replace")

    def run_confined(self, image: str, command: list[str], task_dir: str, limits: Confinement) -> Confined:
        """Run untrusted code once and remove its container on every path (sparklab.runtimes.sandbox): no network,
        a read-only root with `task_dir` mounted read-only at /task (the working directory) and a small /tmp,
        no capabilities, an unprivileged user, and caps on memory (no swap), CPU, processes and wall time (the
        container is killed at the time cap). Labelled like every sparklab container, so `gc` finds a leftover."""
        return docker_sandbox.run_confined(self.client, image, command, task_dir, limits)
