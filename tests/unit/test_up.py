"""`sparklab up` is one path for one server and for one across hosts (issue 22, section 3): the gc of leftovers,
"starting …", the ready summary, the foreground watch and the Ctrl-C stop are the same code; only the start
differs (launch.start or cluster.start, both a launch.Ready holding a base.Server).

Docker is tests/fakes.py's FakeRuntime (one per host); the engine's readiness endpoint is a real HTTP server on
127.0.0.1, so the waits are the real ones."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from sparklab.cli.main import main
from sparklab.runtimes import containers, launch
from sparklab.runtimes.base import ServerInfo
from sparklab.spec import LaunchSpec
from tests.dockerkit import free_port
from tests.fakes import FakeRuntime

LINK = "cluster_address=127.0.0.1,interface=lo,ib_hca=standin0"


class _Ready(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def hosts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[dict[str, FakeRuntime]]:
    """This machine's Docker and any other host's, each a FakeRuntime with one leftover of a gone sparklab; a
    server started here answers every GET with 200 on its port (an engine's endpoint, ready at once)."""
    events: list[str] = []
    made: dict[str, FakeRuntime] = {}
    endpoints: list[ThreadingHTTPServer] = []

    def serve(spec: LaunchSpec) -> None:
        endpoints.append(ThreadingHTTPServer(("127.0.0.1", spec.port), _Ready))
        threading.Thread(target=endpoints[-1].serve_forever, daemon=True).start()

    def runtime(name: str) -> FakeRuntime:
        if name not in made:
            leftover = ServerInfo(f"old-{name}", f"old-{name}", "exited", 0, {}, "")
            made[name] = FakeRuntime(name, events, leftovers=[leftover], on_launch=serve if name == "local" else None)
        return made[name]

    def docker() -> FakeRuntime:
        return runtime("local")

    docker.connect = lambda url, tls_dir=None, answer_s=None: runtime(url.rsplit("@", 1)[-1])  # type: ignore[attr-defined]
    monkeypatch.setattr(containers, "Docker", docker)
    monkeypatch.setenv("SPARKLAB_STATE", str(tmp_path / "state"))  # logs and run files of this test only
    yield made
    for endpoint in endpoints:
        endpoint.shutdown()
        endpoint.server_close()


def _ctrl_c(server: Any, log_watch: Any = None, poll_s: float = 1.0, **watched_as_a_sweep: Any) -> None:
    raise KeyboardInterrupt  # what Ctrl-C (or SIGTERM) raises while `up` watches in the foreground


def test_one_server_starts_serves_and_stops_on_ctrl_c(hosts: dict[str, FakeRuntime], port: int, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setattr(launch, "watch", _ctrl_c)
    assert main(["up", "cpu:none", "--port", str(port), "--no-download", "--hf-cache", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    (server,) = hosts["local"].launched
    assert "removed leftover container old-local (its sparklab process is gone)" in err
    assert f"starting {server.name}: cpu / vllm-cpu / none (" in err
    assert f"http://127.0.0.1:{port}" in out and "serving in the foreground: Ctrl-C stops and removes it." in out
    assert "stopping…" in err and f"stopped and removed {server.name} in " in err
    assert hosts["local"].events[-1] == f"stop {server.name}" and not server.running  # stopped once


def test_one_server_detached_is_left_running(hosts: dict[str, FakeRuntime], port: int, tmp_path: Path,
                                             capsys: Any) -> None:
    assert main(["up", "cpu:none", "--port", str(port), "--no-download", "--hf-cache", str(tmp_path),
                 "--detach"]) == 0
    (server,) = hosts["local"].launched
    assert server.kept and server.running and f"stop {server.name}" not in hosts["local"].events
    assert f"left running (detached). Stop it with: sparklab down {server.name}" in capsys.readouterr().out


def test_one_server_across_two_hosts_takes_the_same_path(hosts: dict[str, FakeRuntime], port: int, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, capsys: Any) -> None:
    monkeypatch.setattr(launch, "watch", _ctrl_c)
    assert main(["up", "gb10-pair", "--image", "example/standin:2", "--no-gpus", "--hf-cache", str(tmp_path),
                 "--no-download", "--port", str(port), "--set", "gpu_memory_utilization=0.01",
                 "--host", f"local,{LINK}", "--host", f"ssh://me@spark-2,{LINK}"]) == 0
    out, err = capsys.readouterr()
    (head,), (worker,) = hosts["local"].launched, hosts["spark-2"].launched
    assert "removed leftover container old-local on local (its sparklab process is gone)" in err
    assert "removed leftover container old-spark-2 on spark-2 (its sparklab process is gone)" in err
    assert f"starting {head.name} across local, spark-2: gb10-pair / vllm / none (example/standin:2)" in err
    assert "node 0 (head) on local: starting" in err and "node 1 (worker) on spark-2: starting" in err
    assert f"http://127.0.0.1:{port}" in out
    assert "serving from 2 hosts in the foreground: Ctrl-C stops and removes every node." in out
    assert f"stopped and removed {head.name} and its other nodes in " in err
    assert hosts["local"].events[-2:] == [f"stop {worker.name}", f"stop {head.name}"]  # every node, the head last


def test_a_server_across_hosts_is_not_detached(hosts: dict[str, FakeRuntime], port: int, tmp_path: Path,
                                              capsys: Any) -> None:
    # a free port of its own: the recipe's 8000 may be taken on this host (a CPU engine serving there failed it)
    assert main(["up", "gb10-pair", "--image", "example/standin:2", "--no-gpus", "--hf-cache", str(tmp_path),
                 "--no-download", "--port", str(port), "--set", "gpu_memory_utilization=0.01", "--detach",
                 "--host", f"local,{LINK}", "--host", f"ssh://me@spark-2,{LINK}"]) == 1
    assert "a server across hosts runs in the foreground" in capsys.readouterr().err
    assert not hosts  # refused before any host was reached


def test_a_ctrl_c_as_the_wait_display_closes_still_stops_the_server(hosts: dict[str, FakeRuntime], port: int,
                                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: Any) -> None:
    """The server is ready and the "waiting for the server…" display is closing (rich joins its refresh thread):
    a Ctrl-C there, before the foreground watch, still stops and removes the server."""
    from sparklab.cli.progress import PullProgress

    closing = PullProgress.__exit__

    def interrupted(self: PullProgress, *exc: Any) -> None:
        closing(self, *exc)
        if exc[0] is None:
            raise KeyboardInterrupt

    monkeypatch.setattr(PullProgress, "__exit__", interrupted)
    assert main(["up", "cpu:none", "--port", str(port), "--no-download", "--hf-cache", str(tmp_path)]) == 130
    (server,) = hosts["local"].launched
    assert not server.running and hosts["local"].events[-1] == f"stop {server.name}"
    assert "interrupted; everything sparklab started has been removed." in capsys.readouterr().err
