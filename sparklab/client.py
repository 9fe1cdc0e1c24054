"""The only module that talks OpenAI: one chat completion, timed chunk by chunk.

Streaming requests to an http endpoint go through sparklab.sse, a lean keep-alive HTTP/1.1 client: the
request bytes are built once per prompt, each socket read is stamped once with time.perf_counter, and each
SSE event is parsed with orjson inside the read callback. The openai package's own stream reader costs
about a dozen nested async iterators per event, enough to make the client the bottleneck
(scripts/bench_client_ceiling.py measures this); it still serves https endpoints and non-streaming requests.

Tokens per chunk come from the server when it can say (vLLM's `return_token_ids`: the chunk's token ids);
otherwise only the total is known, from `usage.completion_tokens`.
"""

from __future__ import annotations

import time
from typing import Any

import openai
import orjson

from sparklab.records import RequestRecord, Sampling, settle_tokens
from sparklab.sse import HTTPStatusError, SSEClient

TRANSPORT = (f"streaming over sparklab.sse (keep-alive HTTP/1.1, one perf_counter stamp per socket read, "
             f"orjson); https and non-streaming through openai {openai.__version__}")
class ChatClient:
    """Sends chat completions to one OpenAI-compatible endpoint."""

    def __init__(self, base_url: str, api_key: str | None, model: str, timeout_s: float = 1800,
                 lean: bool = True) -> None:
        self.model = model
        self.timeout_s = timeout_s
        # The openai package's own HTTP client (httpx or httpx2 by version) and its pool of 1,000 connections.
        self.client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "EMPTY", timeout=timeout_s,
                                         max_retries=0)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.sse = SSEClient(base_url, headers) if lean and base_url.startswith("http://") else None
        self._requests: dict[tuple[str, Sampling], bytes] = {}  # request bytes per (prompt id, sampling)

    async def warm(self, connections: int) -> None:
        """Open the connections a measured window will use (no TCP handshake inside it)."""
        if self.sse is not None:
            await self.sse.warm(connections)

    async def close(self) -> None:
        if self.sse is not None:
            self.sse.close()
        await self.client.close()

    async def request(self, index: int, prompt_id: str, messages: list[dict[str, str]], sampling: Sampling,
                      stream: bool = True, warmup: bool = False) -> RequestRecord:
        record = RequestRecord(index=index, prompt_id=prompt_id, warmup=warmup, start=time.perf_counter(),
                               streamed=stream)
        try:
            if stream and self.sse is not None:
                await self._stream_lean(record, prompt_id, messages, sampling)
            elif stream:
                await self._stream(record, sampling.body(self.model, messages, True))
            else:
                await self._whole(record, sampling.body(self.model, messages, False))
        except openai.APIStatusError as exc:
            record.error = f"HTTP {exc.status_code}: {_short(exc.message)}"
        except HTTPStatusError as exc:
            record.error = _short(str(exc))
        except TimeoutError:
            record.error = f"timeout: no complete response within {self.timeout_s:g} s"
        except Exception as exc:  # a transport error mid-stream is a failed request, not a crash
            record.error = f"{type(exc).__name__}: {_short(str(exc))}"
        record.end = record.end or time.perf_counter()
        settle_tokens(record)
        return record

    async def _whole(self, record: RequestRecord, body: dict[str, Any]) -> None:
        response = await self.client.chat.completions.create(**_split_extra(body))
        record.end = time.perf_counter()
        if response.usage is not None:
            record.completion_tokens = response.usage.completion_tokens
            record.prompt_tokens = response.usage.prompt_tokens
        choice = response.choices[0] if response.choices else None
        if choice is not None:
            record.finish_reason = choice.finish_reason
            record.output_chars = len(choice.message.content or "")

    async def _stream_lean(self, record: RequestRecord, prompt_id: str, messages: list[dict[str, str]],
                           sampling: Sampling) -> None:
        assert self.sse is not None
        key = (prompt_id, sampling)
        request = self._requests.get(key)
        if request is None:
            body = orjson.dumps(sampling.body(self.model, messages, True))
            request = self._requests[key] = self.sse.request_bytes("/chat/completions", body)

        def on_event(now: float, data: bytes | memoryview) -> None:
            if data[:1] == b"{":  # skips the final [DONE]
                _on_event(record, orjson.loads(data), now)

        record.start = await self.sse.stream(request, on_event, self.timeout_s)  # when the bytes were sent
        record.end = time.perf_counter()

    async def _stream(self, record: RequestRecord, body: dict[str, Any]) -> None:
        async with self.client.chat.completions.with_streaming_response.create(**_split_extra(body)) as response:
            async for line in response.iter_lines():
                now = time.perf_counter()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                _on_event(record, orjson.loads(data), now)
        record.end = time.perf_counter()


_OPENAI_PARAMS = frozenset({"model", "messages", "max_tokens", "temperature", "top_p", "seed", "stream",
                            "stream_options"})


def _split_extra(body: dict[str, Any]) -> dict[str, Any]:
    params = {k: v for k, v in body.items() if k in _OPENAI_PARAMS}
    extra = {k: v for k, v in body.items() if k not in _OPENAI_PARAMS}
    return {**params, "extra_body": extra} if extra else params


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _on_event(record: RequestRecord, event: dict[str, Any], now: float) -> None:
    """Classify one SSE event: usage, error, or a chunk that may carry reasoning or answer tokens."""
    if "error" in event and not event.get("choices"):
        error = event["error"]
        record.error = "stream error: " + _short(error.get("message", str(error)) if isinstance(error, dict)
                                                 else str(error))
        return
    usage = event.get("usage")
    if usage:
        record.completion_tokens = usage.get("completion_tokens")
        record.prompt_tokens = usage.get("prompt_tokens")
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
        carries = tokens > 0 if tokens is not None else bool(content or reasoning)
        if not carries:
            continue
        record.chunk_times.append(now)
        record.chunk_tokens.append(tokens)
        record.chunk_reasoning.append(bool(reasoning) and not content)
        record.output_chars += len(content) + len(reasoning)
        if record.first_token is None:
            record.first_token = now
        if content and record.first_content is None:
            record.first_content = now
