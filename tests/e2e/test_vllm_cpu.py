"""The real vLLM 0.27.1 (CPU build) through `sparklab up`: ready, chat, metrics, speculative counters, down."""

from __future__ import annotations

import time

import openai
import pytest
import requests

from sparklab.engines.scrape import parse_metrics
from tests.dockerkit import Cli, field, free_port, sparklab_containers

pytestmark = pytest.mark.engine

COUNTING = "Continue the sequence exactly, separated by commas: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,"
GREEDY_TEXTS: dict[str, str] = {}  # greedy output per method: speculative decoding must not change it
QUESTION = "What is the capital of France? Answer in one sentence."


def _up(cli: Cli, method: str, port: int, *extra: str) -> tuple[str, str, str]:
    done = cli.run("up", method, "-t", "cpu", "--detach", "--pull", "always", "--image", cli.image,
                   "--port", str(port), *extra, timeout=900)
    assert done.returncode == 0, done.stderr + done.stdout
    return done.stdout, field(done.stdout, "container"), field(done.stdout, "api key")


def _metrics(port: int) -> dict[str, float]:
    return parse_metrics(requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


def _stream(client: openai.OpenAI, prompt: str, max_tokens: int) -> tuple[str, int, int, float]:
    """(text, chunks with content, completion tokens from usage, seconds from first content to end)."""
    stream = client.chat.completions.create(
        model="smollm2-135m", messages=[{"role": "user", "content": prompt}], max_tokens=max_tokens,
        temperature=0, stream=True, stream_options={"include_usage": True})
    text, chunks, usage, first, last = "", 0, 0, 0.0, 0.0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and chunk.choices[0].delta.content:
            now = time.monotonic()
            first = first or now
            last = now
            chunks += 1
            text += chunk.choices[0].delta.content
    return text, chunks, usage, last - first


def test_plain_engine_up_chat_metrics_down(engine_cli: Cli, docker_client, measured) -> None:
    port = free_port()
    out, name, key = _up(engine_cli, "none", port)
    try:
        ready_s = float(out.split("ready in ", 1)[1].split(" s", 1)[0])
        assert "KV cache" in out and "max concurrency" in out and "at 2,048 tokens per request" in out
        assert "model load" in out
        logs = engine_cli.run("logs", name).stdout
        assert "Application startup complete." in logs and "GPU KV cache size:" in logs

        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        assert [m.id for m in client.models.list().data] == ["smollm2-135m"]
        before = _metrics(port)
        reply = client.chat.completions.create(model="smollm2-135m", max_tokens=24, temperature=0,
                                               messages=[{"role": "user", "content": QUESTION}])
        assert "Paris" in (reply.choices[0].message.content or "")
        text, chunks, tokens, seconds = _stream(client, COUNTING, 64)
        assert tokens > 0 and text
        GREEDY_TEXTS["none"] = text
        after = _metrics(port)
        generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
        assert reply.usage is not None
        assert generated == reply.usage.completion_tokens + tokens
        assert "vllm:spec_decode_num_drafts_total" not in after
        measured["plain: ready (s)"] = ready_s
        measured["plain: decode tok/s (streamed, first to last content chunk)"] = round((tokens - 1) / seconds, 2)
        measured["plain: tokens per chunk"] = round(tokens / chunks, 2)
    finally:
        assert engine_cli.run("down", name).returncode == 0
    assert name not in sparklab_containers(docker_client)


def test_ngram_drafting_moves_the_acceptance_counters(engine_cli: Cli, docker_client, measured) -> None:
    port = free_port()
    out, name, key = _up(engine_cli, "ngram", port, "-k", "3")
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key=key)
        before = _metrics(port)
        text, chunks, tokens, seconds = _stream(client, COUNTING, 64)
        after = _metrics(port)
        drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0)
        accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                    - before.get("vllm:spec_decode_num_accepted_tokens_total", 0))
        assert drafts > 0 and accepted > 0
        assert chunks < tokens, "accepted drafts arrive as multi-token chunks"
        if "none" in GREEDY_TEXTS:  # the plain test ran first in this session
            assert text == GREEDY_TEXTS["none"], "greedy output changed under ngram drafting"
        measured["ngram K=3: ready (s)"] = float(out.split("ready in ", 1)[1].split(" s", 1)[0])
        measured["ngram K=3: acceptance length (1 + accepted/drafts, /metrics delta)"] = round(1 + accepted / drafts, 2)
        measured["ngram K=3: decode tok/s (streamed)"] = round((tokens - 1) / seconds, 2)
        measured["ngram K=3: tokens per chunk"] = round(tokens / chunks, 2)
    finally:
        assert engine_cli.run("down", name).returncode == 0
    assert name not in sparklab_containers(docker_client)
