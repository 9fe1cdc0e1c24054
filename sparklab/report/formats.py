"""How the report writes a figure (pure): an estimate as its mean and the half-width of its 95% interval, a dash
for what is missing. One formatter for every table of the report."""

from __future__ import annotations

from sparklab.bench.metrics import Estimate

DASH = "-"


def fmt(e: Estimate | None, digits: int = 2, scale: float = 1.0) -> str:
    """mean, and ± the half-width of its 95% interval when there are repeats; both times `scale` (e.g. 100 for %)."""
    if e is None:
        return DASH
    text = f"{e.mean * scale:,.{digits}f}"
    if e.low is not None and e.high is not None:
        text += f" ± {(e.high - e.mean) * scale:,.{digits}f}"
    return text
