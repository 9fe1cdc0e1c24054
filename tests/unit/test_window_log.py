"""A window's SGLang acceptance lines are read once the engine's log has caught up: dockerd stamps a line when its
copier reads the engine's pipe, a moment after the engine wrote it, so a read right at the window's edge misses the
last request's line, and a warmup line stamped late is counted in the window."""

from __future__ import annotations

import time
from typing import Any

import pytest

from sparklab import engines
from sparklab.bench import cell
from sparklab.bench.workloads import load_workload
from sparklab.records import Sampling
from tests.scripted_server import Scripted, Step, chunk, usage

pytestmark = pytest.mark.unit


def decode_line(length: float) -> str:
    # SGLang 0.5.23 managers/scheduler_components/metrics_reporter.py:963-1042, as the stand-in prints it
    return (f"[2026-12-04 10:00:00 TP0] Decode batch, #running-req: 1, #token: 40, token usage: 0.00, "
            f"accept len: {length:.2f}, accept rate: 0.33, cuda graph: False, gen throughput (token/s): 0.00, "
            f"#queue-req: 0")


class LateLog:
    """A container log on a fake clock: each line becomes readable `lag` seconds after its time."""

    def __init__(self, lines: list[tuple[float, str]], lag: float) -> None:
        self.lines, self.lag, self.now, self.reads = lines, lag, 0.0, 0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def text(self) -> str:
        self.reads += 1
        return "".join(line + "\n" for at, line in self.lines if at + self.lag <= self.now)


def test_the_last_line_stamped_late_is_still_read() -> None:
    """Four lines written by t=0; the copier delivers them 0.15 s late. A read at t=0 sees none of them."""
    log = LateLog([(0.0, decode_line(2.0)) for _ in range(4)], lag=0.15)
    text = cell.settle_log("sglang", log.text, clock=log.clock, sleep=log.sleep)
    found = engines.engine("sglang").log_acceptance(text)
    assert found is not None and found["samples"] == 4
    assert log.now < cell.LOG_QUIET_S + 0.15 + 2 * cell.LOG_POLL_S  # no longer than the quiet time past the last line


def test_lines_that_are_not_acceptance_lines_do_not_hold_the_read() -> None:
    """A health check's access line every 50 ms keeps the text changing; the acceptance lines have stopped."""
    lines = [(0.0, decode_line(2.0))] + [(0.05 * i, f"INFO:     127.0.0.1 - \"GET /health HTTP/1.1\" 200 OK #{i}")
                                         for i in range(200)]
    log = LateLog(lines, lag=0.0)
    cell.settle_log("sglang", log.text, clock=log.clock, sleep=log.sleep)
    assert log.now <= cell.LOG_QUIET_S + 2 * cell.LOG_POLL_S


def test_an_engine_that_never_stops_printing_is_read_at_the_budget() -> None:
    log = LateLog([(0.05 * i, decode_line(2.0)) for i in range(1000)], lag=0.0)
    text = cell.settle_log("sglang", log.text, clock=log.clock, sleep=log.sleep)
    assert cell.LOG_SETTLE_BUDGET_S <= log.now <= cell.LOG_SETTLE_BUDGET_S + cell.LOG_POLL_S + 1e-9
    assert text.count("accept len") >= cell.LOG_SETTLE_BUDGET_S / 0.05  # the last read is returned


def test_a_rehearsal_waits_on_its_own_clock() -> None:
    """A rehearsal runs its night 20 times faster: its wait is the night's 0.3 s, 15 ms of wall time, not 0.3 s
    (which its night clock would read as 6 s per cell)."""
    log = LateLog([(0.0, decode_line(2.0))], lag=0.0)
    cell.settle_log("sglang", log.text, scale=0.05, clock=log.clock, sleep=log.sleep)
    assert 0.05 * cell.LOG_QUIET_S <= log.now <= 0.05 * (cell.LOG_QUIET_S + 2 * cell.LOG_POLL_S)


@pytest.mark.parametrize("kind", ["vllm", "llamacpp", None])
def test_engines_with_counters_are_read_once_without_waiting(kind: str | None) -> None:
    log = LateLog([(0.0, "anything")], lag=0.0)
    assert cell.settle_log(kind, log.text, clock=log.clock, sleep=log.sleep) == "anything\n"
    assert log.reads == 1 and log.now == 0.0
    assert cell.log_settler(kind, log.text) is None


def test_add_log_acceptance_waits_for_the_window_s_last_line() -> None:
    """The sweep's and `sparklab bench`'s read: the last of four lines arrives on the third read."""
    reads: list[str] = []

    def text() -> str:
        reads.append("read")
        return "".join(decode_line(2.0) + "\n" for _ in range(3 if len(reads) < 3 else 4))

    result: Any = {}
    cell.add_log_acceptance(result, "sglang", text, "0.5.23")
    assert result["speculative_log"]["samples"] == 4 and result["speculative_log"]["mean"] == pytest.approx(2.0)


def test_before_window_runs_after_the_warmup_and_before_the_window_opens() -> None:
    def script(body: dict[str, Any]) -> list[Step]:
        return [(0.0, chunk(role="assistant")), (0.005, chunk(content="a b", token_ids=[1, 2])), (0.0, usage(2)),
                (0.0, b"data: [DONE]\n\n")]

    server = Scripted(script)
    seen: list[tuple[int, float]] = []
    try:
        result = cell.run(cell.Endpoint.from_url(server.root, model="m"), load_workload("seed"),
                          Sampling(max_tokens=2), cell.Load(concurrency=1, requests=3, warmup=2),
                          before_window=lambda: seen.append((len(server.bodies), time.time())))
    finally:
        server.close()
    assert [n for n, _ in seen] == [2]  # once, with both warmup requests answered and no measured one sent
    assert result["measurement"]["window_started_at"] >= seen[0][1]
