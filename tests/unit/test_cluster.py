"""sparklab.cluster with a fake runtime per host (tests/fakes.py): the start order (head, its cluster port, then the worker, then
readiness), and teardown of every node on every path (a refused node, Ctrl-C, a head that dies, a worker that
dies while serving, a host that does not answer)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from sparklab.errors import ContainerError, ImageUnavailableError, NotReadyError, PreflightError
from sparklab.recipes.hosts import parse_hosts
from sparklab.recipes.multinode import ClusterSpec, render_cluster
from sparklab.recipes.render import LaunchOptions
from sparklab.recipes.schema import load_recipe
from sparklab.runtimes import cluster
from sparklab.runtimes.launch import Launch
from tests.fakes import FakeRuntime, FakeServer

PAIR = Path(__file__).resolve().parents[2] / "recipes" / "gb10-pair.yaml"
LINK = ["local,cluster_address=10.0.0.1,interface=eth1,ib_hca=hca1",
        "ssh://me@spark-2,cluster_address=10.0.0.2,interface=eth1,ib_hca=hca1"]


def _pair() -> tuple[Launch, ClusterSpec]:
    recipe = load_recipe(PAIR)
    spec = render_cluster(recipe, "vllm", "none", LaunchOptions(), parse_hosts(LINK, "--host"))
    return Launch(recipe, spec.head), spec


def _start(runtimes: list[FakeRuntime], ready: Any, **kwargs: Any) -> Any:
    p, spec = _pair()
    return cluster.start(p, spec, runtimes, ready=ready, log_dir=Path("/nonexistent"), **kwargs)


def _names(events: list[str]) -> list[str]:
    """Events with the long container names cut to head/worker."""
    out = []
    for e in events:
        e = e.replace("sparklab-gb10-pair-vllm-none-node1", "worker").replace("sparklab-gb10-pair-vllm-none", "head")
        out.append(e)
    return out


def test_the_head_starts_first_the_worker_once_its_cluster_port_answers_then_readiness_on_the_head() -> None:
    events: list[str] = []
    dockers = [FakeRuntime("local", events, port_after=2), FakeRuntime("spark-2", events)]
    seen: dict[str, Any] = {}

    def ready(server: Any, url: str, **kw: Any) -> float:
        events.append(f"ready? {url}")
        seen["running"] = server.state()
        return 0.1

    started = _start(dockers, ready)
    assert _names(events) == ["image on local", "image on spark-2", "launch head on local",
                              "probe 10.0.0.1:6379", "probe 10.0.0.1:6379", "probe 10.0.0.1:6379",
                              "launch worker on spark-2", "ready? http://127.0.0.1:8000/v1/models"]
    assert seen["running"] == (True, None) and started.api_key
    events.clear()
    with started.server:
        pass
    assert _names(events) == ["stop worker", "stop head"]  # every node, the head last


def test_a_host_without_the_image_fails_the_start_before_any_node_runs() -> None:
    events: list[str] = []
    with pytest.raises(ImageUnavailableError):
        _start([FakeRuntime("local", events), FakeRuntime("spark-2", events, no_image=True)], lambda *a, **k: 0.0)
    assert not [e for e in events if e.startswith("launch")]


def test_a_node_refused_on_the_second_host_takes_the_head_down_and_says_where() -> None:
    events: list[str] = []
    with pytest.raises(ContainerError) as caught:
        _start([FakeRuntime("local", events), FakeRuntime("spark-2", events, refuse=True)], lambda *a, **k: 0.0)
    assert caught.value.message.startswith("node 1 (worker) on spark-2: docker could not start")
    assert _names(events)[-2:] == ["refused on spark-2", "stop head"]


def test_ctrl_c_while_waiting_tears_down_every_node() -> None:
    events: list[str] = []

    def interrupted(server: Any, url: str, **kw: Any) -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        _start([FakeRuntime("local", events), FakeRuntime("spark-2", events)], interrupted)
    assert _names(events)[-2:] == ["stop worker", "stop head"]


def test_a_head_that_exits_before_its_cluster_port_opens_fails_at_once_and_no_worker_starts() -> None:
    events: list[str] = []
    head_docker = FakeRuntime("local", events, port_after=1000)
    original = head_docker.launch

    def dying(*args: Any, **kwargs: Any) -> FakeServer:
        node = original(*args, **kwargs)
        node.running, node.code = False, 1
        return node

    head_docker.launch = dying  # type: ignore[method-assign]
    with pytest.raises(NotReadyError) as caught:
        _start([head_docker, FakeRuntime("spark-2", events)], lambda *a, **k: 0.0)
    assert "the head exited with code 1" in caught.value.message and "before its cluster port 10.0.0.1:6379" \
        in caught.value.message
    assert "launch worker on spark-2" not in _names(events) and _names(events)[-1] == "stop head"


def test_a_cluster_port_that_never_opens_is_an_error_naming_the_address_to_check() -> None:
    events: list[str] = []
    _, spec = _pair()
    server = cluster.ClusterServer(spec)
    server.add(FakeServer("head", events, port_after=10**6))
    clock = iter(range(0, 1000, 100))
    with pytest.raises(NotReadyError) as caught:
        cluster.wait_cluster_port(server, 250, clock=lambda: float(next(clock)), sleep=lambda s: None)
    assert "10.0.0.1:6379 did not open in 250 s" in caught.value.message
    assert "cluster_address" in (caught.value.hint or "") and "local" in (caught.value.hint or "")


def _watched_pair() -> tuple[cluster.ClusterServer, FakeServer, list[str]]:
    """A server across two fake nodes, watched every 10 ms: (it, its worker, what the nodes were told)."""
    events: list[str] = []
    _, spec = _pair()
    server = cluster.ClusterServer(spec, poll_s=0.01)
    worker = FakeServer("worker", events)
    server.add(FakeServer("head", events))
    server.add(worker)
    server.watch()
    return server, worker, events


def _until_the_head_is_killed(events: list[str]) -> None:
    deadline = time.monotonic() + 5
    while "kill head" not in events and time.monotonic() < deadline:
        time.sleep(0.01)


def test_a_worker_that_dies_while_serving_kills_the_head_and_ends_the_server() -> None:
    server, worker, events = _watched_pair()
    assert server.state() == (True, None)
    worker.running, worker.code = False, 137
    _until_the_head_is_killed(events)
    assert "kill head" in events  # requests in flight on the head fail now, not at their timeout
    assert server.state() == (False, 137)
    assert server.ended == "node 1 (worker) on spark-2 exited with code 137"
    assert server.log_tail().startswith("[node 1 (worker) on spark-2 exited with code 137; its log:]\nworker:")
    server.stop()
    assert events[-2:] == ["stop worker", "stop head"]


def test_a_host_that_does_not_answer_does_not_keep_the_other_nodes_up() -> None:
    events: list[str] = []
    _, spec = _pair()
    server = cluster.ClusterServer(spec)
    head, worker = FakeServer("head", events), FakeServer("worker", events)
    worker.fail_stop = True
    server.add(head)
    server.add(worker)
    with pytest.raises(ContainerError, match="cannot reach the host of worker"):
        server.stop()
    assert events == ["stop worker", "stop head"]


def test_a_worker_whose_host_stops_answering_ends_the_server_and_says_so_not_an_exit_code() -> None:
    """Its host gone (power, ssh), a worker's state cannot be read: the watcher ends the server as for a worker that
    exited, and says the node does not answer (before: "exited with code None"); the server then reads as ended
    without asking that node again, and its teardown leaves the lost host's node (sparklab gc --host) but takes the
    head down."""
    server, worker, events = _watched_pair()

    def no_answer() -> tuple[bool, int | None]:
        raise ContainerError("cannot reach the host of worker")

    worker.state = no_answer  # type: ignore[method-assign]
    _until_the_head_is_killed(events)
    assert "kill head" in events
    assert server.ended == "node 1 (worker) on spark-2 does not answer (its host may be gone)"
    assert server.state() == (False, None)
    server.leave(["spark-2"])
    server.stop()
    assert events[-1:] == ["stop head"] and "stop worker" not in events


def test_the_heads_serve_command_goes_through_its_images_parser_before_any_node_starts() -> None:
    """The head runs `vllm serve` after `ray start`: that serve command is what vLLM's own parser judges, on the
    head's host, before any node starts; a refusal starts nothing."""
    events: list[str] = []
    dockers = [FakeRuntime("local", events), FakeRuntime("spark-2", events)]
    dockers[0].parser_says = json.dumps({"vllm_version": "0.27.1", "cases": [{"id": "0", "ok": False, "errors": [
        {"flag": None, "message": "unrecognized arguments: --speculative-confg"}]}]})
    with pytest.raises(PreflightError, match="unrecognized arguments: --speculative-confg"):
        _start(dockers, lambda *a, **k: 0.1)
    assert not [e for e in events if e.startswith("launch")], events
    (probe,) = dockers[0].probed
    (case,) = json.loads(probe.args[-1])["cases"]
    assert case["argv"][0] == "serve" and "--distributed-executor-backend" in case["argv"]
    assert probe.args[4] == "vllm" and dockers[1].probed == []  # the program whose Python runs it; on the head only
