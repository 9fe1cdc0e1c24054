"""The engine HTTP door's deadlines: a GET ends by its timeout however the engine answers, and the counter snapshots
of one bench cell share one budget, each path asked once."""

from __future__ import annotations

import time

import pytest

from sparklab.engines.api import Answer, Budget, EngineAPI, fetch
from sparklab.errors import EngineUnreachable
from tests.scripted_server import Hostile


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SlowAPI:
    """Each GET takes `seconds` of the fake clock, or all of its timeout when the engine hangs."""

    def __init__(self, clock: Clock, seconds: float, hangs: bool = False) -> None:
        self.clock, self.seconds, self.hangs = clock, seconds, hangs
        self.asked: list[tuple[str, float]] = []

    def get(self, path: str, timeout_s: float = 10.0) -> Answer:
        self.asked.append((path, timeout_s))
        if self.hangs:
            self.clock.now += timeout_s
            raise EngineUnreachable("Read timed out.")
        self.clock.now += self.seconds
        return Answer(200, f"answer to {path}")


def test_each_path_is_asked_once_however_many_adapters_list_it() -> None:
    api = SlowAPI(Clock(), 0.01)
    replies = fetch(api, ["/metrics", "/server_info", "/metrics", "/metrics"])  # type: ignore[arg-type]
    assert [path for path, _ in api.asked] == ["/metrics", "/server_info"]
    assert replies.get("/metrics").text == "answer to /metrics"
    with pytest.raises(KeyError):
        replies.get("/version")  # an adapter reading a path it does not list is a bug, not an unreachable engine


def test_a_hung_engine_spends_the_cells_budget_once_not_per_get() -> None:
    clock = Clock()
    api = SlowAPI(clock, 0.0, hangs=True)
    budget = Budget(10.0, clock)
    before = fetch(api, ["/metrics", "/server_info"], budget)  # type: ignore[arg-type]
    after = fetch(api, ["/metrics", "/server_info"], budget)  # type: ignore[arg-type]
    assert api.asked == [("/metrics", 10.0)]  # one GET waited; the others were not sent
    assert clock.now == 10.0
    for replies in (before, after):
        with pytest.raises(EngineUnreachable):
            replies.get("/server_info")
    with pytest.raises(EngineUnreachable, match="10 s for server counters were spent"):
        after.get("/metrics")


def test_a_slow_answer_leaves_the_rest_of_the_budget_to_the_next_get() -> None:
    clock = Clock()
    api = SlowAPI(clock, 4.0)
    budget = Budget(10.0, clock)
    fetch(api, ["/metrics", "/server_info"], budget)  # type: ignore[arg-type]
    fetch(api, ["/metrics", "/server_info"], budget)  # type: ignore[arg-type]
    assert api.asked == [("/metrics", 10.0), ("/server_info", 6.0), ("/metrics", 2.0)]
    assert budget.left == pytest.approx(-2.0)


def test_without_a_budget_each_get_has_the_usual_timeout() -> None:
    api = SlowAPI(Clock(), 30.0)
    fetch(api, ["/metrics", "/server_info"])  # type: ignore[arg-type]
    assert api.asked == [("/metrics", 10.0), ("/server_info", 10.0)]


def test_a_get_ends_by_its_timeout_while_the_engine_trickles_its_answer() -> None:
    """Each byte comes well within the socket timeout, so only the whole GET's deadline can end it."""
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n"
    trickling = Hostile(lambda body: [(0.0, head), *((0.2, b"x") for _ in range(100))])
    started = time.monotonic()
    try:
        with pytest.raises(EngineUnreachable, match="no whole answer within 1 s"):
            EngineAPI(trickling.root).get("/metrics", timeout_s=1.0)
    finally:
        trickling.close()
    assert time.monotonic() - started < 2.0  # before: 20 s, one byte every 0.2 s


def test_a_get_reads_a_whole_answer_and_its_charset() -> None:
    body = "vllm:generation_tokens_total 3\n# é\n".encode()
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n")
    server = Hostile(lambda request: [(0.0, head), (0.0, body[:10]), (0.05, body[10:])])
    try:
        answer = EngineAPI(server.root).get("/metrics")
    finally:
        server.close()
    assert answer == Answer(200, "vllm:generation_tokens_total 3\n# é\n")
