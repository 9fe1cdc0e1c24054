"""Pure: request records → a run summary, with every definition written next to its number.

Definitions (per request; `N` = completion tokens, chunk `i` arrives at `t_i` carrying `k_i` tokens). A
streamed request starts when its bytes are handed to an already open connection (the connections a window
needs are opened before it), so TCP set-up is not counted as TTFT; arrival times are taken once per socket
read, when the bytes reach the client.
- TTFT: first chunk carrying a token (reasoning or answer) - request start.
- TTFA: first chunk carrying answer (non-reasoning) text - request start (reasoning-aware TTFT).
- E2E latency: end of stream - request start.
- TPOT: (end - first token) / (N - 1), as vLLM's bench serve defines it.
- Decode tok/s: (N - k_0) / (t_last - t_0): tokens after the first chunk over the time after it (seed 004's
  "generation speed excluding TTFT").
- ITL (per token): each gap t_i - t_{i-1} (i ≥ 1) split over the k_i tokens of chunk i: k_i samples of gap/k_i
  (weighted, never written out: a claimed token count sizes no allocation).
  Several tokens per chunk (speculative decoding) therefore do not inflate it.
- Chunk gap: the raw t_i - t_{i-1}, one sample per chunk (what most tools call ITL).
- Per-request tok/s: N / E2E latency, averaged over requests (seed 000's "per-request TPS").
- Aggregate tok/s: Σ N / wall, the wall being the measured window (seed 000's "aggregate TPS").
When the server does not say how many tokens each chunk carries, the N tokens are spread evenly over the
chunks and the summary says so.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sparklab.bench.stats import t_quantile
from sparklab.records import RequestRecord, Summary

PERCENTILES = (50, 90, 99)


def stats(values: Iterable[float], scale: float = 1.0) -> dict[str, float] | None:
    """n, mean, p50, p90, p99, min, max (linear interpolation, numpy's default), or None if empty."""
    data = np.asarray(list(values), dtype=float) * scale
    if data.size == 0:
        return None
    out = {"n": int(data.size), "mean": float(data.mean())}
    for p, v in zip(PERCENTILES, np.percentile(data, PERCENTILES), strict=True):
        out[f"p{p}"] = float(v)
    out["min"] = float(data.min())
    out["max"] = float(data.max())
    return out


def chunk_token_counts(record: RequestRecord) -> list[float]:
    """Tokens per token-carrying chunk; spread evenly when the server did not say."""
    counts = record.chunk_tokens
    if counts and all(c is not None for c in counts):
        return [float(c) for c in counts if c is not None]
    n = len(record.chunk_times)
    return [(record.completion_tokens or n) / n] * n if n else []


def itl_weighted(record: RequestRecord) -> tuple[list[float], list[int]]:
    """Per-token ITL as (value, number of samples): chunk i gives k_i samples of gap/k_i (one sample when k_i is
    not whole, i.e. spread from a total). Weights, not copies: a token count never sizes an allocation."""
    counts = chunk_token_counts(record)
    times = record.chunk_times
    values: list[float] = []
    weights: list[int] = []
    for i in range(1, len(times)):
        k = counts[i]
        if k > 0:
            whole = round(k)
            values.append((times[i] - times[i - 1]) / k)
            weights.append(whole if abs(whole - k) < 1e-9 else 1)
    return values, weights


def itl_per_token(record: RequestRecord) -> list[float]:
    """The per-token ITL samples written out (for reading and tests; summaries use itl_weighted)."""
    values, weights = itl_weighted(record)
    return [v for v, w in zip(values, weights, strict=True) for _ in range(w)]


def weighted_stats(values: Sequence[float], weights: Sequence[int], scale: float = 1.0) -> dict[str, float] | None:
    """stats() of the samples with each value repeated weight times, without repeating them."""
    data = np.asarray(values, dtype=float) * scale
    counts = np.asarray(weights, dtype=np.int64)
    keep = counts > 0
    data, counts = data[keep], counts[keep]
    if data.size == 0:
        return None
    order = np.argsort(data, kind="stable")
    data, counts = data[order], counts[order]
    ends = np.cumsum(counts)  # sample j (0-based, sorted) is data[first i with ends[i] > j]
    n = int(ends[-1])
    out = {"n": n, "mean": float(np.dot(data, counts) / n)}
    for p in PERCENTILES:
        h = (n - 1) * p / 100  # numpy's default "linear" method over the written-out samples
        lo = int(np.floor(h))
        below, above = np.searchsorted(ends, [lo, min(lo + 1, n - 1)], side="right")
        out[f"p{p}"] = float(data[below] + (h - lo) * (data[above] - data[below]))
    out["min"] = float(data[0])
    out["max"] = float(data[-1])
    return out


def chunk_gaps(record: RequestRecord) -> list[float]:
    times = record.chunk_times
    return [times[i] - times[i - 1] for i in range(1, len(times))]


def decode_tps(record: RequestRecord) -> float | None:
    counts = chunk_token_counts(record)
    times = record.chunk_times
    if len(times) < 2 or times[-1] <= times[0]:
        return None
    return (sum(counts) - counts[0]) / (times[-1] - times[0])


def tpot(record: RequestRecord) -> float | None:
    n = record.completion_tokens or 0
    if n < 2 or record.first_token is None:
        return None
    return (record.end - record.first_token) / (n - 1)


def summarize(records: Sequence[RequestRecord], window: tuple[float, float]) -> Summary:
    """The summary of the measured (non-warmup) requests within `window` (start, end)."""
    measured = [r for r in records if not r.warmup]
    ok = [r for r in measured if r.ok]
    failed = [r for r in measured if not r.ok]
    wall = max(window[1] - window[0], 1e-9)
    tokens = [r.completion_tokens or 0 for r in ok]
    total = sum(tokens)
    streamed = [r for r in ok if r.streamed]
    all_chunks = sum(len(r.chunk_times) for r in streamed)
    errors = Counter(r.error for r in failed)
    summary: Summary = {
        "requests": {"measured": len(measured), "ok": len(ok), "failed": len(failed),
                     "warmup": sum(1 for r in records if r.warmup),
                     "first_errors": [f"{count}x {message}" for message, count in errors.most_common(5)]},
        "wall_s": wall,
        "output_tokens": total,
        "aggregate_tps": total / wall,
        "per_request_tps": stats(n / (r.end - r.start) for r, n in zip(ok, tokens, strict=True)
                                 if r.end > r.start),
        "tokens_per_request": total / len(ok) if ok else None,
        "prompt_tokens": stats(r.prompt_tokens for r in ok if r.prompt_tokens is not None),
        "e2e_ms": stats((r.end - r.start for r in ok), 1000),
        "ttft_ms": stats((r.first_token - r.start for r in streamed if r.first_token is not None), 1000),
        "ttfa_ms": stats((r.first_content - r.start for r in streamed if r.first_content is not None), 1000),
        "tpot_ms": stats((v for r in streamed if (v := tpot(r)) is not None), 1000),
        "decode_tps": stats(v for r in streamed if (v := decode_tps(r)) is not None),
        "itl_ms": _itl_stats(streamed),
        "chunk_gap_ms": stats((g for r in streamed for g in chunk_gaps(r)), 1000),
        "tokens_per_chunk": (sum(sum(chunk_token_counts(r)) for r in streamed) / all_chunks) if all_chunks else None,
        "finish_reasons": dict(Counter(r.finish_reason or "none" for r in ok)),
        "token_sources": dict(Counter(r.token_source for r in ok)),
    }
    return summary


def _itl_stats(records: Sequence[RequestRecord]) -> dict[str, float] | None:
    values: list[float] = []
    weights: list[int] = []
    for record in records:
        v, w = itl_weighted(record)
        values += v
        weights += w
    return weighted_stats(values, weights, 1000)


# -- repeats: confidence intervals and speedups ---------------------------------------------------------------

CONFIDENCE = 0.95
SPREAD_WARN = 0.10  # coefficient of variation across repeats above which a report says the spread is large
IDENTICAL = "identical repeats: the interval is not measured"
IDENTICAL_SHORT = "identical repeats"  # a table cell's mark; the legend gives IDENTICAL in full


@dataclass(frozen=True)
class Estimate:
    """One metric over repeated runs: mean with a Student-t 95% interval (none from a single run).

    median and sd (sample standard deviation, 0 for a single run) feed a report's conservative score.
    """

    values: tuple[float, ...]
    mean: float
    low: float | None
    high: float | None
    median: float
    mad: float  # median absolute deviation, unscaled
    sd: float
    cv: float | None  # sd / mean; None for a single run

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def spread_is_large(self) -> bool:
        return self.cv is not None and self.cv > SPREAD_WARN

    @property
    def identical(self) -> bool:
        """Repeats that all gave one value (up to float rounding): a spread of zero measures nothing, so the
        interval it gives (mean to mean) is not one; say IDENTICAL instead of printing it."""
        return self.n >= 2 and max(self.values) - min(self.values) <= 1e-9 * max(abs(self.mean), 1e-12)


def estimate(values: Iterable[float], confidence: float = CONFIDENCE) -> Estimate | None:
    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        return None
    mean, median = float(data.mean()), float(np.median(data))
    mad = float(np.median(np.abs(data - median)))
    if data.size < 2:
        return Estimate(tuple(data.tolist()), mean, None, None, median, mad, 0.0, None)
    sd = float(data.std(ddof=1))
    half = t_quantile((1 + confidence) / 2, data.size - 1) * sd / float(np.sqrt(data.size))
    return Estimate(tuple(data.tolist()), mean, mean - half, mean + half, median, mad, sd, sd / mean if mean else None)


@dataclass(frozen=True)
class Ratio:
    """treatment mean / baseline mean with a 95% interval (None when either side has a single run).

    The interval is the delta method on the log of the ratio of means, with Welch-Satterthwaite degrees of
    freedom: it holds for unequal repeat counts and variances and stays positive.
    """

    value: float
    low: float | None
    high: float | None
    identical: bool = False  # both sides' repeats were identical: low = high = value, not a measured interval

    @property
    def significant(self) -> bool | None:
        """Whether the interval excludes 1.0 (None: no interval, or an unmeasured one; nothing can be said)."""
        if self.low is None or self.high is None or self.identical:
            return None
        return not (self.low <= 1.0 <= self.high)


def ratio(treatment: Estimate, baseline: Estimate, confidence: float = CONFIDENCE) -> Ratio | None:
    if baseline.mean <= 0 or treatment.mean <= 0:
        return None
    value = treatment.mean / baseline.mean
    if treatment.n < 2 or baseline.n < 2:
        return Ratio(value, None, None)
    if treatment.identical and baseline.identical:
        return Ratio(value, value, value, identical=True)
    # relative variance of each mean: s^2 / (n m^2)
    parts = [e.sd**2 / (e.n * e.mean**2) for e in (treatment, baseline)]
    se = float(np.sqrt(sum(parts)))
    if se == 0.0:  # both spreads zero (caught above up to rounding): no interval was measured
        return Ratio(value, value, value, identical=True)
    df = se**4 / sum(p**2 / (e.n - 1) for p, e in zip(parts, (treatment, baseline), strict=True) if p > 0)
    half = t_quantile((1 + confidence) / 2, df) * se
    return Ratio(value, value * float(np.exp(-half)), value * float(np.exp(half)))
