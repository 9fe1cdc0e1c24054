"""Readiness against a real local HTTP server and a scripted container state."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sparklab.errors import NotReadyError
from sparklab.runtimes.health import wait_ready


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
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()


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


def test_ready_after_503s_and_checks_the_container_each_try(server: Scripted) -> None:
    container = Container()
    seconds = wait_ready(container, server.url, kind="vllm", timeout_s=30, headers={"Authorization": "Bearer k"})
    assert server.hits == 4
    assert container.checks == 4
    assert server.auth == ["Bearer k"] * 4
    assert 0 < seconds < 10


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
    s = Scripted([503] * 1000)
    try:
        started = time.monotonic()
        with pytest.raises(NotReadyError) as exc:
            wait_ready(Container(), s.url, kind="sglang", timeout_s=2, max_interval_s=0.5)
        elapsed = time.monotonic() - started
    finally:
        s.httpd.shutdown()
    assert 2 <= elapsed < 4
    assert "not ready after 2 s" in str(exc.value) and "--ready-timeout" in str(exc.value)


def test_connection_refused_is_retried_until_the_deadline() -> None:
    with pytest.raises(NotReadyError, match="not ready after 1 s"):
        wait_ready(Container(), "http://127.0.0.1:9/v1/models", kind="vllm", timeout_s=1, max_interval_s=0.2)


def test_wrong_key_fails_at_once() -> None:
    s = Scripted([401])
    try:
        with pytest.raises(NotReadyError, match="answered 401: the server rejects sparklab's API key"):
            wait_ready(Container(), s.url, kind="vllm", timeout_s=60)
    finally:
        s.httpd.shutdown()
