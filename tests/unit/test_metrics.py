"""Every metric computed exactly from records with known chunk times and token counts."""

from __future__ import annotations

import pytest

from sparklab.bench.metrics import chunk_gaps, decode_tps, itl_per_token, stats, summarize, tpot
from sparklab.engines.counters import spec_delta
from sparklab.records import CHUNK_COUNT, TOKEN_IDS, USAGE_ONLY, RequestRecord


def rec(index: int = 0, start: float = 10.0, chunks: list[tuple[float, int | None]] | None = None,
        end: float | None = None, tokens: int | None = None, reasoning: int = 0, **kw) -> RequestRecord:
    """A record whose chunks arrive at start + offset, the first `reasoning` of them reasoning-only."""
    chunks = chunks or []
    r = RequestRecord(index=index, prompt_id=f"p{index}", warmup=kw.pop("warmup", False), start=start)
    r.chunk_times = [start + t for t, _ in chunks]
    r.chunk_tokens = [k for _, k in chunks]
    r.chunk_reasoning = [i < reasoning for i in range(len(chunks))]
    r.first_token = r.chunk_times[0] if chunks else None
    r.first_content = r.chunk_times[reasoning] if len(chunks) > reasoning else None
    r.end = start + (end if end is not None else (chunks[-1][0] if chunks else 0.0))
    r.completion_tokens = tokens if tokens is not None else sum(k or 0 for _, k in chunks)
    r.token_source = TOKEN_IDS
    for key, value in kw.items():
        setattr(r, key, value)
    return r


# Chunks at 100 ms (1 token), 130 ms (3 tokens), 150 ms (2 tokens), 190 ms (4 tokens); stream ends at 200 ms.
SPEC_LIKE = [(0.100, 1), (0.130, 3), (0.150, 2), (0.190, 4)]


def test_multi_token_chunks_give_per_token_itl() -> None:
    r = rec(chunks=SPEC_LIKE, end=0.200)
    assert itl_per_token(r) == pytest.approx([0.010] * 3 + [0.010] * 2 + [0.010] * 4)
    assert chunk_gaps(r) == pytest.approx([0.030, 0.020, 0.040])
    assert decode_tps(r) == pytest.approx((10 - 1) / 0.090)  # tokens after the first chunk / time after it
    assert tpot(r) == pytest.approx((0.200 - 0.100) / 9)


def test_summary_of_one_request_is_exact() -> None:
    r = rec(chunks=SPEC_LIKE, end=0.200, reasoning=1, prompt_tokens=7)
    s = summarize([r], (10.0, 10.2))
    assert s["output_tokens"] == 10
    assert s["aggregate_tps"] == pytest.approx(10 / 0.2)
    assert s["per_request_tps"]["mean"] == pytest.approx(10 / 0.2)
    assert s["ttft_ms"]["mean"] == pytest.approx(100.0)
    assert s["ttfa_ms"]["mean"] == pytest.approx(130.0)  # first non-reasoning chunk
    assert s["itl_ms"]["n"] == 9 and s["itl_ms"]["mean"] == pytest.approx(10.0)
    assert s["chunk_gap_ms"]["n"] == 3 and s["chunk_gap_ms"]["mean"] == pytest.approx(30.0)
    assert s["tokens_per_chunk"] == pytest.approx(2.5)
    assert s["e2e_ms"]["p50"] == pytest.approx(200.0)
    assert s["prompt_tokens"]["mean"] == 7
    assert s["token_sources"] == {TOKEN_IDS: 1}


def test_seed_000_definitions_over_several_requests() -> None:
    # bench.py: aggregate = Σ tokens / wall; per-request = mean(tokens / elapsed); tokens/request.
    a = rec(0, start=0.0, chunks=[(0.5, 100)], end=2.0)  # 50 tok/s
    b = rec(1, start=0.5, chunks=[(0.5, 300)], end=3.0)  # 100 tok/s, ends at 3.5
    s = summarize([a, b], (0.0, 4.0))
    assert s["aggregate_tps"] == pytest.approx(400 / 4.0)
    assert s["per_request_tps"]["mean"] == pytest.approx(75.0)
    assert s["tokens_per_request"] == pytest.approx(200.0)


def test_warmup_and_failures_are_excluded_but_counted() -> None:
    ok = rec(1, chunks=[(0.1, 5)], end=0.2)
    warm = rec(0, chunks=[(0.1, 99)], end=0.2, warmup=True)
    bad = rec(2, chunks=[(0.1, 1)], end=0.3, error="stream error: boom")
    s = summarize([warm, ok, bad], (10.0, 10.3))
    assert s["requests"] == {"measured": 2, "ok": 1, "failed": 1, "warmup": 1,
                             "first_errors": ["1x stream error: boom"]}
    assert s["output_tokens"] == 5


def test_unknown_tokens_per_chunk_are_spread_evenly() -> None:
    r = rec(chunks=[(0.1, None), (0.2, None), (0.4, None)], tokens=9, end=0.4, token_source=USAGE_ONLY)
    assert itl_per_token(r) == pytest.approx([0.1 / 3] * 3 + [0.2 / 3] * 3)  # 3 tokens per chunk assumed
    assert decode_tps(r) == pytest.approx(6 / 0.3)
    s = summarize([r], (10.0, 10.4))
    assert s["token_sources"] == {USAGE_ONLY: 1} and s["tokens_per_chunk"] == pytest.approx(3.0)


def test_single_token_output_has_no_tpot_or_decode_rate() -> None:
    r = rec(chunks=[(0.1, 1)], end=0.1)
    assert tpot(r) is None and decode_tps(r) is None and itl_per_token(r) == []
    assert summarize([r], (10.0, 10.1))["tpot_ms"] is None


def test_stats_percentiles_are_linear_interpolation() -> None:
    s = stats([1, 2, 3, 4, 5, 6, 7, 8, 9, 10])
    assert s == {"n": 10, "mean": 5.5, "p50": 5.5, "p90": pytest.approx(9.1), "p99": pytest.approx(9.91),
                 "min": 1.0, "max": 10.0}
    assert stats([]) is None


def test_spec_delta_from_server_counters() -> None:
    before = {"drafts": 10.0, "draft_tokens": 30.0, "accepted": 12.0, "per_position": {"0": 8.0, "1": 3.0, "2": 1.0}}
    after = {"drafts": 30.0, "draft_tokens": 90.0, "accepted": 48.0, "per_position": {"0": 26.0, "1": 15.0, "2": 7.0}}
    d = spec_delta(before, after, "the engine's spec_decode counters")
    assert d is not None
    assert d["acceptance_length"] == pytest.approx(1 + 36 / 20)
    assert d["acceptance_rate"] == pytest.approx(36 / 60)
    assert d["per_position_acceptance"] == pytest.approx([18 / 20, 12 / 20, 6 / 20])
    assert d["source"] == "the engine's spec_decode counters"  # the adapter names its counters, not this module
    assert spec_delta({}, {}, "any") is None  # no speculative config on the server


def test_chunk_count_fallback_is_labelled() -> None:
    r = rec(chunks=[(0.1, None), (0.2, None)], tokens=2, end=0.2, token_source=CHUNK_COUNT)
    assert summarize([r], (10.0, 10.2))["token_sources"] == {CHUNK_COUNT: 1}


def test_server_latency_from_vllm_histograms() -> None:
    from sparklab.engines.vllm import server_latency

    def snap(n: float, ttft: float, tpot: float, e2e: float) -> dict:
        return {"latency": {"vllm:time_to_first_token_seconds_count": n, "vllm:time_to_first_token_seconds_sum": ttft,
                            "vllm:request_time_per_output_token_seconds_count": n,
                            "vllm:request_time_per_output_token_seconds_sum": tpot,
                            "vllm:e2e_request_latency_seconds_count": n, "vllm:e2e_request_latency_seconds_sum": e2e}}

    got = server_latency(snap(2, 0.3, 0.08, 5.0), snap(10, 1.5, 0.40, 25.0))
    assert got is not None
    assert got["ttft_ms"] == pytest.approx(150.0) and got["tpot_ms"] == pytest.approx(40.0)
    assert got["e2e_ms"] == pytest.approx(2500.0)
    assert server_latency({}, {}) is None


def test_a_claimed_token_count_never_sizes_an_allocation() -> None:
    """A record whose usage claims 10^7 tokens over four chunks (one stored before the client checked usage):
    the per-token ITL weighs each gap by its tokens instead of materialising one sample per claimed token."""
    import tracemalloc

    r = rec(chunks=[(0.1, None), (0.2, None), (0.3, None), (0.4, None)], tokens=10**7, end=0.4,
            token_source=USAGE_ONLY)
    tracemalloc.start()
    try:
        s = summarize([r], (10.0, 10.4))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, f"summarize allocated {peak / 2**20:.0f} MiB for four chunks"
    assert s["itl_ms"]["n"] == 3 * 10**7 // 4 and s["itl_ms"]["mean"] == pytest.approx(0.1 / (10**7 / 4) * 1000)


def test_weighted_itl_equals_the_expanded_samples() -> None:
    """The weighted form gives exactly what one sample per token gave (n, mean, linear-interpolated percentiles)."""
    r = rec(chunks=[(0.100, 1), (0.130, 3), (0.150, 2), (0.190, 4), (0.200, 1), (0.260, 5)], end=0.3)
    expanded = [g for g in itl_per_token(r)]
    s = summarize([r], (10.0, 10.3))["itl_ms"]
    assert s == pytest.approx(stats(expanded, 1000))
