"""The runtime contract: what a started server (`Server`) and a place that runs servers (`Runtime`) offer, whatever
runs them, and the part of a server's life every runtime does the same way (`Lifecycle`).

Three runtimes implement it: Docker (`containers.Docker`, its `Server`), host processes (`processes.Processes`,
`ProcessServer`) and both of this machine's together (`local.Runtime`); a server across several Docker hosts
(`cluster.ClusterServer`) is one `Server` made of the nodes' servers. launch, health, the sweep, tune and the CLI
see only these Protocols, so a new runtime is one module that passes tests/unit/test_runtime_protocols.py.

The records runtimes report (`ServerInfo`, `ImageInfo`, `Target`) and the labels every server carries live here
too: a host process is not a container, and says so by being neither named nor typed as one.
"""

from __future__ import annotations

import getpass
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

from sparklab import interrupts
from sparklab.engines.parsers import Probe, ProbeRun
from sparklab.errors import ServerError
from sparklab.host.facts import HostFacts
from sparklab.spec import LaunchSpec

log = logging.getLogger(__name__)

# Labels every sparklab server carries (a container's labels; a host process's run file), so a later sparklab finds
# its own servers, their owner and their user.
LABEL = "sparklab"
OWNER = "sparklab.owner"
DETACHED = "sparklab.detached"
USER_ID = "sparklab.uid"  # who started it: `down --all` removes only the caller's servers
USER_NAME = "sparklab.user"

# (layer id, status, current bytes or None, total bytes or None)
PullCallback = Callable[[str, str, int | None, int | None], None]
# Called from a server's log thread with each piece of its log as it arrives, redacted.
LogListener = Callable[[bytes], None]


@dataclass(frozen=True)
class ImageInfo:
    """What a launch runs: an image as the Docker host has it, or a host process's program."""

    ref: str
    id: str
    digest: str | None
    architecture: str


@dataclass(frozen=True)
class ServerInfo:
    """One sparklab server as a listing shows it: a container, or a host process group (id "pid N")."""

    id: str
    name: str
    status: str
    exit_code: int | None
    labels: dict[str, str]
    created: str
    runtime: str = "container"  # or "process": a host-process server's run file (sparklab.runtimes.processes)

    @property
    def noun(self) -> str:
        """How messages name it: a container, or a host process."""
        return "host process" if self.runtime == "process" else "container"

    @property
    def detached(self) -> bool:
        return self.labels.get(DETACHED) == "1"

    @property
    def mine(self) -> bool:
        """Started by this user (servers from before sparklab labelled users count as someone else's)."""
        return self.labels.get(USER_ID) == str(os.getuid())


@dataclass(frozen=True)
class Target:
    """A running sparklab server as `sparklab bench` needs it."""

    url: str
    api_key: str | None
    name: str
    kind: str | None  # the engine kind (None for containers started before sparklab labelled it)


def user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        return str(os.getuid())


def only_running(running: list[ServerInfo]) -> str:
    """The one running sparklab server's name, for a command given no name (several or none: say which)."""
    if len(running) != 1:
        names = ", ".join(c.name for c in running) or "none"
        raise ServerError(f"say which server to use (running sparklab servers: {names})",
                          "Pass --container NAME, or --url URL for any OpenAI-compatible endpoint.")
    return running[0].name


# ---------------------------------------------------------------------------------------------------
# The Protocols


@runtime_checkable
class Server(Protocol):
    """A started server. As a context manager it is torn down on every path unless kept (`up --detach`)."""

    @property
    def name(self) -> str: ...

    @property
    def spec(self) -> LaunchSpec: ...

    @property
    def log_path(self) -> Path | None: ...

    @property
    def kept(self) -> bool: ...

    @property
    def detach(self) -> bool: ...

    @property
    def noun(self) -> str:
        """How messages name it: "container" or "process" ("the server process exited …")."""
        ...

    def state(self) -> tuple[bool, int | None]:
        """(running, exit code once it has exited)."""
        ...

    def oom_killed(self) -> bool | None:
        """Whether the kernel's OOM killer ended it; None when the runtime cannot say."""
        ...

    def log_tail(self, lines: int = 50) -> str: ...

    def log_since(self, since: float) -> str:
        """Its log from a wall-clock time (epoch seconds) on, redacted."""
        ...

    def full_log(self) -> str: ...

    def port_open(self, address: str, port: int, timeout_s: int = 5) -> bool:
        """Whether address:port accepts a connection as seen from this server's own network (the head of a server
        across hosts checks its cluster port where the other nodes will reach it)."""
        ...

    def kill(self) -> None:
        """SIGKILL now, keeping what the teardown needs (its log): in-flight requests then fail at once."""
        ...

    def keep(self) -> None:
        """Leave it running when the context ends."""
        ...

    def stop(self, grace_s: float = 10) -> float:
        """Tear down, shielded from a second Ctrl-C; returns the seconds it took."""
        ...

    def __enter__(self) -> Server: ...

    def __exit__(self, *exc: object) -> None: ...


@runtime_checkable
class Runtime(Protocol):
    """Where servers run: pull or check what a launch needs, start servers, and list, read and remove them."""

    def for_spec(self, spec: LaunchSpec) -> Runtime:
        """The runtime that runs this launch (the recipe's `runtime:`); a single runtime is it for every spec."""
        ...

    def alive(self) -> bool:
        """Whether it answers now (a Docker daemon stopped or hung, its ssh or network gone: no), within seconds
        (another machine's: deadlines.ALIVE_S), never waiting on a host that does not answer."""
        ...

    def host_arch(self) -> str: ...

    def ensure_image(self, ref: str, policy: str = "missing", on_event: PullCallback | None = None,
                     platform: str | None = None) -> ImageInfo:
        """What a launch of `ref` runs, pulled per the policy (missing | always | never) where it is an image."""
        ...

    def launch(self, spec: LaunchSpec, secrets: dict[str, str], log_path: Path | None = None,
               detach: bool = False, on_log: LogListener | None = None) -> Server:
        """Start a server; on any failure it is removed before raising."""
        ...

    def probe(self, image: str, probe: Probe, timeout_s: float) -> ProbeRun:
        """Run a short check where a launch of `image` would run (the engine's own argument parser on the exact
        command, sparklab.runtimes.imagecheck): bounded by timeout_s, no server left behind, never raises for the
        check's own failure (ProbeRun.error says why it could not run)."""
        ...

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        """Its sparklab servers (the name is Docker's word: host processes are listed too)."""
        ...

    def orphans(self) -> list[ServerInfo]:
        """Servers left behind by a sparklab process that no longer runs (never detached ones)."""
        ...

    def gc(self) -> list[ServerInfo]:
        """Remove the orphans; returns them."""
        ...

    def remove(self, name: str, grace_s: float = 10) -> None: ...

    def kill(self, name: str) -> None: ...

    def container_id(self, name: str) -> str | None:
        """Where its memory is accounted (a container's cgroup); None for a server without one."""
        ...

    def mount_sources(self) -> set[str]:
        """Host paths its servers mount (an engine cache in use is never trimmed)."""
        ...

    def endpoint_of(self, name: str | None) -> Target:
        """Where a running server answers and with which key: the named one, or the only one."""
        ...

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]: ...

    def log_text(self, name: str, since: float | None = None) -> str: ...

    def remove_run_containers(self, run_id: str, wait_s: float = 120.0) -> list[str]:
        """Remove every server of one sweep run (what a sweep does after a fault, when its handle may be stale)."""
        ...


@runtime_checkable
class HostRuntime(Runtime, Protocol):
    """A host a sweep spreads servers over (sparklab.sweep.fleet): what it needs to describe the host and to judge
    which server configs it can hold before starting any."""

    @property
    def url(self) -> str: ...

    def facts(self) -> dict[str, Any]:  # Any: a JSON document, stored with the run as it is
        """What the planner and the report need to know about the host (architecture, memory, versions)."""
        ...

    def image_info(self, ref: str) -> ImageInfo | None: ...

    def image_problem(self, ref: str, policy: str = "missing") -> str | None:
        """Why this host cannot have the image (None: it has it, or can pull it)."""
        ...

    def host_facts(self, spec: LaunchSpec | None = None) -> HostFacts | None:
        """The host's live readings (host/facts.py: memory, page cache, clocks, disk) for watching a server there;
        spec: the launch about to start, whose image a reader on another host may run from. None: this host's
        memory cannot be read from here (its servers then run unwatched). The caller closes what it gets."""
        ...


# ---------------------------------------------------------------------------------------------------
# What every server does the same way

L = TypeVar("L", bound="Lifecycle")


class Lifecycle(ABC):
    """keep, the timed stop shielded from a second Ctrl-C, the context-manager tail, and the guard that keeps a log
    listener's bug from ending a log: written once for containers, host processes and servers across hosts.

    A runtime's server says how it ends (`_teardown`) and, if it needs to, what follows every stop (`_stopped`)."""

    noun = "container"

    def __init__(self, detach: bool = False, on_log: LogListener | None = None) -> None:
        self.detach = detach
        self.kept = False
        self._on_log = on_log

    @property
    @abstractmethod
    def name(self) -> str: ...

    @abstractmethod
    def _teardown(self, grace_s: float) -> None:
        """End the server (SIGTERM, the grace period, SIGKILL) and remove it; runs with Ctrl-C ignored."""

    def _stopped(self) -> None:  # noqa: B027 - a hook: most servers have nothing to end after a stop
        """After every stop, failed or not (a log thread to end)."""

    def _tell(self, data: bytes) -> None:
        """Hand a piece of the log to the listener; a listener's bug must not end the log."""
        if self._on_log is None:
            return
        try:
            self._on_log(data)
        except Exception:
            log.debug("log listener of %s failed", self.name, exc_info=True)

    def keep(self) -> None:
        """Leave the server running when the context ends (`up --detach`)."""
        self.kept = True

    def stop(self, grace_s: float = 10) -> float:
        """Tear down, shielded from a second Ctrl-C; returns the seconds it took."""
        started = time.monotonic()
        try:
            with interrupts.shielded():
                self._teardown(grace_s)
        finally:
            self._stopped()
        return time.monotonic() - started

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.kept:
            self.stop()
