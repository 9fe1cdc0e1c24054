"""SGLang's decode log lines, pooled over a window: the acceptance length and rate each line states for its own
stretch of decode iterations (the adapter, sparklab.engines.sglang, decides per version whether the rate holds)."""

from __future__ import annotations

import re
from typing import Any

# The decode log line, SGLang 0.5.23 managers/scheduler_components/metrics_reporter.py:963-1042:
#   f"Decode batch, #running-req: {n}, {token usage parts}, " + (speculative only)
#   f"accept len: {spec_accept_length:.2f}, accept rate: {spec_accept_rate:.2f}, " + optional
#   "cap len: …, " / "block accept len: …, " / DSpark estimate, then
#   f"{'cuda graph'|'cpu graph'}: {bool}, gen throughput (token/s): {x:.2f}, #queue-req: {n}"
# One line every --decode-log-interval decode iterations (default 40). Its counters cover only the iterations
# since the previous line and are reset after it (:1000-1004), so the lines of a window are that window's own.
#   accept len  = accepted tokens incl. the bonus token / verify steps, a verify step being one request in one
#                 decode iteration (update_spec_metrics adds the batch size, :543-555)
#   accept rate = correct drafts / (verify steps x drafts per step), drafts per step being
#                 --speculative-num-draft-tokens - 1 (:975-982): the share of proposed draft tokens accepted
# `block accept len` (printed with SGLANG_RAGGED_VERIFY_MODE=cap_accept) must not be read as `accept len`.
_DECODE_LINE = re.compile(r"Decode batch\b.*?#running-req: (\d+),.*?(?<!block )accept len: ([\d.]+), "
                          r"accept rate: ([\d.]+)")
_ACCEPT_LEN_ONLY = re.compile(r"Decode batch\b.*?#running-req: (\d+),.*?(?<!block )accept len: ([\d.]+)")


def _weighted(pairs: list[tuple[float, float]]) -> float:
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else sum(v for v, _ in pairs) / len(pairs)


def pooled(text: str) -> dict[str, Any] | None:
    """The window's decode lines pooled, weighted by #running-req (their verify-step counts are not printed)."""
    lengths: list[tuple[float, float]] = []
    rates: list[tuple[float, float]] = []
    for line in text.splitlines():
        if m := _DECODE_LINE.search(line):
            lengths.append((float(m.group(2)), float(m.group(1))))
            rates.append((float(m.group(3)), float(m.group(1))))
        elif m := _ACCEPT_LEN_ONLY.search(line):  # releases before `accept rate` was printed
            lengths.append((float(m.group(2)), float(m.group(1))))
    if not lengths:
        return None
    ordered = sorted(v for v, _ in lengths)
    mid = len(ordered) // 2
    median = ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
    return {"samples": len(lengths), "median": median, "mean": _weighted(lengths), "max": ordered[-1],
            "rate": _weighted(rates) if rates else None,
            "source": "SGLang decode log lines in the window ('accept len' / 'accept rate', weighted by #running-req)"}
