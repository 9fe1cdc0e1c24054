"""A streaming OpenAI-style server whose every chunk, gap and counter is scripted by the test."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# How often a test server's serve_forever looks for shutdown(): its default, 0.5 s, made every close() wait that long.
POLL_S = 0.02

# One step: wait `delay` seconds, then send `event` (a dict as an SSE data line, or raw bytes as they are).
Step = tuple[float, dict[str, Any] | bytes]


def chunk(content: str = "", reasoning: str = "", token_ids: list[int] | None = None,
          finish: str | None = None, role: str | None = None) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = role
    if content or role:
        delta["content"] = content
    if reasoning:
        delta["reasoning_content"] = reasoning
    choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
    if token_ids is not None:
        choice["token_ids"] = token_ids
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [choice]}


def usage(completion: int, prompt: int = 7) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": [],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}}


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up mid-stream is what some tests are about; never print its traceback."""


@dataclass
class Scripted:
    """`script(body)` returns the steps for one request; `/metrics` serves `metrics_text()`."""

    script: Callable[[dict[str, Any]], list[Step]]
    metrics_text: Callable[[], str] = lambda: ""
    status: int = 200
    bodies: list[dict[str, Any]] = field(default_factory=list)
    resets: list[int] = field(default_factory=list)  # len(bodies) at each POST /reset_prefix_cache
    gets: list[str] = field(default_factory=list)  # the path of every GET, in order

    def __post_init__(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # each chunk is its own small write: with Nagle on, every one after the first waits for the client's
            # delayed ACK (40 ms on Linux), which made a 12-request cell take ~0.5 s
            disable_nagle_algorithm = True

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                owner.gets.append(self.path)
                if self.path == "/v1/models":
                    self._send(200, json.dumps({"object": "list", "data": [{"id": "scripted-model"}]}).encode())
                elif self.path == "/metrics":
                    self._send(200, owner.metrics_text().encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b"{}")

            def do_POST(self) -> None:
                if self.path == "/reset_prefix_cache":  # vLLM's (in dev mode)
                    owner.resets.append(len(owner.bodies))
                    self._send(200, b"")
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.bodies.append(body)
                if owner.status != 200:
                    self._send(owner.status, json.dumps({"error": {"message": "scripted failure"}}).encode())
                    return
                steps = owner.script(body)
                if not body.get("stream"):
                    time.sleep(sum(delay for delay, _ in steps))
                    self._send(200, json.dumps(steps[-1][1]).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for delay, event in steps:
                    time.sleep(delay)
                    data = event if isinstance(event, bytes) else f"data: {json.dumps(event)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.root = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(POLL_S,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


# One raw send: wait `delay` seconds, then write the bytes as they are (status line, headers and framing included).
RawStep = tuple[float, bytes]


@dataclass
class Hostile:
    """A server that breaks HTTP and SSE the ways real servers and proxies do: it reads one request per connection,
    writes exactly the scripted bytes, then holds the connection open for `hold_s` (or until the client hangs up)
    and closes it. `reply(body)` returns the raw steps for one request. Listens on 127.0.0.1 only."""

    reply: Callable[[dict[str, Any]], list[RawStep]]
    hold_s: float = 0.0
    bodies: list[dict[str, Any]] = field(default_factory=list)
    resets: list[int] = field(default_factory=list)  # len(bodies) at each POST /reset_prefix_cache

    def __post_init__(self) -> None:
        owner = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                data = b""
                while b"\r\n\r\n" not in data:
                    more = sock.recv(65536)
                    if not more:
                        return
                    data += more
                head, _, body = data.partition(b"\r\n\r\n")
                length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                while len(body) < length:
                    more = sock.recv(65536)
                    if not more:
                        return
                    body += more
                request = json.loads(body) if body else {}
                owner.bodies.append(request)
                try:
                    for delay, raw in owner.reply(request):
                        time.sleep(delay)
                        sock.sendall(raw)
                    if owner.hold_s:
                        sock.settimeout(owner.hold_s)
                        with contextlib.suppress(OSError):
                            while sock.recv(65536):  # until the client hangs up, or hold_s without a byte
                                pass
                except OSError:  # the client gave up on us: that is what the tests want to see
                    pass

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.root = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(POLL_S,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


def sse(event: dict[str, Any] | str) -> bytes:
    """One SSE event (a dict as JSON, a string as it is), unframed."""
    return f"data: {event if isinstance(event, str) else json.dumps(event)}\n\n".encode()


def http_chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"
