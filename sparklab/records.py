"""What a benchmark sends and what it records, with no I/O: sampling settings and one request's timings.

The chat client fills these in; metrics, the store and the offline report read them, so none of those
needs the network client (or the openai package) to import.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypedDict, cast

from sparklab.outputs import KEEP_GRADED_CHARS, kept, tool_call_summary

# Is the server still alive? Sync (run in a thread) or async; an exception or a hang counts as "no".
Alive = Callable[[], "bool | Awaitable[bool]"]

TOKEN_IDS = "server token_ids per chunk"
USAGE_ONLY = "usage.completion_tokens (tokens per chunk unknown: spread evenly over chunks)"
CHUNK_COUNT = "chunk count (usage missing; one token per chunk assumed)"
# usage.completion_tokens that contradicts the stream is ignored, and the token source says so
TOKEN_IDS_OVER_USAGE = "server token_ids per chunk (usage.completion_tokens contradicted them: ignored)"
CHUNK_COUNT_OVER_USAGE = ("chunk count (usage.completion_tokens contradicted the stream: ignored; one token per chunk "
                          "assumed)")
# Usage is believed up to this many tokens per counted token id (they should agree exactly) …
USAGE_PER_TOKEN_ID = 4
# … or per token-carrying chunk without token ids: speculative decoding puts up to K+1 tokens in a chunk, and a
# good speculator averages 4-5, so the bound must sit above any K a recipe uses.
USAGE_PER_CHUNK = 16


@dataclass(frozen=True)
class Sampling:
    """Request parameters shared by every request of a run."""

    max_tokens: int = 2048
    temperature: float | None = 1.0
    top_p: float | None = 0.95
    ignore_eos: bool = False
    min_tokens: int | None = None
    enable_thinking: bool | None = False
    seed: int | None = None
    # ask vLLM for the token ids (return_token_ids): per chunk when streamed (exact tokens per chunk), the answer's
    # in the choice when not (vLLM 0.27.1 chat_completion/serving.py:1027-1031): the lossless check scores them
    token_ids: bool = True

    # Any: the OpenAI request body, JSON
    def body(self, model: str, messages: list[dict[str, str]], stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": messages, "max_tokens": self.max_tokens}
        if self.temperature is not None:
            body["temperature"] = self.temperature
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.seed is not None:
            body["seed"] = self.seed
        extra: dict[str, Any] = {}
        if self.enable_thinking is not None:
            extra["chat_template_kwargs"] = {"enable_thinking": self.enable_thinking}
        if self.ignore_eos:
            extra["ignore_eos"] = True
        if self.min_tokens is not None:
            extra["min_tokens"] = self.min_tokens
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        if self.token_ids:
            extra["return_token_ids"] = True
        return {**body, **extra}


@dataclass
class RequestRecord:
    """One request, timed on the client's monotonic clock (seconds, time.perf_counter)."""

    index: int
    prompt_id: str
    warmup: bool
    start: float
    end: float = 0.0
    first_chunk: float | None = None  # first event with choices, even the empty role chunk
    first_token: float | None = None  # first chunk carrying tokens, reasoning or answer
    first_content: float | None = None  # first chunk carrying answer (non-reasoning) text
    chunk_times: list[float] = field(default_factory=list)  # chunks that carried tokens
    chunk_tokens: list[int | None] = field(default_factory=list)  # their token counts, None if unknown
    chunk_reasoning: list[bool] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    token_source: str = USAGE_ONLY
    finish_reason: str | None = None
    error: str | None = None
    output_chars: int = 0
    streamed: bool = True
    # the answer, for the equality check (sparklab.outputs): its text in pieces, reasoning and answer in stream
    # order, and its token ids (None once a token-carrying chunk came without ids)
    output_parts: list[str] = field(default_factory=list)
    reasoning_parts: list[str] = field(default_factory=list)  # the reasoning alone (thinking budgets)
    content_parts: list[str] = field(default_factory=list)  # the visible answer alone (grading)
    output_ids: list[int] | None = field(default_factory=list)
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # {index, name, arguments}, streamed deltas joined
    tool_calls_dropped: int = 0  # calls past client.MAX_TOOL_CALLS, counted only

    @property
    def ok(self) -> bool:
        return self.error is None

    # Any: the JSON a result stores
    def as_dict(self) -> dict[str, Any]:
        """Shallow copy (dataclasses.asdict deep-copies every chunk list, which is slow for long runs)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for key in ("chunk_times", "chunk_tokens", "chunk_reasoning"):
            out[key] = list(out[key])
        del out["output_parts"], out["output_ids"], out["tool_calls"]  # results keep answers apart: see answer()
        del out["reasoning_parts"], out["content_parts"]
        return out

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens of the chunks that carried only reasoning, when the server said how many each carried."""
        counts = [n for n, reasoning in zip(self.chunk_tokens, self.chunk_reasoning, strict=False) if reasoning]
        return None if None in counts else sum(n for n in counts if n is not None)

    # Any: the JSON a result stores
    def answer(self, whole: bool = False) -> dict[str, Any]:
        """The answer as results keep it (sparklab.outputs.kept: digests, bounded heads). whole: an answer to a graded
        task, kept whole (up to outputs.KEEP_GRADED_CHARS), its visible text apart and every tool call."""
        ids = self.output_ids or None
        text = "".join(self.output_parts)
        out = kept(self.index, self.prompt_id, self.warmup, self.ok, self.finish_reason, text, ids, whole=whole)
        reasoning = "".join(self.reasoning_parts)
        if reasoning:  # thinking budgets: how much went to reasoning, and whether any answer showed
            out["reasoning_chars"] = len(reasoning)
            out["reasoning_tokens"] = self.reasoning_tokens
            out["content_chars"] = sum(map(len, self.content_parts))
        if whole:
            out["content"] = "".join(self.content_parts)[:KEEP_GRADED_CHARS]
        if self.tool_calls or self.tool_calls_dropped:
            out["tool_calls"] = tool_call_summary(self.tool_calls, self.tool_calls_dropped, whole=whole)
        return out


def settle_tokens(record: RequestRecord, max_tokens: int | None = None) -> None:
    """Decide the token count and say where it came from.

    The server's usage.completion_tokens is believed only when the stream makes it plausible: not fewer than the
    token ids counted, not more than USAGE_PER_TOKEN_ID times them (USAGE_PER_CHUNK times the token-carrying
    chunks without token ids), and not more than the request's max_tokens. Otherwise the stream is counted and
    the token source says usage was ignored: no number a server merely claims sizes anything downstream.
    """
    if not record.streamed:
        record.token_source = "usage.completion_tokens (non-streaming)"
        return
    ids = record.chunk_tokens
    ids_known = bool(ids) and None not in ids
    counted = sum(cast("list[int]", ids)) if ids_known else len(record.chunk_times)
    claimed = record.completion_tokens
    if claimed is not None:
        ceiling = max(counted, 1) * (USAGE_PER_TOKEN_ID if ids_known else USAGE_PER_CHUNK)
        if max_tokens is not None:
            ceiling = min(ceiling, max(max_tokens, counted))
        if claimed > ceiling or (ids_known and claimed < counted):
            record.completion_tokens = counted
            record.token_source = TOKEN_IDS_OVER_USAGE if ids_known else CHUNK_COUNT_OVER_USAGE
            return
    if ids_known:
        record.token_source = TOKEN_IDS
        if claimed is None:
            record.completion_tokens = counted
    elif claimed is not None:
        record.token_source = USAGE_ONLY
    else:
        record.token_source = CHUNK_COUNT
        record.completion_tokens = counted


class RequestCounts(TypedDict):
    measured: int
    ok: int
    failed: int
    warmup: int
    first_errors: list[str]


class Summary(TypedDict, total=False):
    """metrics.summarize: one cell's figures over its measured requests (stats are {n, mean, p50, …})."""

    requests: RequestCounts
    wall_s: float
    output_tokens: int
    aggregate_tps: float
    per_request_tps: dict[str, float] | None
    tokens_per_request: float | None
    prompt_tokens: dict[str, float] | None
    e2e_ms: dict[str, float] | None
    ttft_ms: dict[str, float] | None
    ttfa_ms: dict[str, float] | None
    tpot_ms: dict[str, float] | None
    decode_tps: dict[str, float] | None
    itl_ms: dict[str, float] | None
    chunk_gap_ms: dict[str, float] | None
    tokens_per_chunk: float | None
    finish_reasons: dict[str, int]
    token_sources: dict[str, int]


class BenchResult(TypedDict, total=False):
    """One benchmark cell as `sparklab bench --json` writes it and the store keeps it (sparklab.bench/1)."""

    schema: str
    created: str
    endpoint: str
    model: str
    workload: dict[str, Any]
    sampling: dict[str, Any]
    load: dict[str, Any]
    measurement: dict[str, Any]
    summary: Summary
    speculative: dict[str, Any] | None  # server counters over the window (engine adapter)
    server_latency: dict[str, Any] | None
    prefix_cache: dict[str, Any] | None  # prompt tokens queried/hit in the prefix cache over the window (adapter)
    speculative_log: dict[str, Any] | None  # acceptance from the window's log lines (engines that print it)
    server: dict[str, Any]  # the raw snapshots before and after the window
    engine: dict[str, Any]  # a sweep's cell: the engine version its image states and its server answered, the digest
    requests: list[dict[str, Any]]
    memory: dict[str, Any]  # host memory over the window (host.watchdog.MemoryStats.as_dict)
    gpu_clocks: dict[str, Any]  # the GPU's clocks under load, where nvidia-smi answers (host.clocks)
    outputs: list[dict[str, Any]]  # each request's answer, bounded (sparklab.outputs.kept); a sweep stores them apart
    server_load: dict[str, Any]  # a sweep's: which start of its server the cell ran on ({"id": ...}, bench.noise)
    host_load: dict[str, Any]  # a sweep's: the bench machine's load average at the cell's start and end
