"""Docker, through docker-py: pull with progress, run, logs, stop, remove, and cleanup by label.

This is the only module that imports docker.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import docker
import docker.constants
import docker.errors
import requests
from docker.models.containers import Container
from docker.tls import TLSConfig
from docker.transport import sshconn
from docker.types import DeviceRequest, Ulimit

from sparklab import interrupts
from sparklab.engines import ENGINES, candidates
from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ContainerError, ImageUnavailableError
from sparklab.host.facts import HostFacts, ThisMachine
from sparklab.recipes.hosts import redact_url
from sparklab.redaction import redact, redacted_lines
from sparklab.runtimes import deadlines, processes
from sparklab.runtimes.base import (
    DETACHED,
    LABEL,
    OWNER,
    USER_ID,
    USER_NAME,
    ImageInfo,
    Lifecycle,
    LogListener,
    PullCallback,
    ServerInfo,
    Target,
    only_running,
    user_name,
)
from sparklab.runtimes.owners import owner_alive, owner_token
from sparklab.spec import API_KEY_PLACEHOLDER, LaunchSpec, is_secret_name

log = logging.getLogger(__name__)


def _split_ref(image: str) -> tuple[str, str | None]:
    """`repo:tag` → (repo, tag); `repo@sha256:…` → (repo@sha256:…, None)."""
    if "@" in image:
        return image, None
    last = image.rsplit("/", 1)[-1]
    if ":" in last:
        repo, tag = image.rsplit(":", 1)
        return repo, tag
    return image, "latest"


_UNAVAILABLE = ("not found", "manifest unknown", "does not exist", "pull access denied", "name unknown")


def _pull_error(ref: str, message: str) -> ContainerError:
    if any(text in message.lower() for text in _UNAVAILABLE):
        return ImageUnavailableError(f"pull of {ref} failed: {message}",
                                     "Check the image name and tag, and that you may pull it (docker login).")
    return ContainerError(f"pull of {ref} failed: {message}",
                          "Check registry access, the network and free disk space.")


# ---------------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------------


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
        """Another Docker host: `ssh://` through the ssh binary (so ~/.ssh/config applies, as for `docker -H`),
        `tcp://` with TLS from tls_dir or DOCKER_CERT_PATH, `unix://`, or a Docker context name. It must answer
        within answer_s, or it is an error (and the ssh started for it is ended)."""
        if url == "local":
            return cls()
        tls: TLSConfig | None = None
        base_url = url
        if "://" not in url:
            from docker.context import ContextAPI

            context = ContextAPI.get_context(url)
            if context is None:
                raise ContainerError(f"no Docker context named {url!r}",
                                     "List them with `docker context ls`, or give the host as ssh:// or tcp://.")
            base_url, tls = context.Host or "", context.TLSConfig  # no Host: refused just below
            if not base_url:
                raise ContainerError(f"Docker context {url!r} names no Docker endpoint",
                                     "See `docker context inspect`.")
        elif url.startswith("tcp://"):
            tls = _tls_config(tls_dir or os.environ.get("DOCKER_CERT_PATH"))
        hint = ("Check that `docker -H " + url + " info` works from here (ssh key, ~/.ssh/config, TLS certificates, "
                "the daemon running there).")
        # The API version is asked under the deadline (docker-py would ask it unbounded while making the client).
        probe = _client(base_url, tls, timeout, docker.constants.MINIMUM_DOCKER_API_VERSION)
        try:
            version = deadlines.within(answer_s, lambda: str(probe.version(api_version=False)["ApiVersion"]),
                                       f"connect-{url}")
        except deadlines.NoAnswer:
            raise ContainerError(f"the Docker host {url} gave no answer within {answer_s:g} s", hint) from None
        except (docker.errors.DockerException, requests.RequestException, OSError, KeyError) as exc:
            text = _ssh_error(probe) or (str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc))
            raise ContainerError(f"cannot reach the Docker host {url}: {text}", hint) from None
        finally:
            probe.close()  # ends its ssh, answered or not
        client = _client(base_url, tls, timeout, version)
        client.sparklab_url = base_url  # type: ignore[attr-defined]  # a context's endpoint, for its address
        return cls(client)

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
                "docker_version": info.get("ServerVersion"), "os": info.get("OperatingSystem")}

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
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise ContainerError(f"cannot inspect image {ref}: {exc.explanation}") from None
        digests = image.attrs.get("RepoDigests") or []
        repo = _split_ref(ref)[0].split("@")[0]
        digest = next((d.split("@", 1)[1] for d in digests if d.split("@")[0] == repo), None)
        if digest is None and digests:
            digest = digests[0].split("@", 1)[1]
        return ImageInfo(ref=ref, id=str(image.id), digest=digest, architecture=str(image.attrs.get("Architecture")))

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        """Why this host cannot have the image (None: it has it, or its registry has it to pull)."""
        if self.image_info(ref) is not None:
            return None
        if policy == "never":
            return f"{ref} is not on this host and --pull never was given"
        try:
            self.client.images.get_registry_data(ref)
        except docker.errors.APIError as exc:
            return f"{ref} cannot be pulled there: {str(exc.explanation or exc).splitlines()[0][:200]}"
        except (docker.errors.DockerException, requests.RequestException) as exc:
            return f"{ref} cannot be checked there: {exc}"
        return None

    def pull(self, ref: str, on_event: PullCallback | None = None, platform: str | None = None) -> ImageInfo:
        """Pull with per-layer progress; any errorDetail in the stream is an error."""
        repo, tag = _split_ref(ref)
        stream_digest: str | None = None
        try:
            for event in self.client.api.pull(repo, tag=tag, stream=True, decode=True, platform=platform):
                if "errorDetail" in event or "error" in event:
                    detail = event.get("errorDetail") or {}
                    message = detail.get("message") or event.get("error") or str(event)
                    raise _pull_error(ref, str(message))
                status = str(event.get("status", ""))
                if status.startswith("Digest: "):
                    stream_digest = status.split("Digest: ", 1)[1].strip()
                if on_event is not None:
                    progress = event.get("progressDetail") or {}
                    on_event(str(event.get("id", "")), status, progress.get("current"), progress.get("total"))
        except docker.errors.APIError as exc:
            raise _pull_error(ref, str(exc.explanation or exc)) from None
        except requests.RequestException as exc:
            raise ContainerError(f"pull of {ref} failed: {exc}") from None
        info = self.image_info(ref)
        if info is None:
            raise ContainerError(f"pull of {ref} finished but the image is not there")
        if stream_digest and info.digest != stream_digest:
            info = ImageInfo(info.ref, info.id, stream_digest, info.architecture)
        return info

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        if policy not in ("missing", "always", "never"):
            raise ContainerError(f"unknown pull policy {policy!r}", "Use --pull missing|always|never.")
        local = self.image_info(ref)
        if policy == "never" or (policy == "missing" and local is not None):
            if local is None:
                raise ContainerError(f"image {ref} is not present locally and --pull never was given",
                                     "Pull it first (sparklab pull / docker pull) or drop --pull never.")
            return local
        info = self.pull(ref, on_event, platform)
        if "@" in ref and info.digest and not ref.endswith(info.digest):
            raise ContainerError(f"image {ref} resolved to digest {info.digest}, not the pinned one")
        return info

    def image_labels(self, ref: str) -> dict[str, str]:
        """The labels of a local image ({} when it is not here): what an image says of itself (its CUDA targets)."""
        try:
            return dict(self.client.images.get(ref).attrs.get("Config", {}).get("Labels") or {})
        except (docker.errors.DockerException, requests.RequestException):
            return {}

    def registry_platforms(self, ref: str) -> list[str] | None:
        """The platforms the registry's manifest lists for a ref (`linux/arm64`, …); None when it cannot be asked."""
        try:
            data = self.client.images.get_registry_data(ref)
        except (docker.errors.DockerException, requests.RequestException):
            return None
        return [f"{p.get('os', '?')}/{p.get('architecture', '?')}" + (f"/{p['variant']}" if p.get("variant") else "")
                for p in data.attrs.get("Platforms") or []]

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        """Run a short check in a throwaway container of `image` (the engine's own parser, sparklab.imagecheck):
        no network, no GPU, no mounts, at most timeout_s, always removed. It carries sparklab's labels and owner, so
        one a crash leaves behind is removed by the next start or `sparklab gc`."""
        labels = {LABEL: "1", "sparklab.mode": "probe", OWNER: owner_token(), DETACHED: "0",
                  USER_ID: str(os.getuid()), USER_NAME: user_name()}
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
                if not c.detached and not owner_alive(c.labels.get(OWNER, ""))]

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


# ---------------------------------------------------------------------------------------------------
# ssh:// hosts: docker-py's shell-out to the ssh binary, bounded (sparklab.runtimes.deadlines).


class _SSHSocket(sshconn.SSHSocket):
    """docker-py's ssh shell-out (docker 7.2.0, docker/transport/sshconn.py:34-61: `ssh [-l USER] [-p PORT] -- HOST
    docker system dial-stdio`, SIGINT ignored in the child, no option of its own, so no connect timeout) with
    deadlines.SSH_OPTIONS, the terminal's SIGHUP ignored as well, and ssh's own error kept for the message (in a
    file: a pipe nobody reads could fill and stall it)."""

    errors: Any = None  # a binary temporary file with ssh's stderr

    def connect(self, **kwargs: Any) -> None:  # type: ignore[override]  # docker-py's own signature
        args = ["ssh", *deadlines.SSH_OPTIONS]
        if self.user:
            args += ["-l", self.user]
        if self.port:
            args += ["-p", self.port]
        env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "SSL_CERT_FILE")}  # as docker-py
        self.errors = tempfile.TemporaryFile()  # noqa: SIM115 - it lives as long as the connection (end, GC)
        self.proc = processes.start_helper([*args, "--", self.host, "docker system dial-stdio"], env, self.errors)
        _STARTED.add(self)

    def last_error(self) -> str:
        """ssh's last line on stderr ("Connection timed out during banner exchange"), if it wrote one."""
        if self.errors is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            self.errors.seek(0)
            lines = self.errors.read(65536).decode("utf-8", "replace").strip().splitlines()
            return lines[-1].strip() if lines else ""
        return ""

    def end(self) -> None:
        """End the ssh process now (a check that ran out of time)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()


_STARTED: weakref.WeakSet[_SSHSocket] = weakref.WeakSet()  # every ssh this process started that may still run


@atexit.register
def _end_every_ssh() -> None:
    """At exit (Ctrl-C while a silent host was being reached, say), end the ssh processes still running: they
    ignore the terminal's signals, and one waiting for a silent host's banner would outlive sparklab by up to
    deadlines.SSH_CONNECT_S. The check's daemon thread is left behind; its ssh must not be."""
    for sock in list(_STARTED):
        sock.end()


class _SSHConnection(sshconn.SSHConnection):
    def __init__(self, adapter: _SSHAdapter, timeout: Any, host: str | None) -> None:  # as docker-py passes them
        super().__init__(None, timeout, host)  # docker-py passes None for the socket path
        self._adapter = adapter

    def connect(self) -> None:
        sock = _SSHSocket(str(self.ssh_host))
        sock.settimeout(self.timeout)
        self._adapter.opened(sock)
        sock.connect()
        self.sock = sock


class _SSHPool(sshconn.SSHConnectionPool):
    def __init__(self, adapter: _SSHAdapter) -> None:
        super().__init__(None, adapter.timeout, adapter.max_pool_size, adapter.ssh_host)
        self._adapter = adapter

    def _new_conn(self) -> _SSHConnection:  # type: ignore[override]  # docker-py's SSHConnection too
        return _SSHConnection(self._adapter, self.timeout, self.ssh_host)


class _SSHAdapter(sshconn.SSHHTTPAdapter):
    """The shell-out adapter with bounded ssh processes; closing it ends every ssh it started that still runs."""

    def __init__(self, base_url: str, timeout: int) -> None:
        super().__init__(base_url, timeout, shell_out=True)
        self._sockets: weakref.WeakSet[_SSHSocket] = weakref.WeakSet()
        self.last: _SSHSocket | None = None

    def opened(self, sock: _SSHSocket) -> None:
        self._sockets.add(sock)
        self.last = sock

    def get_connection(self, url: str | bytes, proxies: Any = None) -> _SSHPool:
        return _SSHPool(self)  # a pool per request, as docker-py's shell-out has it (sshconn.py:220-226)

    def close(self) -> None:
        super().close()
        for sock in list(self._sockets):
            sock.end()


def _client(base_url: str, tls: Any, timeout: int, version: str) -> docker.DockerClient:
    """A client that has not talked to the daemon yet (the version is given); ssh:// goes through _SSHAdapter."""
    client = docker.DockerClient(base_url=base_url, tls=tls, use_ssh_client=True, timeout=timeout, version=version)
    if base_url.startswith("ssh://"):
        client.api.mount("http+docker://ssh", _SSHAdapter(base_url, timeout))
    return client


def _ssh_error(client: docker.DockerClient) -> str:
    adapter = client.api.adapters.get("http+docker://ssh")
    last = adapter.last if isinstance(adapter, _SSHAdapter) else None
    return last.last_error() if last is not None else ""


def _tls_config(cert_dir: str | None) -> TLSConfig:
    """TLS with the client certificate and CA of a `docker --tlsverify` setup; none without a directory."""
    if not cert_dir:
        raise ContainerError("a tcp:// Docker host needs TLS certificates",
                             "Give the host `tls_dir:` (with ca.pem, cert.pem, key.pem) or set DOCKER_CERT_PATH; "
                             "an unencrypted tcp:// daemon gives root to anyone on the network.")
    base = Path(cert_dir).expanduser()
    missing = [n for n in ("ca.pem", "cert.pem", "key.pem") if not (base / n).is_file()]
    if missing:
        raise ContainerError(f"{base}: no {', '.join(missing)}", "Put the daemon's CA and your client certificate "
                             "there (see Docker's 'Protect the Docker daemon socket').")
    return TLSConfig(client_cert=(str(base / "cert.pem"), str(base / "key.pem")), ca_cert=str(base / "ca.pem"),
                     verify=True)


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

    def __init__(self, docker_: Docker, container: Container, spec: LaunchSpec, log_path: Path | None,
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
