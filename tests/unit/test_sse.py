"""The lean SSE transport, fed bytes split at every possible place."""

from __future__ import annotations

import asyncio

import pytest

from sparklab.bench.sse import HTTPStatusError, SSEProtocol

EVENTS = [b'{"a": 1}', b'{"b": 2}', b"[DONE]"]
SSE_BODY = b"".join(b"data: " + e + b"\n\n" for e in EVENTS)


def chunked(body: bytes, size: int, trailer: bytes = b"") -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size]) for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n" + trailer + b"\r\n"


class FakeTransport:
    def __init__(self) -> None:
        self.written = b""
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True


def _feed(response: bytes, pieces: int, close_after: bool = False) -> tuple[list[bytes], BaseException | None, bool]:
    async def go() -> tuple[list[bytes], BaseException | None, bool]:
        protocol = SSEProtocol()
        transport = FakeTransport()
        protocol.connection_made(transport)  # type: ignore[arg-type]
        seen: list[bytes] = []
        done = protocol.start(b"POST / HTTP/1.1\r\n\r\n", lambda now, data: seen.append(bytes(data)))
        step = max(1, len(response) // pieces)
        for i in range(0, len(response), step):
            protocol.data_received(response[i:i + step])
        if close_after:
            protocol.connection_lost(None)
        await asyncio.sleep(0)
        error = done.exception() if done.done() else None
        return seen, error, done.done()

    return asyncio.run(go())


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"


@pytest.mark.parametrize("pieces", [1, 2, 3, 7, 50, 10_000])
@pytest.mark.parametrize("size", [1, 5, 1000])
def test_chunked_stream_split_anywhere(pieces: int, size: int) -> None:
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(SSE_BODY, size)
    seen, error, done = _feed(response, pieces)
    assert seen == EVENTS and error is None and done


def test_chunked_with_trailers() -> None:
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(SSE_BODY, 9, trailer=b"X-Checksum: 1\r\n")
    seen, error, done = _feed(response, 13)
    assert seen == EVENTS and done and error is None


def test_content_length_body() -> None:
    response = HEAD + b"Content-Length: %d\r\n\r\n" % len(SSE_BODY) + SSE_BODY
    seen, error, done = _feed(response, 5)
    assert seen == EVENTS and done and error is None


def test_close_delimited_body_ends_at_eof() -> None:
    response = HEAD + b"Connection: close\r\n\r\n" + SSE_BODY
    seen, _, done = _feed(response, 4)
    assert not done  # nothing says the body is over until the connection closes
    seen, error, done = _feed(response, 4, close_after=True)
    assert seen == EVENTS and done and error is None


def test_crlf_event_separators_and_multiline_events() -> None:
    body = b'data: {"a": 1}\r\n\r\n: keep-alive comment\n\ndata: [DONE]\n\n'
    response = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body
    seen, _, _ = _feed(response, 3)
    assert seen == [b'{"a": 1}', b"[DONE]"]


def test_error_status_reports_the_body() -> None:
    body = b'{"error": {"message": "model not found"}}'
    response = b"HTTP/1.1 404 Not Found\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    seen, error, done = _feed(response, 2)
    assert seen == [] and done
    assert isinstance(error, HTTPStatusError) and error.status == 404 and "model not found" in str(error)


def test_connection_lost_mid_stream_is_an_error() -> None:
    response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(SSE_BODY, 5)[:30]
    _, error, done = _feed(response, 1, close_after=True)
    assert done and isinstance(error, ConnectionError)


# -- a server that closes each connection after a streamed response (llama-server) ---------------------------------

def test_a_server_that_closes_after_each_stream_loses_no_request() -> None:
    """llama-server (cpp-httplib) ends a streamed response with chunked framing and no `Connection: close`, then
    closes the connection without reading the next request. The client's next request on that kept-alive
    connection is sent into a closing socket: it must go again on a new connection, not fail with "connection
    closed before the response ended" (a sweep of 4 requests lost 2 this way), and the client must stop reusing
    connections to that server. Hostile reads one request per connection and drains the rest before closing."""
    from sparklab.bench.client import ChatClient
    from sparklab.records import Sampling
    from tests.scripted_server import SSE_HEAD, Hostile, chunk, http_chunk, sse

    events = [chunk(role="assistant"), chunk(content="a"), chunk(content="b", finish="stop")]
    steps = [(0.0, SSE_HEAD + b"Transfer-Encoding: chunked\r\n\r\n"),
             *((0.0, http_chunk(sse(e))) for e in events), (0.0, http_chunk(sse("[DONE]"))), (0.0, b"0\r\n\r\n")]
    server = Hostile(lambda body: steps, hold_s=0.5)  # holds each used connection 0.5 s, reading, then closes

    async def go() -> tuple[list[str | None], int, int]:
        client = ChatClient(server.root + "/v1", "key", "m")
        assert client.sse is not None
        try:
            await client.warm(1)
            records = [await client.request(i, f"p{i % 2}", [{"role": "user", "content": "hi"}],
                                            Sampling(max_tokens=16)) for i in range(4)]
            return [r.error for r in records], client.sse.stale, client.sse.opened
        finally:
            await client.close()

    try:
        errors, stale, opened = asyncio.run(go())
    finally:
        server.close()
    assert errors == [None] * 4
    assert len(server.bodies) == 4  # each request answered once: the stale send was never read as a request
    assert stale == 1  # found once; after that no connection to this server is reused
    assert opened == 4  # warmed (request 0, then request 1 found it stale), then one each for requests 1, 2, 3


def test_warm_replaces_pooled_connections_that_have_closed() -> None:
    """warm(n) leaves n open connections, whatever became of the ones the pool held (closed by the server)."""
    from sparklab.bench.sse_pool import SSEClient

    async def go() -> int:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)  # holds connections open
        port = server.sockets[0].getsockname()[1]
        client = SSEClient(f"http://127.0.0.1:{port}", {})
        try:
            await client.warm(2)
            for conn in client._idle:
                assert conn.transport is not None
                conn.transport.close()  # as if the server had closed it: connection_lost follows
            await asyncio.sleep(0.05)
            await client.warm(2)
            return sum(not conn.closed for conn in client._idle)
        finally:
            client.close()
            server.close()

    assert asyncio.run(go()) == 2


class _Counting(bytearray):
    """A buffer that adds up how many bytes its searches cover (the parser's scanning work, not its clock)."""

    scanned = 0

    def find(self, sub, start=None, end=None):  # type: ignore[no-untyped-def,override]
        lo = 0 if start is None else start
        hi = len(self) if end is None else min(end, len(self))
        _Counting.scanned += max(0, hi - lo)
        return super().find(sub, start, end)  # type: ignore[arg-type]


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_a_long_line_arriving_in_small_reads_is_scanned_once_not_once_per_read(framing: str) -> None:
    """A 2 MiB event (or a 1 MiB chunk-size line, hex digits with leading zeros) in 4 KiB reads: each byte is searched
    a bounded number of times, not again on every read (that was 512 reads x the growing line: 0.5 GiB of scanning,
    and a 16 MiB line from a hostile server cost the client 2.5 s of CPU beside the engine it measures)."""
    payload = b'{"x": "' + b"y" * (2 << 20) + b'"}'
    body = b"data: " + payload + b"\n\n" + b"data: [DONE]\n\n"
    if framing == "chunked":
        size_line = b"0" * (1 << 20) + b"%x" % len(body)
        response = HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + size_line + b"\r\n" + body + b"\r\n0\r\n\r\n"
    else:
        response = HEAD + b"Content-Length: %d\r\n\r\n" % len(body) + body

    async def go() -> tuple[list[bytes], bool]:
        protocol = SSEProtocol()
        protocol.connection_made(FakeTransport())  # type: ignore[arg-type]
        seen: list[bytes] = []
        done = protocol.start(b"POST / HTTP/1.1\r\n\r\n", lambda now, data: seen.append(bytes(data)))
        protocol.buf, protocol.body = _Counting(), _Counting()
        _Counting.scanned = 0
        for i in range(0, len(response), 4096):
            protocol.data_received(response[i:i + 4096])
        await asyncio.sleep(0)
        return seen, done.done() and done.exception() is None

    seen, ok = asyncio.run(go())
    assert ok and seen == [payload, b"[DONE]"]
    assert _Counting.scanned <= 4 * len(response), f"{_Counting.scanned / len(response):.1f} times the response"
