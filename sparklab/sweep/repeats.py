"""`repeats: auto` (pure): whether a load has been measured often enough to stop repeating it.

A load (one server config at one workload and concurrency) runs at least `min` times; after that it stops as
soon as the 95% Student-t interval of its headline figure (per-request tok/s at C=1, aggregate tok/s above, as
in the report) has a half-width under `target` times its mean, and at `max` runs in any case.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparklab.bench.metrics import estimate


def headline(concurrency: int, summary: dict[str, Any] | None, lead: str = "seed000") -> float | None:
    """The report's headline figure of one run (sparklab.report.model.headline_key, read from a summary)."""
    summary = summary or {}
    if lead == "decode":
        value = (summary.get("decode_tps") or {}).get("mean")
    elif concurrency == 1:
        value = (summary.get("per_request_tps") or {}).get("mean")
    else:
        value = summary.get("aggregate_tps")
    return None if value is None else float(value)


def half_width_share(values: Iterable[float]) -> float | None:
    e = estimate(values)
    if e is None or e.low is None or e.high is None or not e.mean:
        return None
    return (e.high - e.mean) / abs(e.mean)


def enough(values: list[float], minimum: int, target: float) -> bool:
    if len(values) < minimum:
        return False
    share = half_width_share(values)
    return share is not None and share < target


def identical(values: list[float]) -> bool:
    """Every run gave the same value: the interval is zero wide because nothing varied, not because it is known."""
    e = estimate(values)
    return e is not None and e.identical
