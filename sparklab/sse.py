"""A lean HTTP/1.1 client for server-sent events, so the benchmark client is never the bottleneck.

The openai package reads a stream through a dozen nested async iterators per event; a benchmark at high
concurrency then measures its own client. Here an asyncio Protocol gets whole socket reads, stamps each read
once with time.perf_counter, de-chunks the body, splits it into SSE events and hands each `data:` payload to
a callback synchronously. Connections are kept alive and reused. Plain http only (local servers); callers
fall back to the openai package for https.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from time import perf_counter as _perf_counter
from urllib.parse import urlsplit

# (arrival time of the read that completed the event, the event's data payload). The payload may be a
# memoryview into the receive buffer: use it (orjson parses it directly) before returning, never keep it.
OnEvent = Callable[[float, "bytes | memoryview"], None]

_SIZE, _DATA, _CRLF, _TRAILER = range(4)  # chunked decoder states


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


class _SSEProtocol(asyncio.Protocol):
    """One connection; one request at a time. Parses status, headers, chunked/length/close bodies, SSE."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.sent_at = 0.0
        self._reset(None, None)

    def _reset(self, on_event: OnEvent | None, done: asyncio.Future[None] | None) -> None:
        self.on_event = on_event
        self.done = done
        self.buf = bytearray()  # raw bytes not yet parsed
        self.body = bytearray()  # de-chunked body bytes not yet split into events
        self.headers_done = False
        self.status = 0
        self.chunked = False
        self.length: int | None = None
        self.keep_alive = True
        self.state = _SIZE  # where the chunked decoder is
        self.chunk_left = 0  # bytes of the current chunk still to read
        self.received = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            if self.headers_done and not self.chunked and self.length is None:
                self._flush_events(_perf_counter(), final=True)  # close-delimited body: EOF ends it
                self._finish()
            else:
                self.done.set_exception(exc or ConnectionError("connection closed before the response ended"))

    def start(self, request: bytes, on_event: OnEvent) -> asyncio.Future[None]:
        loop = asyncio.get_running_loop()
        self._reset(on_event, loop.create_future())
        assert self.transport is not None and self.done is not None
        self.sent_at = _perf_counter()
        self.transport.write(request)
        return self.done

    def data_received(self, data: bytes) -> None:
        now = _perf_counter()
        self.buf += data
        if not self.headers_done and not self._parse_headers():
            return
        if self.chunked:
            self._dechunk()
        else:
            self.body += self.buf
            self.received += len(self.buf)
            self.buf.clear()
            if self.length is not None and self.received >= self.length:
                self._flush_events(now, final=True)
                self._finish()
                return
        self._flush_events(now, final=False)

    def _parse_headers(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        self.status = int(head[0].split(" ", 2)[1])
        for line in head[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "transfer-encoding" and "chunked" in value:
                self.chunked = True
            elif name == "content-length":
                self.length = int(value)
            elif name == "connection" and value == "close":
                self.keep_alive = False
        self.headers_done = True
        return True

    def _dechunk(self) -> None:
        buf, pos, n, finished = self.buf, 0, len(self.buf), False
        while pos < n:
            if self.state == _SIZE:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                try:
                    size = int(buf[pos:eol], 16)
                except ValueError:  # a chunk extension: "1a;name=value"
                    size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
                pos = eol + 2
                if size:
                    self.chunk_left, self.state = size, _DATA
                else:
                    self.state = _TRAILER
            elif self.state == _DATA:
                take = min(self.chunk_left, n - pos)
                self.body += buf[pos : pos + take]
                pos += take
                self.chunk_left -= take
                if not self.chunk_left:
                    self.state = _CRLF
            elif self.state == _CRLF:
                if n - pos < 2:
                    break
                pos += 2
                self.state = _SIZE
            else:  # _TRAILER: optional trailer lines, then an empty line ends the message
                if buf.startswith(b"\r\n", pos):
                    pos, finished = pos + 2, True
                    break
                eol = buf.find(b"\r\n\r\n", pos)
                if eol < 0:
                    break
                pos, finished = eol + 4, True
                break
        del buf[:pos]
        if finished:
            self._flush_events(_perf_counter(), final=True)
            self._finish()

    def _flush_events(self, now: float, final: bool) -> None:
        body = self.body
        if self.status != 200 or self.on_event is None:
            return  # an error body is read whole, then reported
        on_event = self.on_event
        start = 0
        with memoryview(body) as view:  # zero-copy slices; released before the buffer is trimmed
            while True:
                end = body.find(b"\n\n", start)
                if end < 0:
                    break
                if body.startswith(b"data: ", start) and body.find(b"\n", start, end) < 0:
                    on_event(now, view[start + 6 : end])  # the common case: one `data: ` line
                else:
                    self._event(now, bytes(view[start:end]))
                start = end + 2
            if final and start < len(body) and bytes(view[start:]).strip():
                self._event(now, bytes(view[start:]))
                start = len(body)
        del body[:start]

    def _event(self, now: float, raw: bytes) -> None:
        """The general case: several lines, comments, `data:` without a space, CRLF line ends."""
        for line in raw.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:") and self.on_event is not None:
                self.on_event(now, line[5:].strip())

    def _finish(self) -> None:
        done = self.done
        if done is None or done.done():
            return
        if self.status != 200:
            done.set_exception(HTTPStatusError(self.status, bytes(self.body)))
        else:
            done.set_result(None)
        if not self.keep_alive and self.transport is not None:
            self.transport.close()
            self.closed = True


class SSEClient:
    """POSTs JSON and streams the SSE response, over a pool of keep-alive connections to one server."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http":
            raise ValueError("SSEClient speaks plain http only")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = (f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\n{extra}").encode("latin-1")
        self._idle: list[_SSEProtocol] = []
        self._all: set[_SSEProtocol] = set()

    def request_bytes(self, path: str, body: bytes) -> bytes:
        """The whole request, built once per prompt so sending costs one write."""
        return (f"POST {self.prefix}{path} HTTP/1.1\r\n".encode() + self._head
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    async def _connection(self, fresh: bool = False) -> _SSEProtocol:
        while self._idle and not fresh:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(_SSEProtocol, self.host, self.port)
        self._all.add(protocol)
        return protocol

    async def warm(self, connections: int) -> None:
        """Open connections ahead of a measured window, so no request there pays for a TCP handshake."""
        missing = max(0, connections - len(self._idle))
        opened = await asyncio.gather(*(self._connection(fresh=True) for _ in range(missing)))
        self._idle.extend(opened)

    async def stream(self, request: bytes, on_event: OnEvent, timeout_s: float) -> float:
        """Send a prebuilt request; call on_event for each SSE data payload; return when the response ends.

        Returns when the request bytes were handed to the socket (perf_counter).
        """
        conn = await self._connection()
        try:
            await asyncio.wait_for(conn.start(request, on_event), timeout_s)
        except BaseException:
            if conn.transport is not None:
                conn.transport.close()
            conn.closed = True
            raise
        if not conn.closed:
            self._idle.append(conn)
        return conn.sent_at

    def close(self) -> None:
        for conn in self._all:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
        self._all.clear()
