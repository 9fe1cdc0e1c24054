"""One server on several Docker hosts (sparklab.multinode), started, watched and torn down as one.

Order: every host has the image before anything runs (a host without it fails the start with nothing to undo);
the head starts; the other nodes start once the head's cluster port answers, checked from inside the head
container, i.e. on its host's network, where the other nodes will reach it (the controller may not see the
link between the Sparks); readiness is the head's HTTP endpoint, with every node checked alive on each try.

While it serves, a thread watches the other nodes: when one exits, the head is killed, so requests in flight
fail at once and the server ends. vLLM 0.27.1 would not notice by itself: its Ray executor's check_health
"Assume[s] that the Ray workers are healthy" (vllm/v1/executor/ray_executor.py:625-628).

Teardown takes every node down on every path (an error, Ctrl-C, a start refused on another host), the other
nodes first and the head last; a host that does not answer does not keep the others' nodes up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from sparklab.engines import caches, engine
from sparklab.engines.logwatch import DEAD_STOP_GRACE_S, LogWatch
from sparklab.errors import NotReadyError, SparklabError
from sparklab.host import preflight
from sparklab.recipes.multinode import ClusterSpec
from sparklab.runtimes.base import Lifecycle, PullCallback, Runtime, Server
from sparklab.runtimes.health import exited_error, wait_ready
from sparklab.runtimes.launch import Launch, Ready, facts_after_ready, parser_preflight, server_api_key
from sparklab.runtimes.state import state_dir

log = logging.getLogger(__name__)

CLUSTER_PORT_TIMEOUT_S = 300.0  # Ray's head is up in seconds; a torch.distributed store once the engine set up
Say = Callable[[str], None]


class ClusterServer(Lifecycle):
    """The nodes of one server as one `base.Server`: not running once any node stopped; stop() tears every node
    down; the log and the endpoint are the head's."""

    def __init__(self, cluster: ClusterSpec, poll_s: float = 1.0) -> None:
        super().__init__()
        self.cluster = cluster
        self.spec = cluster.head
        self.nodes: list[Server] = []  # rank order
        self.ended: str | None = None  # which node ended the server, in words
        self._ended_code: int | None = None
        self._ended_rank: int | None = None
        self._poll_s = poll_s
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._left: set[str] = set()  # hosts whose nodes the teardown leaves (leave())

    @property
    def name(self) -> str:
        return self.cluster.head.name

    @property
    def head(self) -> Server:
        return self.nodes[0]

    @property
    def log_path(self) -> Path | None:
        return self.nodes[0].log_path if self.nodes else None

    def where(self, rank: int) -> str:
        return f"node {rank} ({'head' if rank == 0 else 'worker'}) on {self.cluster.hosts[rank].name}"

    def add(self, node: Server) -> None:
        self.nodes.append(node)

    def _end(self, rank: int, code: int | None, answered: bool = True) -> None:
        with self._lock:
            if self._ended_rank is None:
                self._ended_rank, self._ended_code = rank, code
                self.ended = (f"{self.where(rank)} exited with code {code}" if answered else
                              f"{self.where(rank)} does not answer (its host may be gone)")

    def state(self) -> tuple[bool, int | None]:
        """(running, exit code): not running once any node has stopped; the code is that of the first node
        found stopped (a worker the watcher saw end, rather than the head it then killed). Once ended, no node
        is asked again (one whose host went away would not answer)."""
        if self._ended_rank is not None:
            return False, self._ended_code
        for rank, node in enumerate(self.nodes):
            running, code = node.state()
            if not running:
                self._end(rank, code)
        if self._ended_rank is None:
            return True, None
        return False, self._ended_code

    def log_tail(self, lines: int = 50) -> str:
        rank = self._ended_rank
        if not self.nodes:
            return ""
        if rank is None or rank == 0:
            return self.head.log_tail(lines)
        return f"[{self.ended}; its log:]\n{self.nodes[rank].log_tail(lines)}"

    def full_log(self) -> str:
        return self.head.full_log() if self.nodes else ""

    def log_since(self, since: float) -> str:
        return self.head.log_since(since) if self.nodes else ""

    def oom_killed(self) -> bool | None:
        rank = self._ended_rank if self._ended_rank is not None else 0
        return self.nodes[rank].oom_killed() if self.nodes else None

    def port_open(self, address: str, port: int, timeout_s: int = 5) -> bool:
        return self.head.port_open(address, port, timeout_s)

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()

    def watch(self) -> None:
        """Watch the other nodes from a thread: one that exits kills the head, which ends the server."""
        def run() -> None:
            while not self._stopping.wait(self._poll_s):
                for rank, node in enumerate(self.nodes[1:], start=1):
                    answered = True
                    try:
                        running, code = node.state()
                    except Exception as exc:  # its host stopped answering: the node is as good as gone
                        log.debug("state of %s: %s", self.where(rank), exc)
                        running, code, answered = False, None, False
                    if not running and not self._stopping.is_set():
                        self._end(rank, code, answered)
                        log.warning("%s; stopping the server", self.ended)
                        self.head.kill()
                        return

        threading.Thread(target=run, name=f"watch-{self.name}", daemon=True).start()

    def leave(self, hosts: Sequence[str]) -> None:
        """These hosts stopped answering: the teardown leaves their nodes (`sparklab gc --host` once they are back)
        and takes the others down without waiting on them."""
        self._left.update(hosts)

    def _teardown(self, grace_s: float) -> None:
        """Every node down, the head last; the first failure is raised once every node had its try."""
        self._stopping.set()
        failures: list[Exception] = []
        for rank in reversed(range(len(self.nodes))):
            if self.cluster.hosts[rank].name in self._left:
                log.debug("teardown of %s: left, its host stopped answering", self.where(rank))
                continue
            try:
                self.nodes[rank].stop(grace_s)
            except Exception as exc:  # a host that does not answer: the others still come down
                log.debug("teardown of %s: %s", self.where(rank), exc)
                failures.append(exc)
        if failures:
            raise failures[0]


def wait_cluster_port(server: ClusterServer, timeout_s: float = CLUSTER_PORT_TIMEOUT_S,
                      clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                      poll_s: float = 0.5) -> None:
    """Until the head's cluster port accepts a connection (seen from the head's host), failing at once when the
    head exits and with its log when the deadline passes."""
    cluster = server.cluster
    address = f"{cluster.head_address}:{cluster.cluster_port}"
    deadline = clock() + timeout_s
    while True:
        running, code = server.state()
        if not running:
            raise exited_error(server, cluster.head.kind, code, "the head", f"before its cluster port {address} opened")
        if server.port_open(cluster.head_address, cluster.cluster_port):
            return
        if clock() >= deadline:
            raise NotReadyError(
                f"the head's cluster port {address} did not open in {timeout_s:.0f} s. Last log lines:\n"
                f"{server.log_tail(30)}",
                f"Check that {address} is the head host's ({cluster.hosts[0].name}) cluster_address on the link "
                "between the hosts (`ip addr show IFACE` there).")
        sleep(min(0.5, poll_s))


def start(p: Launch, cluster: ClusterSpec, runtimes: Sequence[Runtime], *, pull_policy: str = "missing",
          on_pull: PullCallback | None = None, api_key: str | None = None,
          on_wait: Callable[[float], None] | None = None, log_dir: Path | None = None, stall_s: float | None = None,
          say: Say | None = None, port_timeout_s: float = CLUSTER_PORT_TIMEOUT_S,
          ready: Callable[..., float] = wait_ready, poll_s: float = 1.0,
          sources: tuple[Path, ...] = ()) -> Ready:
    """Start the nodes in order and wait for the head; the returned server is torn down already if anything here
    fails (runtimes[i] is the host of cluster.nodes[i]; each node runs where its spec says, a container).
    sources: files besides the recipe that may write a flag the image's parser refuses (a sweep file)."""
    p.sources = p.sources or sources
    tell = say or (lambda message: log.info("%s", message))
    head = cluster.head
    runtimes = [runtime.for_spec(spec) for spec, runtime in zip(cluster.nodes, runtimes, strict=True)]
    images = [runtime.ensure_image(spec.image, pull_policy, on_pull) for spec, runtime in zip(cluster.nodes, runtimes,
                                                                                               strict=True)]
    if len({image.id for image in images}) > 1:
        p.warnings.append(preflight.Finding("warning", f"the hosts hold different builds of {head.image} ("
                                            + ", ".join(f"{h.name}: {i.id[:19]}" for h, i in zip(cluster.hosts, images,
                                                                                                    strict=True))
                                            + "); the engines' versions may not match",
                                            "Pull the same digest on every host (pin it in the recipe)."))
    p.check = parser_preflight(p, runtimes[0], images[0])  # the head's command through its image's own parser
    nodes = [caches.bind(spec, spec.image, image.digest, image.id) for spec, image in zip(cluster.nodes, images,
                                                                                              strict=True)]
    key = server_api_key(api_key) if head.needs_api_key else None
    adapter = engine(head.kind)
    provided = {"api_key": key} if key else {}
    if key and adapter.api_key_env:
        provided[adapter.api_key_env] = key
    logs = log_dir or state_dir() / "logs"
    log_watch = LogWatch(adapter)
    server = ClusterServer(cluster, poll_s=poll_s)
    started = time.monotonic()
    try:
        tell(f"{server.where(0)}: starting {nodes[0].name}")
        server.add(runtimes[0].launch(nodes[0], provided, logs / f"{nodes[0].name}.log", on_log=log_watch.feed))
        wait_cluster_port(server, port_timeout_s, poll_s=poll_s)
        tell(f"cluster port {cluster.head_address}:{cluster.cluster_port} is open")
        for rank in range(1, len(nodes)):
            tell(f"{server.where(rank)}: starting {nodes[rank].name}")
            try:
                server.add(runtimes[rank].launch(nodes[rank], provided, logs / f"{nodes[rank].name}.log"))
            except SparklabError as exc:  # say which host refused it
                exc.message = f"{server.where(rank)}: {exc.message}"
                raise
        server.watch()
        headers = {"Authorization": f"Bearer {key}"} if key and adapter.ready_needs_key else None
        ready(server, head.endpoint + head.ready_path, kind=head.kind, timeout_s=head.ready_timeout_s,
              headers=headers, on_try=on_wait, watch=log_watch, stall_s=stall_s, max_interval_s=poll_s)
        facts = facts_after_ready(server, head)
    except NotReadyError as exc:
        server.stop(DEAD_STOP_GRACE_S if exc.kind else 10)
        raise
    except BaseException:
        server.stop()
        raise
    p.spec = nodes[0]
    return Ready(server, images[0], time.monotonic() - started, key, facts, log_watch, p.check)

