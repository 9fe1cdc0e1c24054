"""A lean HTTP/1.1 client for server-sent events, so the benchmark client is never the bottleneck.

The openai package reads a stream through a dozen nested async iterators per event; a benchmark at high
concurrency then measures its own client. Here an asyncio Protocol gets whole socket reads, stamps each read
once with time.perf_counter, de-chunks the body, splits it into SSE events and hands each `data:` payload to
a callback synchronously. Connections are kept alive and reused. Plain http only (local servers); callers
fall back to the openai package for https, whose bytes go through the same SSE parser (`body_parser`).

A kept-alive connection may be closed by the server just as the next request goes out on it, and some servers
close every connection after a streamed response without saying `Connection: close`: llama-server (its
cpp-httplib content provider returns false after the last chunk, which ends the keep-alive loop). A request
whose reused connection closes before a single byte of response arrives is taken as never read (a server
that read it and then died without a byte looks the same; the resend then meets the dead server), so it is
sent again, once, on a new connection; from then on that client opens a connection per request (`stale`
counts such connections, `opened` the connections opened). A connection the client opened for the request
is never resent on: its failure is the request's. For a server known to close after every stream (an engine
adapter's `keeps_streamed_connections = False`: llama-server b11669, measured) the client is made with
`reuse=False` and opens a connection per request from the start, so no request goes into a closing socket.

Nothing the server sends is believed without a bound: a header block, an SSE line and a whole response have
size limits (`Limits`), a malformed response fails its request inside the protocol (never an asyncio "Fatal
error" on stderr), and once the caller's callback says the answer is complete (finish_reason or [DONE]) the
response must end within a grace period, or the request ends there and its connection is dropped.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from time import perf_counter as _perf_counter
from typing import Literal, TypeVar, cast

from sparklab.bench.ownthread import in_own_thread
from sparklab.records import Alive

# (arrival time of the read that completed the event, the event's data payload) -> whether the answer is now
# complete (finish_reason or [DONE] seen: the response must end within the grace period). The payload may be a
# memoryview into the receive buffer: use it (orjson parses it directly) before returning, never keep it.
OnEvent = Callable[[float, "bytes | memoryview"], "bool | None"]
# Is the server still alive? (sparklab.records.Alive) An exception or a hang counts as "no" (ask_alive).
AsyncAlive = Callable[[], Awaitable[bool]]
# How a response ended: its framing said so ("ended": chunked end or Content-Length reached), the connection
# closed a body without framing ("closed"), or the grace period after a complete answer ran out ("grace").
Ending = Literal["ended", "closed", "grace"]

_SIZE, _DATA, _CRLF, _TRAILER = range(4)  # chunked decoder states
_MiB = 1 << 20
HEALTH_CHECK_TIMEOUT_S = 10.0
T = TypeVar("T")


@dataclass(frozen=True)
class Limits:
    """What one response may cost the client. A server that exceeds a limit fails the request."""

    line_bytes: int = 16 * _MiB  # an SSE event (or chunk-size line) not yet ended
    response_bytes: int = 256 * _MiB  # the whole response as received, headers included
    header_bytes: int = 64 * 1024


class HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}: {body[:300].decode('utf-8', 'replace')}")
        self.status = status


class ResponseError(Exception):
    """The response broke HTTP, SSE or a limit; the message is the request's error, as it is."""


class NotStreamingError(ResponseError):
    def __init__(self, content_type: str, body: bytes) -> None:
        excerpt = " ".join(body[:200].decode("utf-8", "replace").split())
        super().__init__(f"the server did not stream: HTTP 200 with Content-Type {content_type or '(none)'} and no "
                         f"SSE events: {excerpt}")


class StalledError(ResponseError):
    def __init__(self, stall_s: float) -> None:
        super().__init__(f"stalled: no bytes for {stall_s:g} s and the server's health check fails")


def _size(limit: int) -> str:
    return f"{limit / _MiB:g} MiB" if limit >= _MiB else f"{limit} bytes"


class SSEProtocol(asyncio.Protocol):
    """One connection; one request at a time. Parses status, headers, chunked/length/close bodies, SSE."""

    def __init__(self, limits: Limits | None = None) -> None:
        self.transport: asyncio.Transport | None = None
        self.limits = limits or Limits()
        self.closed = False
        self.sent_at = 0.0
        self.last_read = 0.0
        self.grace_s = 2.0
        self._grace: asyncio.TimerHandle | None = None
        self._reset(None, None)

    def _reset(self, on_event: OnEvent | None, done: asyncio.Future[Ending] | None) -> None:
        self.on_event = on_event
        self.done = done
        self.content_type = ""
        self.complete = False  # the callback said the answer is complete: the response must end within grace_s
        self.sse = True  # a 200 response with an SSE (or no) Content-Type: split its body into events
        self.buf = bytearray()  # raw bytes not yet parsed
        self.body = bytearray()  # de-chunked body bytes not yet split into events
        self.headers_done = False
        self.status = 0
        self.chunked = False
        self.length: int | None = None
        self.keep_alive = True
        self.state = _SIZE  # where the chunked decoder is
        self.chunk_left = 0  # bytes of the current chunk still to read
        # How far the unfinished line at the front of buf (a chunk size, the trailer) and the unfinished event at the
        # front of body were already searched for their end: the next read's search resumes there, so a long line in
        # many small reads is scanned once, not once per read (quadratic: a 16 MiB line cost 2.5 s of CPU).
        self.line_scanned = 0
        self.event_scanned = 0
        self.received = 0  # body bytes (for Content-Length)
        self.total = 0  # every byte of the response (for Limits.response_bytes)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # asyncio types the argument as the base class; loop.create_connection hands a stream protocol a Transport
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is None or self.done.done():
            return
        if exc is None and self.headers_done and not self.chunked and self.length is None:
            self.end_of_body("closed")  # close-delimited body: EOF ends it
        else:
            self.fail(exc or ConnectionError("connection closed before the response ended"))

    def _begin(self, on_event: OnEvent, grace_s: float) -> asyncio.Future[Ending]:
        self._cancel_grace()
        self._reset(on_event, asyncio.get_running_loop().create_future())
        self.grace_s = grace_s
        assert self.done is not None
        return self.done

    def start(self, request: bytes, on_event: OnEvent, grace_s: float = 2.0) -> asyncio.Future[Ending]:
        done = self._begin(on_event, grace_s)
        assert self.transport is not None
        self.sent_at = self.last_read = _perf_counter()
        self.transport.write(request)
        return done

    def data_received(self, data: bytes) -> None:
        now = self.last_read = _perf_counter()
        done = self.done
        if done is None or done.done():  # bytes nobody asked for (or after the grace period): drop the connection
            self.close()
            return
        try:
            self.total += len(data)
            if self.total > self.limits.response_bytes:
                raise ResponseError(f"response larger than {_size(self.limits.response_bytes)}")
            self.buf += data
            if not self.headers_done and not self._parse_headers():
                return
            if self.chunked:
                self._dechunk()
                if len(self.buf) > self.limits.line_bytes:
                    raise ResponseError(f"a chunk-size line longer than {_size(self.limits.line_bytes)}")
            else:
                self.body += self.buf
                self.received += len(self.buf)
                self.buf.clear()
                if self.length is not None and self.received >= self.length:
                    self.end_of_body("ended", now)
                    return
            self._flush_events(now, final=False)
            if len(self.body) > self.limits.line_bytes:
                raise ResponseError(f"an SSE line longer than {_size(self.limits.line_bytes)}")
            if self.complete and self._grace is None and not done.done():
                self._arm_grace()  # only when a read leaves a complete answer's response unfinished: rarely a timer
        except Exception as exc:  # a malformed response fails its request here, quietly; never asyncio's "Fatal error"
            self.fail(exc)

    def end_of_body(self, ending: Ending, now: float | None = None) -> None:
        """The body is over (framing, EOF, or the end of a stream another HTTP client read): last events, then done."""
        try:
            self._flush_events(now or _perf_counter(), final=True)
            self._finish(ending)
        except Exception as exc:
            self.fail(exc)

    def _parse_headers(self) -> bool:
        end = self.buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buf) > self.limits.header_bytes:
                raise ResponseError(f"response headers longer than {_size(self.limits.header_bytes)}")
            return False
        head = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
        del self.buf[: end + 4]
        try:
            self.status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise ResponseError(f"not an HTTP response: {head[0][:100]!r}") from None
        for line in head[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip().lower(), value.strip().lower()
            if name == "transfer-encoding" and "chunked" in value:
                self.chunked = True
            elif name == "content-length":
                self.length = int(value)
            elif name == "connection" and value == "close":
                self.keep_alive = False
            elif name == "content-type":
                self.content_type = value
        self.sse = self.status == 200 and (not self.content_type or "text/event-stream" in self.content_type)
        self.headers_done = True
        return True

    def _dechunk(self) -> None:
        buf, pos, n, finished = self.buf, 0, len(self.buf), False
        while pos < n:
            if self.state == _SIZE:
                eol = buf.find(b"\r\n", pos + self.line_scanned)
                if eol < 0:
                    self.line_scanned = max(0, n - pos - 1)  # its last byte may be the \r of a \r\n split by the read
                    break
                self.line_scanned = 0
                try:
                    size = int(buf[pos:eol], 16)
                except ValueError:  # a chunk extension: "1a;name=value"
                    size = int(bytes(buf[pos:eol]).split(b";", 1)[0], 16)
                if size < 0:
                    raise ResponseError(f"a negative HTTP chunk size: {bytes(buf[pos:eol])[:40]!r}")
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
                eol = buf.find(b"\r\n\r\n", pos + self.line_scanned)
                if eol < 0:
                    self.line_scanned = max(0, n - pos - 3)
                    break
                pos, finished = eol + 4, True
                break
        del buf[:pos]
        if finished:
            self.end_of_body("ended")

    def _flush_events(self, now: float, final: bool) -> None:
        body = self.body
        if not self.sse or self.on_event is None:
            return  # an error (or non-SSE) body is read whole, then reported
        on_event = self.on_event
        start = 0
        with memoryview(body) as view:  # zero-copy slices; released before the buffer is trimmed
            while True:
                end = body.find(b"\n\n", max(start, self.event_scanned))
                if end < 0:
                    break
                if body.startswith(b"data: ", start) and body.find(b"\n", start, end) < 0:
                    if on_event(now, view[start + 6 : end]):  # the common case: one `data: ` line
                        self.complete = True
                else:
                    self._event(now, bytes(view[start:end]))
                start = end + 2
            if final and start < len(body) and bytes(view[start:]).strip():
                self._event(now, bytes(view[start:]))
                start = len(body)
        del body[:start]
        self.event_scanned = max(0, len(body) - 1)  # no event ends before; its last byte may be the first \n of \n\n

    def _event(self, now: float, raw: bytes) -> None:
        """The general case: several lines, comments, `data:` without a space, CRLF line ends."""
        for line in raw.split(b"\n"):
            line = line.rstrip(b"\r")
            if line.startswith(b"data:") and self.on_event is not None and self.on_event(now, line[5:].strip()):
                self.complete = True

    def _arm_grace(self) -> None:
        """The answer is complete: only a usage chunk, [DONE] and the end of the body may follow, and soon."""
        self._grace = asyncio.get_running_loop().call_later(self.grace_s, self._grace_over)

    def _grace_over(self) -> None:
        self._grace = None
        done = self.done
        if done is not None and not done.done():
            done.set_result("grace")
            self.close()  # the response never ended: this connection cannot carry another request

    def _cancel_grace(self) -> None:
        if self._grace is not None:
            self._grace.cancel()
            self._grace = None

    def _finish(self, ending: Ending) -> None:
        done = self.done
        if done is None or done.done():
            return
        self._cancel_grace()
        if self.status != 200:
            done.set_exception(HTTPStatusError(self.status, bytes(self.body)))
        elif not self.sse:
            done.set_exception(NotStreamingError(self.content_type, bytes(self.body)))
        else:
            done.set_result(ending)
        if not self.keep_alive:
            self.close()

    def fail(self, exc: BaseException) -> None:
        self._cancel_grace()
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc)
        self.close()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def body_parser(on_event: OnEvent, grace_s: float, limits: Limits | None = None,
                content_type: str = "") -> SSEProtocol:
    """The SSE half of the protocol, for a 200 body another HTTP client reads (the openai package's, over https):
    feed it with data_received, end it with end_of_body("ended"), await its `done`."""
    parser = SSEProtocol(limits)
    parser._begin(on_event, grace_s)
    parser.last_read = _perf_counter()
    parser.headers_done, parser.status, parser.content_type = True, 200, content_type.lower()
    parser.sse = not content_type or "text/event-stream" in parser.content_type
    return parser


async def ask_alive(alive: Alive) -> bool:
    """Ask a health check; a sync one runs in a thread. Raising, hanging or a falsy answer all mean "no"."""
    try:
        if inspect.iscoroutinefunction(alive):
            answer = await asyncio.wait_for(alive(), HEALTH_CHECK_TIMEOUT_S)
        else:
            answer = await asyncio.wait_for(in_own_thread(alive, "health-check"), HEALTH_CHECK_TIMEOUT_S)
            if inspect.isawaitable(answer):
                answer = await asyncio.wait_for(answer, HEALTH_CHECK_TIMEOUT_S)
        return bool(answer)
    except Exception:
        return False


async def wait_watched(done: asyncio.Future[T], timeout_s: float, last_read: Callable[[], float],
                       stall_s: float | None = None, alive: AsyncAlive | None = None) -> T:
    """Wait for `done` at most timeout_s. With a stall timeout and a health check (async, never raising: see
    ask_alive): when no byte has arrived for
    stall_s and the health check fails, raise StalledError. No bytes alone prove nothing (a queued request may wait
    minutes for its first token), so with a healthy server, or without a health check, only the timeout ends it."""
    if stall_s is None or alive is None:
        return await asyncio.wait_for(done, timeout_s)
    deadline = _perf_counter() + timeout_s
    while True:
        now = _perf_counter()
        if now >= deadline:
            raise TimeoutError
        quiet = now - last_read()
        await asyncio.wait((done,), timeout=min(deadline - now, stall_s - quiet if quiet < stall_s else stall_s))
        if done.done():
            return done.result()
        if _perf_counter() - last_read() >= stall_s and not await alive():
            if done.done():
                return done.result()
            raise StalledError(stall_s)
