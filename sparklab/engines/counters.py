"""Speculative-decoding counters as an engine exports them on /metrics, turned into acceptance over a window (pure).

Engines that count drafts, draft tokens, accepted tokens and accepted tokens by position give cumulative totals
(each adapter reads its own counters into that shape); the delta between a snapshot after warmup and one after the
window is the window's acceptance. The adapter names the counters it read (`source`), and knows its results by it.
"""

from __future__ import annotations

from typing import Any


def spec_delta(before: dict[str, Any] | None, after: dict[str, Any] | None, source: str) -> dict[str, Any] | None:
    """Acceptance from the server's own counters over the window; `source` says which counters they were."""
    if not before or not after or "drafts" not in after:
        return None
    drafts = after["drafts"] - before.get("drafts", 0.0)
    draft_tokens = after["draft_tokens"] - before.get("draft_tokens", 0.0)
    accepted = after["accepted"] - before.get("accepted", 0.0)
    positions = sorted(after.get("per_position", {}), key=int)
    per_position = [
        (after["per_position"][p] - before.get("per_position", {}).get(p, 0.0)) / drafts if drafts else None
        for p in positions
    ]
    return {
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "acceptance_length": 1 + accepted / drafts if drafts else None,
        "acceptance_rate": accepted / draft_tokens if draft_tokens else None,
        "per_position_acceptance": per_position,
        "source": source,
    }
