"""A server watched as a sweep watches its own (issue 27, item 6), with fakes: `bench` on a sparklab server ends when
that server's engine logs a fatal line or the server exits (runtimes.follow, bench.cell's stop), and `up` in the
foreground stops its server at the memory floor and when it goes silent after ready (runtimes.launch.watch). The
real engines' versions of these are in tests/docker/test_dead_engine.py and tests/process/test_process_lifecycle.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparklab.bench import cell
from sparklab.bench.workloads import load_workload
from sparklab.engines import engine
from sparklab.engines.logwatch import LogWatch
from sparklab.errors import MemoryFloorError, NotReadyError, ServerError
from sparklab.host import watchdog
from sparklab.records import Sampling
from sparklab.runtimes import follow, launch
from sparklab.runtimes.base import ServerInfo, Target
from tests.fakes import FakeRuntime, FakeServer
from tests.scripted_server import Scripted, chunk

FATAL = "(EngineCore pid=7) ERROR 12-01 10:00:00 [core.py:1351] EngineCore encountered a fatal error."


# -- bench on a sparklab server --------------------------------------------------------------------------------------


class _LogRuntime(FakeRuntime):
    """A host whose one server's log is fed by the test (logs(follow=True) blocks for more, as Docker's does) and
    whose listing says whether it runs."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[bytes] = [b"INFO Application startup complete.\n"]
        self.more = threading.Condition()
        self.ended = False
        self.status = "running"

    def add(self, line: str) -> None:
        with self.more:
            self.lines.append(line.encode() + b"\n")
            self.more.notify_all()

    def end(self, status: str = "exited") -> None:
        with self.more:
            self.status, self.ended = status, True
            self.more.notify_all()

    def logs(self, name: str, follow: bool = False, tail: int | str = "all",
             since: float | None = None) -> Iterator[bytes]:
        sent = 0
        while True:
            with self.more:
                while sent == len(self.lines) and not self.ended:
                    self.more.wait(0.1)
                fresh, sent = self.lines[sent:], len(self.lines)
                ended = self.ended
            yield from fresh
            if ended or not follow:
                return

    def log_text(self, name: str, since: float | None = None) -> str:
        return b"".join(self.lines).decode()

    def containers(self, include_stopped: bool = True) -> list[ServerInfo]:
        return [ServerInfo("c1", "srv", self.status, 1 if self.status == "exited" else None, {}, "")]


def _wait(until: Any, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not until():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.02)


def test_a_fatal_line_in_the_servers_log_is_the_watchs_problem_a_moment_later() -> None:
    runtime = _LogRuntime()
    watch = follow.ServerWatch(runtime, Target("http://127.0.0.1:1", None, "srv", "vllm"), "bench")
    time.sleep(0.2)
    assert watch.problem() is None
    runtime.add(FATAL)
    runtime.add("RuntimeError: the engine's own error")
    _wait(lambda: watch.problem() is not None)
    problem = watch.problem()
    assert isinstance(problem, NotReadyError) and problem.kind == "fatal"
    assert "the engine logged a fatal error while bench ran" in problem.message and FATAL in problem.message
    assert "RuntimeError: the engine's own error" in (problem.hint or "")
    runtime.end("running")


def test_a_server_that_exits_is_the_watchs_problem() -> None:
    runtime = _LogRuntime()
    watch = follow.ServerWatch(runtime, Target("http://127.0.0.1:1", None, "srv", "vllm"), "bench")
    runtime.add("Killed")
    runtime.end("exited")
    _wait(lambda: watch.problem() is not None)
    problem = watch.problem()
    assert isinstance(problem, ServerError)
    assert "the server srv exited with code 1 while bench ran" in problem.message


def test_a_cell_ends_within_a_moment_of_its_stop_and_raises_the_reason() -> None:
    """The requests hang (a dead engine's API server); stop() gives a reason 0.5 s in: the cell ends then, not at
    its request timeout. Before: no cell could be cut short."""
    server = Scripted(lambda body: [(0.0, chunk("a")), (30.0, chunk("b"))])
    began = time.monotonic()
    reason = ServerError("the engine died")
    try:
        with pytest.raises(ServerError, match="the engine died"):
            cell.run(cell.Endpoint(server.root, model="scripted-model"), load_workload("seed"), Sampling(max_tokens=4),
                     cell.Load(concurrency=2, requests=4, warmup=0), stall_timeout_s=None,
                     stop=lambda: reason if time.monotonic() - began > 0.5 else None)
    finally:
        server.close()
    assert time.monotonic() - began < 3


@pytest.mark.parametrize("hangs", ["prefix-cache reset", "counter snapshot"])
def test_a_cell_stopped_while_it_waits_on_a_blocking_call_ends_without_waiting_for_it(
        hangs: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A host that froze: the cell's reset of the prefix cache (after its warmup) or its counter snapshot hangs on the
    engine (up to its own 10-30 s timeout), and stop() gives a reason meanwhile. Before: the cell was cancelled at
    once, but asyncio.run then joined the thread of that call, so the cell ended only when the call gave up (25 s
    of a frozen host's loss, tests/docker/test_dead_hosts.py)."""
    release = threading.Event()

    def hang(*args: Any, **kwargs: Any) -> Any:
        release.wait(10)
        return {}

    if hangs == "prefix-cache reset":
        monkeypatch.setattr(type(engine("vllm")), "reset_prefix_cache", lambda self, api: hang())
    else:
        monkeypatch.setattr(cell.engines, "snapshot", hang)
    server = Scripted(lambda body: [(0.0, chunk("a")), (0.0, chunk("b", finish="stop"))])
    began = time.monotonic()
    reason = ServerError("the host stopped answering")
    try:
        with pytest.raises(ServerError, match="the host stopped answering"):
            cell.run(cell.Endpoint(server.root, model="scripted-model", kind="vllm"), load_workload("seed"),
                     Sampling(max_tokens=4), cell.Load(concurrency=1, requests=2, warmup=1), stall_timeout_s=None,
                     stop=lambda: reason if time.monotonic() - began > 0.5 else None)
        took = time.monotonic() - began
    finally:
        release.set()
        server.close()
    assert took < 3, f"the cell ended {took:.1f} s in, after the hung call"


# -- up in the foreground ----------------------------------------------------------------------------------------


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class _Health:
    def __init__(self, answers: bool) -> None:
        self.answers, self.asked = answers, 0

    def alive(self, timeout_s: float = 5.0) -> bool:
        self.asked += 1
        return self.answers


def _serving(tmp_path: Path) -> tuple[FakeServer, LogWatch]:
    server = FakeServer("up-srv")
    server.log_path = tmp_path / "log"
    return server, LogWatch(engine("vllm"))


def test_a_silent_engine_that_answers_no_health_check_is_stopped_after_the_stall_timeout(tmp_path: Path) -> None:
    server, log_watch = _serving(tmp_path)
    clock, health = _Clock(), _Health(answers=False)
    with pytest.raises(NotReadyError) as caught:
        launch.watch(server, log_watch, memory=None, stall_s=30, api=health,  # type: ignore[arg-type]
                     clock=clock, sleep=clock.sleep)
    assert caught.value.kind == "stalled" and "no answer to its health check for 30 s while serving" in (
        caught.value.message)
    assert 30 <= clock.now <= 32 and server.events[-1].startswith("stop") and not server.running


def test_a_quiet_engine_that_answers_its_health_check_serves_on(tmp_path: Path) -> None:
    server, log_watch = _serving(tmp_path)
    clock, health = _Clock(), _Health(answers=True)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        if clock.now >= 600:  # ten minutes idle, then Ctrl-C
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.watch(server, log_watch, memory=None, stall_s=30, api=health,  # type: ignore[arg-type]
                     clock=clock, sleep=sleep)
    assert server.running and 600 / 30 <= health.asked <= 600 / 15  # asked every stall_s / 2 at most while quiet


def test_an_engine_whose_log_goes_on_is_not_asked(tmp_path: Path) -> None:
    server, log_watch = _serving(tmp_path)
    clock, health = _Clock(), _Health(answers=False)

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        log_watch.feed(b"INFO Avg prompt throughput: 1.0 tokens/s\n")
        if clock.now >= 300:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch.watch(server, log_watch, memory=None, stall_s=30, api=health,  # type: ignore[arg-type]
                     clock=clock, sleep=sleep)
    assert health.asked == 0 and server.running


def test_the_memory_floor_stops_a_foreground_server(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 16777216 kB\nMemFree: 1048576 kB\nMemAvailable: 2097152 kB\nCached: 0 kB\n")
    killed: list[str] = []
    server, log_watch = _serving(tmp_path)
    with watchdog.Sampler(floor_gib=4.0, meminfo=meminfo, gpu=False, on_floor=lambda: killed.append("kill")) as memory:
        _wait(lambda: memory.tripped is not None)
        with pytest.raises(MemoryFloorError) as caught:
            launch.watch(server, log_watch, memory=memory, stall_s=30, api=_Health(True))  # type: ignore[arg-type]
    assert killed == ["kill"] and not server.running
    assert "MemAvailable fell to 2.0 GiB, under the floor of 4.0 GiB: sparklab stopped the server" in (
        caught.value.message)
    assert "memory samples" in caught.value.message
