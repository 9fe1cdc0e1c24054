"""Readiness against a real local HTTP server and a scripted container state."""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparklab.errors import NotReadyError
from sparklab.runtimes.health import wait_ready
from tests.scripted_server import POLL_S


class Scripted:
    """A server whose HTTP answers follow a script: a list of status codes, then 200 forever."""

    def __init__(self, script: list[int]) -> None:
        self.script = list(script)
        self.hits = 0
        self.auth: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.hits += 1
                owner.auth.append(self.headers.get("Authorization"))
                code = owner.script.pop(0) if owner.script else 200
                self.send_response(code)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/models"
        threading.Thread(target=self.httpd.serve_forever, args=(POLL_S,), daemon=True).start()


@pytest.fixture
def server() -> Iterator[Scripted]:
    s = Scripted([503, 503, 503])
    yield s
    s.httpd.shutdown()


class Container:
    def __init__(self, exit_after: int | None = None, code: int = 137) -> None:
        self.checks = 0
        self.exit_after = exit_after
        self.code = code

    def state(self) -> tuple[bool, int | None]:
        self.checks += 1
        if self.exit_after is not None and self.checks > self.exit_after:
            return False, self.code
        return True, None

    def log_tail(self, lines: int = 50) -> str:
        return "\n".join(f"line {i}" for i in range(100))[-2000:] if lines else ""


class Clock:
    """A fake monotonic clock: `sleep` advances it at once and remembers what was asked."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def test_the_deadline_is_on_the_monotonic_clock_by_default() -> None:
    """The waits below run on a fake clock; a real wait reads time.monotonic, which a wall-clock step cannot move."""
    defaults = inspect.signature(wait_ready).parameters
    assert defaults["clock"].default is time.monotonic and defaults["sleep"].default is time.sleep


def test_ready_after_503s_and_checks_the_container_each_try(server: Scripted) -> None:
    container, clock = Container(), Clock()
    seconds = wait_ready(container, server.url, kind="vllm", timeout_s=30, headers={"Authorization": "Bearer k"},
                         clock=clock, sleep=clock.sleep)
    assert server.hits == 4
    assert container.checks == 4
    assert server.auth == ["Bearer k"] * 4
    assert clock.sleeps == [0.25, 0.5, 1.0]  # exponential backoff, capped at max_interval_s
    assert seconds == 1.75


def test_container_exit_fails_at_once_with_code_and_log_tail(server: Scripted) -> None:
    started = time.monotonic()
    with pytest.raises(NotReadyError) as exc:
        wait_ready(Container(exit_after=1, code=137), server.url, kind="vllm", timeout_s=600)
    assert time.monotonic() - started < 5
    text = str(exc.value)
    assert "exited with code 137" in text and "out of memory" in text
    assert "Last 50 log lines" in text and "line 99" in text
    assert exc.value.container_exit_code == 137


def test_deadline_is_monotonic_and_reports_the_tail() -> None:
    s, clock = Scripted([503] * 1000), Clock()
    try:
        started = clock()
        with pytest.raises(NotReadyError) as exc:
            wait_ready(Container(), s.url, kind="sglang", timeout_s=2, max_interval_s=0.5, clock=clock,
                       sleep=clock.sleep)
        elapsed = clock() - started
    finally:
        s.httpd.shutdown()
    assert elapsed == pytest.approx(2)  # the last sleep is cut to the deadline, not one interval past it
    assert max(clock.sleeps) == 0.5 and s.hits == len(clock.sleeps) + 1
    assert "not ready after 2 s" in str(exc.value) and "--ready-timeout" in str(exc.value)


def test_connection_refused_is_retried_until_the_deadline() -> None:
    container, clock = Container(), Clock()
    with pytest.raises(NotReadyError, match="not ready after 1 s"):
        wait_ready(container, "http://127.0.0.1:9/v1/models", kind="vllm", timeout_s=1, max_interval_s=0.2,
                   clock=clock, sleep=clock.sleep)
    assert clock() - 1000.0 == pytest.approx(1.0) and container.checks == len(clock.sleeps) + 1 > 3


def test_wrong_key_fails_at_once() -> None:
    s = Scripted([401])
    try:
        with pytest.raises(NotReadyError, match="answered 401: the server rejects sparklab's API key"):
            wait_ready(Container(), s.url, kind="vllm", timeout_s=60)
    finally:
        s.httpd.shutdown()
