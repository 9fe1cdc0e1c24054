"""How the report writes a figure (pure): an estimate as its mean and the half-width of its 95% interval, a dash
for what is missing. One formatter for every table of the report."""

from __future__ import annotations

from sparklab.bench.metrics import IDENTICAL_SHORT, Estimate

DASH = "-"


def fmt(e: Estimate | None, digits: int = 2, scale: float = 1.0) -> str:
    """mean, and ± the half-width of its 95% interval when there are repeats, both times `scale` (e.g. 100 for %);
    identical repeats measured no interval and say so (a zero-width one would read as certainty); a real
    half-width under the printed digits is `± <0.01`, not `± 0.00`."""
    if e is None:
        return DASH
    text = f"{e.mean * scale:,.{digits}f}"
    if e.identical:
        return f"{text} ({IDENTICAL_SHORT})"
    if e.low is not None and e.high is not None:
        half = (e.high - e.mean) * scale
        smallest = 10.0**-digits
        text += f" ± <{smallest:.{digits}f}" if half < smallest / 2 else f" ± {half:,.{digits}f}"
    return text
