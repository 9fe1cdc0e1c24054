"""The client against a scripted streaming server: chunk classification, token sources, errors, timing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from sparklab.client import ChatClient
from sparklab.records import CHUNK_COUNT, TOKEN_IDS, USAGE_ONLY, RequestRecord, Sampling
from tests.scripted_server import Scripted, Step, chunk, usage

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture(params=[True, False], ids=["lean-sse", "openai-stream"], autouse=True)
def transport(request) -> Iterator[None]:
    """Every test runs on both stream readers: sparklab.sse and the openai package's (used for https)."""
    global LEAN
    LEAN = request.param
    yield


LEAN = True


def _request(server: Scripted, sampling: Sampling | None = None, stream: bool = True) -> RequestRecord:
    async def go() -> RequestRecord:
        client = ChatClient(server.root + "/v1", "key", "m", lean=LEAN)
        try:
            return await client.request(0, "p0", MESSAGES, sampling or Sampling(max_tokens=16), stream)
        finally:
            await client.close()

    return asyncio.run(go())


@pytest.fixture
def serve() -> Iterator:
    servers: list[Scripted] = []

    def make(steps: list[Step], **kw) -> Scripted:
        server = Scripted(lambda body: steps, **kw)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


REASONING_THEN_ANSWER: list[Step] = [
    (0.05, chunk(role="assistant")),                            # role chunk: no tokens
    (0.00, chunk(reasoning="Let me", token_ids=[1, 2])),        # reasoning, 2 tokens
    (0.03, chunk(token_ids=[3])),                               # a token held back by the detokenizer
    (0.03, chunk(content="Hello there", token_ids=[4, 5, 6])),  # answer, 3 tokens in one chunk
    (0.03, chunk(content="!", token_ids=[7], finish="length")),
    (0.00, usage(7)),
    (0.00, b"data: [DONE]\n\n"),
]


def test_reasoning_answer_and_multi_token_chunks(serve) -> None:
    record = _request(serve(REASONING_THEN_ANSWER))
    assert record.ok, record.error
    assert record.chunk_tokens == [2, 1, 3, 1]
    assert record.chunk_reasoning == [True, False, False, False]
    assert record.completion_tokens == 7 and record.prompt_tokens == 7
    assert record.token_source == TOKEN_IDS and record.finish_reason == "length"
    assert record.first_chunk is not None and record.first_token is not None and record.first_content is not None
    assert record.first_chunk <= record.first_token < record.first_content
    # Gaps the server slept, as the client saw them (loopback, so within a few ms).
    assert record.first_content - record.first_token == pytest.approx(0.06, abs=0.02)
    assert record.chunk_times[-1] - record.chunk_times[-2] == pytest.approx(0.03, abs=0.02)


def test_sends_the_sampling_and_token_id_request(serve) -> None:
    server = serve(REASONING_THEN_ANSWER)
    _request(server, Sampling(max_tokens=256, temperature=0, top_p=None, ignore_eos=True, min_tokens=256,
                              enable_thinking=False, seed=7))
    body = server.bodies[0]
    assert body["max_tokens"] == 256 and body["temperature"] == 0 and "top_p" not in body
    assert body["ignore_eos"] is True and body["min_tokens"] == 256 and body["seed"] == 7
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["return_token_ids"] is True


def test_usage_missing_falls_back_to_token_ids(serve) -> None:
    steps = [s for s in REASONING_THEN_ANSWER if not (isinstance(s[1], dict) and "usage" in s[1])]
    record = _request(serve(steps))
    assert record.completion_tokens == 7 and record.token_source == TOKEN_IDS


def test_without_token_ids_usage_gives_the_total(serve) -> None:
    steps: list[Step] = [(0.0, chunk(role="assistant")), (0.0, chunk(content="a b")), (0.0, chunk(content="c")),
                         (0.0, usage(3)), (0.0, b"data: [DONE]\n\n")]
    record = _request(serve(steps))
    assert record.chunk_tokens == [None, None] and record.completion_tokens == 3
    assert record.token_source == USAGE_ONLY


def test_nothing_but_chunks_counts_chunks(serve) -> None:
    steps: list[Step] = [(0.0, chunk(content="a")), (0.0, chunk(content="b")), (0.0, b"data: [DONE]\n\n")]
    record = _request(serve(steps))
    assert record.completion_tokens == 2 and record.token_source == CHUNK_COUNT


def test_error_mid_stream_is_a_failed_request_with_partial_timings(serve) -> None:
    steps: list[Step] = [(0.0, chunk(content="a", token_ids=[1])),
                         (0.0, {"error": {"message": "engine died", "code": 500}}),
                         (0.0, b"data: [DONE]\n\n")]
    record = _request(serve(steps))
    assert not record.ok and record.error == "stream error: engine died"
    assert record.chunk_tokens == [1]


def test_http_error_is_recorded(serve) -> None:
    record = _request(serve([], status=503))
    assert record.error is not None and record.error.startswith("HTTP 503")


def test_connection_refused_is_recorded() -> None:
    async def go() -> RequestRecord:
        client = ChatClient("http://127.0.0.1:9/v1", None, "m", timeout_s=5)
        try:
            return await client.request(0, "p", MESSAGES, Sampling())
        finally:
            await client.close()

    record = asyncio.run(go())
    assert record.error is not None and "Connection" in record.error


def test_non_streaming_reproduces_bench_py(serve) -> None:
    response = {"id": "c", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "done"},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 5, "completion_tokens": 42, "total_tokens": 47}}
    server = serve([(0.05, response)])
    record = _request(server, stream=False)
    assert record.ok and record.completion_tokens == 42 and record.finish_reason == "stop"
    assert record.first_token is None and record.end - record.start >= 0.05
    assert "stream" not in server.bodies[0]
    assert server.bodies[0]["chat_template_kwargs"] == {"enable_thinking": False}
