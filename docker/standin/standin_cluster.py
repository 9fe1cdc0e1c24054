"""Two-node mode of the sparklab stand-in (a test double, not Ray and not torch.distributed).

One small membership service stands in for both rendezvous a two-host server needs:
- Ray's head (`ray start --head --port=P`, bin/ray): a daemon on P that counts the nodes joined to it; the head
  itself is one. `ray start --address=H:P --block` joins it and blocks until the head goes away (exit 1).
  vLLM with --distributed-executor-backend ray waits until the cluster has tensor x pipeline parallel nodes
  (one GPU per node, as on a Spark) before it loads, as vLLM 0.27.1 waits for its placement group
  (vllm/v1/executor/ray_utils.py:445-470).
- SGLang's --dist-init-addr: rank 0 runs the service on that port and waits for --nnodes nodes before it is
  ready; rank R > 0 joins it, serves no HTTP, and exits when rank 0 goes away.

Protocol: one line per connection, `join NAME` (a node: it stays joined while the connection is open) or `watch`
(the service then writes `nodes N` now and on every change).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

# The stand-in's own record of the head it started; STANDIN_RAY_DIR moves it (twin hosts on one machine each keep
# their own, as each container has its own /tmp).
ADDRESS_FILE = os.path.join(os.environ.get("STANDIN_RAY_DIR") or "/tmp/ray", "ray_current_cluster")


def read_address() -> str:
    """HOST:PORT of the head `ray start --head` started in this container (OSError: none)."""
    with open(ADDRESS_FILE) as f:
        return f.read().strip()


def log(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


class Membership:
    """The service: nodes joined (the starter counts as one) and watchers told of every change."""

    def __init__(self, port: int, host: str = "0.0.0.0") -> None:
        self.nodes = 1
        self.watchers: list[socket.socket] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server((host, port), reuse_port=False)

    def serve(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _tell(self) -> None:
        for w in list(self.watchers):
            try:
                w.sendall(f"nodes {self.nodes}\n".encode())
            except OSError:
                self.watchers.remove(w)

    def _handle(self, conn: socket.socket) -> None:
        line = conn.makefile("r").readline().strip()
        if line == "watch":
            with self.lock:
                self.watchers.append(conn)
                self._tell()
            return
        if not line.startswith("join "):
            conn.close()
            return
        with self.lock:
            self.nodes += 1
            log(f"standin cluster: node {line[5:]} joined; {self.nodes} nodes")
            self._tell()
        try:
            while conn.recv(64):
                pass
        except OSError:
            pass
        with self.lock:
            self.nodes -= 1
            log(f"standin cluster: node {line[5:]} left; {self.nodes} nodes")
            self._tell()


def connect(address: str, timeout_s: float) -> socket.socket:
    """A connection to the service at HOST:PORT, retried until timeout_s (the head may still be starting)."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return socket.create_connection((host, int(port)), timeout=5)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise ConnectionError(f"could not reach {address} in {timeout_s:.0f} s: {exc}") from None
            time.sleep(0.5)


def join_and_block(address: str, name: str, timeout_s: float) -> int:
    """Join the head and stay until it goes away; the exit code a node then ends with."""
    try:
        sock = connect(address, timeout_s)
    except ConnectionError as exc:
        log(f"ConnectionError: {exc}")
        return 1
    sock.settimeout(None)
    sock.sendall(f"join {name}\n".encode())
    log(f"standin cluster: joined {address} as {name}")
    try:
        while sock.recv(64):
            pass
    except OSError:
        pass
    log(f"standin cluster: lost the head at {address}; exiting")
    return 1


def wait_for_nodes(address: str, want: int, timeout_s: float, waiting: str) -> None:
    """Block until the service counts `want` nodes; print `waiting` every 10 s meanwhile; exit 1 on timeout."""
    try:
        sock = connect(address, 30)
    except ConnectionError as exc:
        log(f"ConnectionError: {exc}")
        os._exit(1)
    sock.sendall(b"watch\n")
    # recv with a timeout, not a file object: after one timeout a socket's file object can no longer read (Python's
    # socket.SocketIO), so a node that joined after the first waiting line was never seen and the line repeated
    # without pause (tests/process/test_standin_cluster.py)
    sock.settimeout(10)
    pending = b""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(64)
        except TimeoutError:
            log(waiting)
            continue
        except OSError:
            chunk = b""
        if not chunk:
            log(f"standin cluster: the service at {address} went away")
            os._exit(1)
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if int(line.split()[1]) >= want:
                sock.close()
                return
    log(f"standin cluster: fewer than {want} nodes after {timeout_s:.0f} s")
    os._exit(1)


# ---------------------------------------------------------------------------------------------------- ray


def _opt(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
    return None


def ray_main(argv: list[str]) -> int:
    if argv[:1] == ["status"]:
        try:
            address = read_address()
            connect(address, 1).close()
        except (OSError, ConnectionError) as exc:
            log(f"No cluster status (standin): {exc}")
            return 1
        log(f"standin ray cluster at {address}")
        return 0
    if argv[:1] != ["start"]:
        log(f"usage: ray start --head --port=P | ray start --address=H:P --block (standin; got {argv!r})")
        return 2
    node_ip = _opt(argv, "--node-ip-address") or "127.0.0.1"
    if "--head" in argv:
        port = int(_opt(argv, "--port") or 6379)
        # Ray's head daemon leaves the session; a container's end takes it. A twin's node (STANDIN_RAY_DIR, a host
        # process) keeps it in the node's process group, so the node's teardown ends it as the container's would.
        daemon = subprocess.Popen([sys.executable, "-m", "standin_cluster", "serve", str(port)],
                                  start_new_session=not os.environ.get("STANDIN_RAY_DIR"), stdin=subprocess.DEVNULL)
        try:
            connect(f"127.0.0.1:{port}", 10).close()
        except ConnectionError as exc:
            daemon.kill()
            log(f"ConnectionError: the head did not start: {exc}")
            return 1
        os.makedirs(os.path.dirname(ADDRESS_FILE), exist_ok=True)
        with open(ADDRESS_FILE, "w") as f:
            f.write(f"127.0.0.1:{port}")
        log(f"Local node IP: {node_ip}")
        log("Ray runtime started. (standin)")
        if "--block" in argv:
            return daemon.wait()
        return 0
    address = _opt(argv, "--address")
    if not address:
        log("ray start: give --head or --address=HEAD:PORT (standin)")
        return 2
    log(f"Local node IP: {node_ip}")
    log("Ray runtime started. (standin)")
    if "--block" not in argv:
        return 0  # a real worker would keep its raylet running; the stand-in needs --block to stay joined
    return join_and_block(address, f"{node_ip}-{os.getpid()}", float(os.environ.get("STANDIN_JOIN_TIMEOUT", 60)))


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        service = Membership(int(sys.argv[2]))
        service.serve()
        log(f"standin cluster: head listening on port {sys.argv[2]}")
        while True:
            time.sleep(3600)
    sys.exit(ray_main(sys.argv[1:]))
