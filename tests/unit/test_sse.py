"""The lean SSE transport, fed bytes split at every possible place."""

from __future__ import annotations

import asyncio

import pytest

from sparklab.sse import HTTPStatusError, _SSEProtocol

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
        protocol = _SSEProtocol()
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
