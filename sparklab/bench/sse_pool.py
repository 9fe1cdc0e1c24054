"""The streaming client bench sends its requests with: a pool of keep-alive connections to one server, each an
SSEProtocol (sparklab.bench.sse) that parses one streamed response at a time."""

from __future__ import annotations

import asyncio
from time import perf_counter as _perf_counter
from urllib.parse import urlsplit

from sparklab.bench.sse import AsyncAlive, Ending, Limits, OnEvent, SSEProtocol, wait_watched


class SSEClient:
    """POSTs JSON and streams the SSE response, over a pool of keep-alive connections to one server."""

    def __init__(self, base_url: str, headers: dict[str, str], limits: Limits | None = None,
                 reuse: bool = True) -> None:
        parts = urlsplit(base_url)
        self.limits = limits or Limits()
        if parts.scheme != "http":
            raise ValueError("SSEClient speaks plain http only")
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self._head = (f"Host: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                      f"Accept: text/event-stream\r\n{extra}").encode("latin-1")
        self._idle: list[SSEProtocol] = []
        self._all: set[SSEProtocol] = set()
        # False from the start for a server known to close after each streamed response (one connection per
        # request), else once the server has closed a kept-alive connection under a request
        self.reuse = reuse
        self.per_request = not reuse  # the policy was chosen up front, not learnt from a stale connection
        self.stale = 0  # reused connections that closed before any byte of their response: the request went again
        self.opened = 0  # connections opened

    def request_bytes(self, path: str, body: bytes) -> bytes:
        """The whole request, built once per prompt so sending costs one write."""
        return (f"POST {self.prefix}{path} HTTP/1.1\r\n".encode() + self._head
                + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)

    def _pooled(self) -> SSEProtocol | None:
        while self._idle:
            conn = self._idle.pop()
            if not conn.closed:
                return conn
            self._all.discard(conn)
        return None

    async def _open(self) -> SSEProtocol:
        loop = asyncio.get_running_loop()
        _, protocol = await loop.create_connection(lambda: SSEProtocol(self.limits), self.host, self.port)
        self._all.add(protocol)
        self.opened += 1
        return protocol

    async def warm(self, connections: int) -> None:
        """Open connections ahead of a measured window, so no request there pays for a TCP handshake."""
        self._idle = [conn for conn in self._idle if not conn.closed]
        missing = max(0, connections - len(self._idle))
        opened = await asyncio.gather(*(self._open() for _ in range(missing)))
        self._idle.extend(opened)

    async def stream(self, request: bytes, on_event: OnEvent, timeout_s: float, grace_s: float = 2.0,
                     stall_s: float | None = None, alive: AsyncAlive | None = None) -> tuple[float, Ending]:
        """Send a prebuilt request; call on_event for each SSE data payload; return when the response ends.

        Returns when the request bytes were handed to the socket (perf_counter), and how the response ended.
        A pooled connection that closes before any byte of the response is stale: the request goes again on a
        new connection (the time lost there counts against timeout_s) and this client stops reusing connections.
        """
        conn = self._pooled()
        if conn is not None:
            started = _perf_counter()
            try:
                return await self._send(conn, request, on_event, timeout_s, grace_s, stall_s, alive)
            except ConnectionError:
                if conn.total:  # the server answered something, then hung up: a failed request, not a stale one
                    raise
            self.stale += 1
            self.reuse = False
            timeout_s = max(0.0, timeout_s - (_perf_counter() - started))
        return await self._send(await self._open(), request, on_event, timeout_s, grace_s, stall_s, alive)

    async def _send(self, conn: SSEProtocol, request: bytes, on_event: OnEvent, timeout_s: float, grace_s: float,
                    stall_s: float | None, alive: AsyncAlive | None) -> tuple[float, Ending]:
        done = conn.start(request, on_event, grace_s)
        try:
            ending = await wait_watched(done, timeout_s, lambda: conn.last_read, stall_s, alive)
        except BaseException:
            done.cancel()  # nobody will look at it again: no "exception never retrieved" when the socket closes
            conn.fail(ConnectionAbortedError())
            raise
        if conn.closed:
            self._all.discard(conn)
        elif self.reuse:
            self._idle.append(conn)
        else:
            conn.close()
            self._all.discard(conn)
        return conn.sent_at, ending

    def close(self) -> None:
        for conn in self._all:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()
        self._all.clear()
