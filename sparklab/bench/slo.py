"""Service-level objectives on latency (pure): `tpot_p90<=50ms,ttft_p90<=500ms`.

A term names a per-request latency, a statistic over one cell's measured requests and a bound. The statistic is
taken from the per-request records each cell stores (every measured, successful request of the window; warmup
excluded), so any percentile works on any stored run; per-token ITL, which is not a per-request figure, comes from
the cell's summary (its weighted per-token distribution, p50/p90/p99 and mean only).

A config meets an SLO at a concurrency when, for every term, the 95% interval of the statistic over its repeats
(Student t, one value per repeat) lies at or under the bound: the whole interval, so that a config that meets the
bound only on a lucky run does not count. A single run has no interval; its value must be under the bound, and
the verdict says it rests on one run.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparklab.bench.metrics import estimate
from sparklab.errors import RecipeError

METRICS = {
    "ttft": "time to first token (first token - start)",
    "tpot": "time per output token after the first ((end - first token) / (tokens - 1))",
    "e2e": "end-to-end latency (end - start)",
    "itl": "inter-token latency per token (from the cell's summary: p50, p90, p99, mean)",
}
_STATS = re.compile(r"^(mean|p(\d{1,2}(?:\.\d+)?))$")
_TERM = re.compile(r"^\s*([a-z][a-z0-9]*)_([a-z0-9.]+)\s*(<=|<)\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*$")
EXAMPLE = "tpot_p90<=50ms,ttft_p90<=500ms"


@dataclass(frozen=True)
class Term:
    metric: str  # ttft, tpot, e2e, itl
    stat: str  # mean, p50, p90, p99, ...
    limit_ms: float

    @property
    def key(self) -> str:
        return f"{self.metric}_{self.stat}"

    def __str__(self) -> str:
        return f"{self.key}<={bound_text(self.limit_ms)}"


def bound_text(ms: float) -> str:
    """A bound in plain digits and its unit: seconds from 10 s up, ms under it (`:g` wrote 100000 s as `1e+08ms`)."""
    value, unit = (ms / 1000, "s") if ms >= 10_000 else (ms, "ms")
    return f"{value:.6f}".rstrip("0").rstrip(".") + unit


class SloError(ValueError):
    """A bad SLO text; the message says which term and how to write it."""


def check_flag(text: str | None, where: str = "") -> None:
    """`--slo TEXT` as a command line gives it (tune, report): a bad text is a RecipeError (exit 2) naming the flag,
    `where` (e.g. the space file) before it, and an example."""
    try:
        parse(text)
    except SloError as exc:
        raise RecipeError(f"{where}--slo: {exc}", f"Example: --slo '{EXAMPLE}'") from None


def parse(text: str | None) -> tuple[Term, ...]:
    """`tpot_p90<=50ms,ttft_p90<=500ms` (units ms or s; no unit: ms) → terms; empty text → no terms."""
    if text is None or not text.strip():
        return ()
    terms = []
    for part in text.split(","):
        m = _TERM.match(part)
        if not m:
            raise SloError(f"SLO term {part.strip()!r}: expected METRIC_STAT<=NUMBER[ms|s], e.g. {EXAMPLE}")
        metric, stat, _, number, unit = m.groups()
        if metric not in METRICS:
            raise SloError(f"SLO term {part.strip()!r}: unknown metric {metric!r}; one of {', '.join(METRICS)}")
        sm = _STATS.match(stat)
        if not sm or (sm.group(2) is not None and not 0 < float(sm.group(2)) < 100):
            raise SloError(f"SLO term {part.strip()!r}: unknown statistic {stat!r}; mean or pNN (p50, p90, p99, ...)")
        if metric == "itl" and stat not in ("mean", "p50", "p90", "p99"):
            raise SloError(f"SLO term {part.strip()!r}: itl is per token, kept as mean, p50, p90 and p99 only")
        limit = float(number) * (1000.0 if unit == "s" else 1.0)
        if not limit > 0:
            raise SloError(f"SLO term {part.strip()!r}: the bound must be above 0")
        terms.append(Term(metric, stat, limit))
    keys = [t.key for t in terms]
    if len(set(keys)) != len(keys):
        raise SloError(f"SLO {text!r}: a statistic is bounded twice; give each once")
    return tuple(terms)


def describe(terms: Sequence[Term]) -> str:
    return ", ".join(str(t) for t in terms)


def _request_ms(request: Mapping[str, Any], metric: str) -> float | None:
    start, end, first = request.get("start"), request.get("end"), request.get("first_token")
    if metric == "ttft":
        return None if first is None or start is None else 1000 * (first - start)
    if metric == "e2e":
        return None if end is None or start is None else 1000 * (end - start)
    tokens = request.get("completion_tokens") or 0
    if first is None or end is None or tokens < 2:
        return None
    return 1000 * (end - first) / (tokens - 1)  # tpot, as bench.metrics.tpot


def _statistic(values: list[float], stat: str) -> float | None:
    if not values:
        return None
    if stat == "mean":
        return float(np.mean(values))
    return float(np.percentile(values, float(stat[1:])))


# Any: a cell's result JSON as stored
def cell_value(result: Mapping[str, Any], term: Term) -> float | None:
    """The term's statistic over one cell's measured, successful requests (ms), None when it has none."""
    if term.metric == "itl":
        itl = ((result.get("summary") or {}).get("itl_ms") or {})
        value = itl.get(term.stat)
        return None if value is None else float(value)
    requests = [r for r in result.get("requests") or [] if not r.get("warmup") and not r.get("error")]
    if requests:
        return _statistic([v for r in requests if (v := _request_ms(r, term.metric)) is not None], term.stat)
    summary = ((result.get("summary") or {}).get(f"{term.metric}_ms") or {})  # a result kept without its records
    value = summary.get(term.stat)
    return None if value is None else float(value)


@dataclass(frozen=True)
class TermVerdict:
    term: Term
    mean: float | None
    high: float | None  # the interval's upper end (None: one run)
    runs: int

    @property
    def meets(self) -> bool:
        bound = self.high if self.high is not None else self.mean
        return bound is not None and math.isfinite(bound) and bound <= self.term.limit_ms

    def describe(self) -> str:
        if self.mean is None:
            return f"{self.term.key}: not measured"
        upper = f" (95% upper {self.high:.1f})" if self.high is not None else " (1 run)"
        sign = "<=" if self.meets else ">"
        return f"{self.term.key} {self.mean:.1f} ms{upper} {sign} {bound_text(self.term.limit_ms)}"


def judge(values_by_term: Mapping[str, Sequence[float]], terms: Iterable[Term]) -> tuple[bool, list[TermVerdict]]:
    """Whether one config meets every term from its per-repeat values (values_by_term[term.key])."""
    verdicts = []
    for term in terms:
        e = estimate(values_by_term.get(term.key, ()))
        verdicts.append(TermVerdict(term, e.mean if e else None, e.high if e else None, e.n if e else 0))
    return all(v.meets for v in verdicts), verdicts
