"""The only module that talks OpenAI: one chat completion, timed chunk by chunk.

Streaming requests to an http endpoint go through sparklab.sse, a lean keep-alive HTTP/1.1 client: the
request bytes are built once per prompt, each socket read is stamped once with time.perf_counter, and each
SSE event is parsed with orjson inside the read callback. The openai package's own stream reader costs
about a dozen nested async iterators per event, enough to make the client the bottleneck
(scripts/bench_client_ceiling.py measures this); it still serves https endpoints and non-streaming requests.

Tokens per chunk come from the server when it can say (vLLM's `return_token_ids`: the chunk's token ids);
otherwise only the total is known, from `usage.completion_tokens`.

What the client believes (issue 11, section 3):
- A streamed answer is whole when the server said so: a `finish_reason`, or `[DONE]`. A stream that stops
  without either fails, whether the connection closed or the body's framing ended. With a `finish_reason` but
  without `[DONE]` the answer is complete and the request is ok (the usage chunk may be lost: tokens are then
  counted from the stream, and the token source says so).
- After the answer is complete the response must end within `finish_grace_s` (for the usage chunk and
  `[DONE]`); a server that holds the connection longer ends the request there, ok, and loses the connection.
  The request's clock then ends at the last event it received, not at the end of the wait.
- HTTP 200 without SSE (a whole JSON body) is "the server did not stream".
- Usage fields must be token counts (non-negative integers) or the request fails; a count that contradicts the
  stream is ignored (records.settle_tokens). Chunk lists are bounded by max_tokens, lines and responses by
  sse.Limits: a server cannot make the client allocate in proportion to anything it merely claims.
- With `stall_timeout_s` and an `alive` health check, a request that has received no byte for that long while
  the health check fails ends as "stalled"; otherwise only the request timeout (`timeout_s`) ends it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import openai
import orjson

from sparklab.bench.sse import (
    Alive,
    Ending,
    HTTPStatusError,
    Limits,
    OnEvent,
    ResponseError,
    ask_alive,
    body_parser,
    wait_watched,
)
from sparklab.bench.sse_pool import SSEClient
from sparklab.records import RequestRecord, Sampling, settle_tokens

TRANSPORT = (f"streaming over sparklab.sse (keep-alive HTTP/1.1, one perf_counter stamp per socket read, "
             f"orjson); https and non-streaming through openai {openai.__version__}")

CHUNK_SLACK = 2  # token-carrying chunks allowed per max_token (each carries at least one token), plus CHUNK_EXTRA
CHUNK_EXTRA = 64
HEALTH_CACHE_S = 1.0  # one health check answers every stalled request for this long


class BadStream(Exception):
    """The stream's content cannot be believed; the message is the request's error, as it is."""


class _SharedHealth:
    """One health check at a time for all of a client's requests (256 stalled requests ask once), cached briefly."""

    def __init__(self, alive: Alive) -> None:
        self.alive = alive
        self._pending: asyncio.Future[bool] | None = None
        self._answer: tuple[float, bool] | None = None

    async def __call__(self) -> bool:
        if self._answer is not None and time.perf_counter() - self._answer[0] < HEALTH_CACHE_S:
            return self._answer[1]
        if self._pending is None:
            self._pending = asyncio.ensure_future(ask_alive(self.alive))
        pending = self._pending
        try:
            answer = await asyncio.shield(pending)
        finally:
            if self._pending is pending and pending.done():
                self._pending = None
        self._answer = (time.perf_counter(), answer)
        return answer


class _Stream:
    """What one streamed request has seen besides its record: [DONE], and when its last event arrived."""

    __slots__ = ("done", "last_event")

    def __init__(self) -> None:
        self.done = False
        self.last_event: float | None = None


class ChatClient:
    """Sends chat completions to one OpenAI-compatible endpoint."""

    def __init__(self, base_url: str, api_key: str | None, model: str, timeout_s: float = 1800,
                 lean: bool = True, *, finish_grace_s: float = 2.0, stall_timeout_s: float | None = 60.0,
                 alive: Alive | None = None, limits: Limits | None = None, reuse_connections: bool = True) -> None:
        self.model = model
        self.timeout_s = timeout_s
        self.finish_grace_s = finish_grace_s
        self.stall_timeout_s = stall_timeout_s
        self.alive = _SharedHealth(alive) if alive is not None else None
        self.limits = limits or Limits()
        # The openai package's own HTTP client (httpx or httpx2 by version) and its pool of 1,000 connections.
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                         max_retries=0)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sse = (SSEClient(base_url, headers, self.limits, reuse=reuse_connections)
                    if lean and base_url.startswith("http://") else None)
        self._requests: dict[tuple[str, Sampling], bytes] = {}  # request bytes per (prompt id, sampling)

    async def warm(self, connections: int) -> None:
        """Open the connections a measured window will use (no TCP handshake inside it)."""
        if self.sse is not None:
            await self.sse.warm(connections)

    def connections(self) -> dict[str, Any] | None:
        """How the lean transport used its connections so far (None without it): how many it opened, how many
        reused ones the server had closed under a request (each such request went again on a new connection),
        and whether it still reuses connections."""
        if self.sse is None:
            return None
        policy = ("one connection per request (the engine closes it after each streamed response)"
                  if self.sse.per_request else "keep-alive")
        return {"opened": self.sse.opened, "stale_resent": self.sse.stale, "reused": self.sse.reuse,
                "policy": policy, "source": "sparklab.sse counters over the cell, warmup included"}

    async def close(self) -> None:
        if self.sse is not None:
            self.sse.close()
        await self.client.close()

    async def request(self, index: int, prompt_id: str, messages: list[dict[str, str]], sampling: Sampling,
                      stream: bool = True, warmup: bool = False, extra: dict[str, Any] | None = None) -> RequestRecord:
        record = RequestRecord(index=index, prompt_id=prompt_id, warmup=warmup, start=time.perf_counter(),
                               streamed=stream)
        seen = _Stream()
        on_event = self._on_event(record, seen, CHUNK_SLACK * sampling.max_tokens + CHUNK_EXTRA)
        ending: Ending = "ended"
        try:
            if stream and self.sse is not None:
                ending = await self._stream_lean(record, prompt_id, messages, sampling, on_event, extra)
            elif stream:
                ending = await self._stream(record, {**sampling.body(self.model, messages, True), **(extra or {})},
                                            on_event)
            else:
                await self._whole(record, {**sampling.body(self.model, messages, False), **(extra or {})})
            if stream and record.error is None:
                record.error = _incomplete(record, seen, ending)
            if ending == "grace" and seen.last_event is not None:
                # The answer was complete and the server held the connection: the wait for the response's end
                # is not the answer's time (issue 27: a TPOT of 297 ms where the chunks came ~1 ms apart).
                record.end = seen.last_event
        except openai.APIStatusError as exc:
            record.error = f"HTTP {exc.status_code}: {_short(exc.message)}"
        except (HTTPStatusError, ResponseError, BadStream) as exc:
            record.error = _short(str(exc))
        except TimeoutError:
            record.error = f"timeout: no complete response within {self.timeout_s:g} s"
        except Exception as exc:  # a transport error mid-stream is a failed request, not a crash
            record.error = f"{type(exc).__name__}: {_short(str(exc))}"
        record.end = record.end or time.perf_counter()
        settle_tokens(record, sampling.max_tokens)
        return record

    @staticmethod
    def _on_event(record: RequestRecord, seen: _Stream, max_chunks: int) -> OnEvent:
        """The per-event callback both stream readers use; True once the answer is complete."""

        def on_event(now: float, data: bytes | memoryview) -> bool:
            seen.last_event = now
            if data[:1] == b"{":
                try:
                    return _on_event(record, orjson.loads(data), now, max_chunks)
                except orjson.JSONDecodeError as exc:
                    raise BadStream(f"malformed SSE event: not JSON ({exc}): {bytes(data[:80])!r}") from None
                except (TypeError, AttributeError, KeyError) as exc:
                    raise BadStream(f"malformed SSE event: {type(exc).__name__}: {exc}") from None
            if data == b"[DONE]":
                seen.done = True
                return True
            if len(data):
                raise BadStream(f"malformed SSE event: not JSON: {bytes(data[:80])!r}")
            return False

        return on_event

    async def _whole(self, record: RequestRecord, body: dict[str, Any]) -> None:
        response = await self.client.chat.completions.create(**_split_extra(body))
        record.end = time.perf_counter()
        if response.usage is not None:
            record.completion_tokens = _count(response.usage.completion_tokens, "completion_tokens")
            record.prompt_tokens = _count(response.usage.prompt_tokens, "prompt_tokens")
        choice = response.choices[0] if response.choices else None
        if choice is not None:
            record.finish_reason = choice.finish_reason
            record.output_chars = len(choice.message.content or "")
            for call in choice.message.tool_calls or ():
                function = getattr(call, "function", None)
                _add_tool_call(record, {"index": len(record.tool_calls), "function": {
                    "name": getattr(function, "name", None), "arguments": getattr(function, "arguments", None)}})
            reasoning = getattr(choice.message, "reasoning_content", None) or getattr(choice.message, "reasoning", None)
            if isinstance(reasoning, str) and reasoning:  # kept apart: a non-streamed answer's text is its content
                record.reasoning_parts.append(reasoning)
            record.output_parts.append(choice.message.content or "")
            record.content_parts.append(choice.message.content or "")
            record.output_ids = _whole_ids(getattr(choice, "token_ids", None), record.completion_tokens)

    async def _stream_lean(self, record: RequestRecord, prompt_id: str, messages: list[dict[str, str]],
                           sampling: Sampling, on_event: OnEvent, extra: dict[str, Any] | None = None) -> Ending:
        assert self.sse is not None
        key = (prompt_id, sampling)
        request = self._requests.get(key)
        if request is None:
            body = orjson.dumps({**sampling.body(self.model, messages, True), **(extra or {})})
            request = self._requests[key] = self.sse.request_bytes("/chat/completions", body)
        # record.start: when the bytes were sent
        record.start, ending = await self.sse.stream(request, on_event, self.timeout_s, self.finish_grace_s,
                                                     self.stall_timeout_s, self.alive)
        record.end = time.perf_counter()
        return ending

    async def _stream(self, record: RequestRecord, body: dict[str, Any], on_event: OnEvent) -> Ending:
        """The openai package reads the HTTP response (https); its bytes go through sparklab.sse's parser."""
        async with self.client.chat.completions.with_streaming_response.create(**_split_extra(body)) as response:
            http = response.http_response
            parser = body_parser(on_event, self.finish_grace_s, self.limits, http.headers.get("content-type", ""))

            async def feed() -> None:
                try:
                    async for data in http.aiter_bytes():
                        parser.data_received(data)
                    parser.end_of_body("ended")
                except Exception as exc:
                    parser.fail(exc)

            feeder = asyncio.ensure_future(feed())
            try:
                assert parser.done is not None
                ending = await wait_watched(parser.done, self.timeout_s, lambda: parser.last_read,
                                            self.stall_timeout_s, self.alive)
            finally:
                if parser.done is not None and not parser.done.done():
                    parser.done.cancel()
                feeder.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await feeder
        record.end = time.perf_counter()
        return ending


_OPENAI_PARAMS = frozenset({"model", "messages", "max_tokens", "temperature", "top_p", "seed", "stream",
                            "stream_options", "tools", "tool_choice"})
MAX_TOOL_CALLS = 1000  # kept per answer; a runaway is clear long before this


def _add_tool_call(record: RequestRecord, delta: Any) -> None:
    """One streamed tool-call delta: a new call (a new index), or more of its name or arguments."""
    if not isinstance(delta, dict):
        raise BadStream(f"malformed tool call delta: {_short(repr(delta), 80)}")
    index = delta.get("index", len(record.tool_calls))
    function = delta.get("function") or {}
    calls = record.tool_calls
    if not calls or calls[-1]["index"] != index:
        if len(calls) >= MAX_TOOL_CALLS:
            record.tool_calls_dropped += 1
            return
        calls.append({"index": index, "name": "", "arguments": ""})
    call = calls[-1]
    call["name"] += str(function.get("name") or "")
    call["arguments"] += str(function.get("arguments") or "")


def _split_extra(body: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in body.items() if k in _OPENAI_PARAMS}
    extra = {k: v for k, v in body.items() if k not in _OPENAI_PARAMS}
    return {**params, "extra_body": extra} if extra else params


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _incomplete(record: RequestRecord, seen: _Stream, ending: Ending) -> str | None:
    """Why a stream that ended without a transport error is not a whole answer, or None if it is."""
    if seen.done or record.finish_reason is not None:
        return None
    if record.first_chunk is None and record.completion_tokens is None and record.prompt_tokens is None:
        return "the server did not stream: HTTP 200 without a single SSE event"
    how = "the connection closed" if ending == "closed" else "the response ended"
    return f"incomplete stream: {how} without finish_reason or [DONE]"


def _whole_ids(ids: Any, completion_tokens: int | None) -> list[int] | None:
    """A whole answer's token ids (vLLM 0.27.1: the choice's `token_ids` when asked, chat_completion/serving.py
    :1027-1031), kept only when they are what they claim: integers, as many as usage counted. Anything else is no
    ids (the answer is then compared by text and not scored), never an error of the request."""
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return None
    return ids if ids and completion_tokens == len(ids) else None


def _count(value: Any, name: str) -> int | None:
    """A usage field as a token count: a non-negative integer (1e9 in JSON is a float, and still a count)."""
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise BadStream(f"malformed usage: usage.{name} is {_short(repr(value), 60)}, not a token count")


def _on_event(record: RequestRecord, event: dict[str, Any], now: float, max_chunks: int) -> bool:
    """Classify one SSE event: usage, error, or a chunk that may carry reasoning or answer tokens.

    Returns whether the answer is complete (a finish_reason seen)."""
    if "error" in event and not event.get("choices"):
        error = event["error"]
        record.error = "stream error: " + _short(error.get("message", str(error)) if isinstance(error, dict)
                                                 else str(error))
        return True
    usage = event.get("usage")
    if usage:
        record.completion_tokens = _count(usage.get("completion_tokens"), "completion_tokens")
        record.prompt_tokens = _count(usage.get("prompt_tokens"), "prompt_tokens")
    for choice in event.get("choices") or ():
        if record.first_chunk is None:
            record.first_chunk = now
        delta = choice.get("delta") or {}
        content = delta.get("content") or ""
        reasoning = delta.get("reasoning_content") or delta.get("reasoning") or ""
        token_ids = choice.get("token_ids")
        tokens = len(token_ids) if isinstance(token_ids, list) else None
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
        tool_calls = delta.get("tool_calls") or ()
        for call in tool_calls:
            _add_tool_call(record, call)
        carries = tokens > 0 if tokens is not None else bool(content or reasoning or tool_calls)
        if not carries:
            continue
        if len(record.chunk_times) >= max_chunks:
            raise BadStream(f"more than {max_chunks} token-carrying chunks (max_tokens allows at most "
                            f"{(max_chunks - CHUNK_EXTRA) // CHUNK_SLACK})")
        record.chunk_times.append(now)
        record.chunk_tokens.append(tokens)
        record.chunk_reasoning.append(bool(reasoning) and not content)
        record.output_chars += len(content) + len(reasoning)
        record.output_parts.append(reasoning + content)
        if reasoning:
            record.reasoning_parts.append(reasoning)
        if content:
            record.content_parts.append(content)
        if record.output_ids is not None:
            if tokens is None:
                record.output_ids = None
            else:
                record.output_ids.extend(token_ids)
        if record.first_token is None:
            record.first_token = now
        if content and record.first_content is None:
            record.first_content = now
    return record.finish_reason is not None
